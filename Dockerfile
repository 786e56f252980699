# forksight: collector + dashboard + trainer in one image.
# torch goes in first so the project's `torch>=` requirement is already met; pass
# --build-arg TORCH_PIP_ARGS="--index-url <your CPU wheel index>" for a small CPU-only image.
FROM python:3.11-slim

ARG TORCH_SPEC="torch==2.13.0"
ARG TORCH_PIP_ARGS=""
ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    FORKSIGHT_HOME=/data/cache

WORKDIR /app
# a C++ compiler: token_stats builds its per-token kernels on first use (the C++ one, and
# torch.compile's); without one it still runs, on the slower eager path, with a warning
RUN apt-get update && apt-get install -y --no-install-recommends g++ && rm -rf /var/lib/apt/lists/*
RUN pip install ${TORCH_PIP_ARGS} "${TORCH_SPEC}"
COPY pyproject.toml README.md ./
COPY core ./core
COPY monitor ./monitor
COPY hooks ./hooks
COPY trainer ./trainer
COPY dashboard ./dashboard
RUN pip install ".[trl,lake]"

VOLUME ["/data"]
EXPOSE 8050
CMD ["forksight", "serve", "--db", "/data/forksight.duckdb", "--host", "0.0.0.0", "--port", "8050"]
