# One-word entry points. Each target sets itself up: a .venv with the CPU build of
# torch (installed first, so nothing pulls a CUDA build), then the project with its extras.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.forksight-installed
TORCH   ?= torch==2.13.0
PYTEST_ARGS ?=

# verl pins its own transformers: it gets a venv of its own, for tests/test_verl.py
VERL_ENV   ?= $(VENV)/verl
VERL_STAMP := $(VERL_ENV)/.forksight-installed

# PySpark (~500 MB) reads the lake in tests/test_lake_engines.py: a venv of its own, not part of `make test`
SPARK_ENV   ?= $(VENV)/spark
SPARK_STAMP := $(SPARK_ENV)/.forksight-installed

.PHONY: setup verl-env demo test test-kernels bench clean lint lake-spark docs docs-ref

setup: $(STAMP)

verl-env: $(VERL_STAMP)

$(VERL_STAMP): pyproject.toml | $(STAMP)
	test -x $(VERL_ENV)/bin/python || $(PY) -m venv $(VERL_ENV)
	$(VERL_ENV)/bin/python -m pip install -q --upgrade pip
	echo '$(TORCH)' > $(VERL_ENV)/torch-constraint.txt
	$(VERL_ENV)/bin/python -m pip show torch >/dev/null 2>&1 || $(VERL_ENV)/bin/python -m pip install -q $(TORCH)
	$(VERL_ENV)/bin/python -m pip install -q -c $(VERL_ENV)/torch-constraint.txt -e '.[verl]'
	touch $@

$(SPARK_STAMP): | $(STAMP)
	test -x $(SPARK_ENV)/bin/python || $(PY) -m venv $(SPARK_ENV)
	$(SPARK_ENV)/bin/python -m pip install -q --upgrade pip
	$(SPARK_ENV)/bin/python -m pip install -q 'pyspark==4.3.*'
	touch $@

# Spark (local mode, Java 17) over the lake's Parquet files: built on demand, then the engine tests
lake-spark: $(SPARK_STAMP)
	$(BIN)/python -m pytest -q tests/test_lake_engines.py $(PYTEST_ARGS)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip show torch >/dev/null 2>&1 || $(BIN)/python -m pip install -q $(TORCH)
	$(BIN)/python -m pip install -q -e '.[trl,dev,lake]'
	# TRL 1.14 (logits path) side by side, for tests/test_trl.py: PYTHONPATH=$(VENV)/trl114
	$(BIN)/python -m pip install -q --no-deps --target $(VENV)/trl114 'trl==1.14.*'
	touch $(STAMP)

demo: setup
	$(BIN)/forksight demo

test: setup verl-env
	$(BIN)/python -m pytest $(PYTEST_ARGS)

# the tests of trained trajectories under each PyTorch CPU kernel level (each rounds like another CPU),
# each level with an empty FORKSIGHT_HOME: what a new machine sees (docs/explanation/reproducibility.md)
KERNEL_LEVELS ?= default avx2 avx512
test-kernels: setup
	@for level in $(KERNEL_LEVELS); do \
	  home=$$(mktemp -d); echo "== ATEN_CPU_CAPABILITY=$$level FORKSIGHT_HOME=$$home"; \
	  ATEN_CPU_CAPABILITY=$$level FORKSIGHT_HOME=$$home $(BIN)/python -m pytest -m trajectory $(PYTEST_ARGS) || exit 1; \
	  rm -rf $$home; done

bench: setup
	@for b in bench/*.py; do echo "== $$b"; $(BIN)/python $$b || exit 1; done

# the documentation site (mkdocs.yml) into site/, strict: a broken link or anchor fails
docs: setup
	$(BIN)/python -m mkdocs build --strict --site-dir site

# regenerate the reference pages (CLI, alert configuration, HTTP API, tables, performance) from the code
docs-ref: setup
	$(BIN)/python docs/gen_reference.py

clean:
	rm -rf $(VENV) .forksight build *.egg-info site
