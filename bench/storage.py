"""Bytes on disk per token row, per sample and per step (scalars + histograms), and what
`forksight compact` gives back on a long run, measured on real DuckDB files written through the
store's write API. Prints one JSON object.

Each figure is the growth of a file between two sizes of one kind of record (the difference
cancels the fixed cost of an empty file: its schema and DuckDB's first blocks), divided by the
records added. Token rows are the synthetic run's (tests/synthetic.py: float32 statistics, a
short token text); samples hold a prompt of a quarter and a completion of --completion-chars
characters of made-up text.

    .venv/bin/python bench/storage.py [--token-rows 2000000] [--samples 50000] [--steps 20000]
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
from pathlib import Path

import numpy as np
import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))   # the synthetic run

from forksight.base.constants import ENTROPY_EDGES  # noqa: E402
from forksight.base.records import Records, histograms_table, samples_table, scalars_table, tokens_table  # noqa: E402
from forksight.monitor.collector.compact import compact_file  # noqa: E402
from forksight.monitor.collector.store import Store  # noqa: E402
from synthetic import bulk_tokens  # noqa: E402

SCALAR_KEYS = 25   # what the TRL/verl hooks log per step (entropy/mean, p20..p95, js, pass@k, loss, ...)


_FILES = iter(range(1_000_000))


def file_bytes(folder: str, write) -> int:
    """Size of a fresh store file after write(store, run_id) and a clean close (checkpointed)."""
    path = os.path.join(folder, f"bench-{next(_FILES)}.duckdb")
    with Store(path, verify=False) as store:
        run_id = store.create_run("bench", model="synthetic")
        write(store, run_id)
    return os.path.getsize(path)


def write_tokens(rows: int, rows_per_step: int = 4096):
    def write(store, run_id):
        steps = math.ceil(rows / rows_per_step)
        for first in range(0, steps, 100):
            n = min(100, steps - first)
            table = bulk_tokens(n, rows_per_step, seed=first, first_step=first)
            store.write(run_id, Records(tokens=tokens_table(table))).result()
    return write


def write_samples(count: int, chars: int):
    rng = np.random.default_rng(0)
    # a Zipf-distributed vocabulary of 5,000 made-up words of 2-9 letters, digits and signs mixed in:
    # compresses about like chain-of-thought text (DuckDB's FSST and dictionaries find its repeats)
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz0123456789+-=()"))
    words = np.array(["".join(rng.choice(letters, int(k))) for k in rng.integers(2, 10, 5000)])
    weights = 1.0 / np.arange(1, 5001)
    weights /= weights.sum()

    def text(n: int) -> str:
        return " ".join(rng.choice(words, n // 4 + 1, p=weights))[:n]

    def write(store, run_id):
        for first in range(0, count, 5000):
            rows = [{"step": (first + i) // 64, "sample_id": first + i, "group_id": (first + i) // 8,
                     "prompt": text(chars // 4), "completion": text(chars), "reward": float(i % 2),
                     "correct": bool(i % 2), "length": chars // 4, "source": "sampled"}
                    for i in range(min(5000, count - first))]
            store.write(run_id, Records(samples=samples_table(rows))).result()
    return write


def write_steps(steps: int):
    rng = np.random.default_rng(0)

    def write(store, run_id):
        for first in range(0, steps, 2000):
            span = range(first, min(steps, first + 2000))
            rows = [{"step": s, "key": f"key/{k}", "value": float(rng.normal()), "wall_time": 1.7e9 + s}
                    for s in span for k in range(SCALAR_KEYS)]
            hist = [{"step": s, "key": "entropy", "counts": rng.integers(0, 500, len(ENTROPY_EDGES) - 1).tolist(),
                     "edges": ENTROPY_EDGES.tolist()} for s in span]
            store.write(run_id, Records(scalars=scalars_table(rows), histograms=histograms_table(hist))).result()
    return write


def per_record(path: str, make, small: int, big: int) -> dict:
    a, b = file_bytes(path, make(small)), file_bytes(path, make(big))
    return {"records": [small, big], "file_bytes": [a, b], "bytes_per_record": round((b - a) / (big - small), 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--token-rows", type=int, default=2_000_000)
    parser.add_argument("--samples", type=int, default=50_000)
    parser.add_argument("--completion-chars", type=int, default=1000)
    parser.add_argument("--steps", type=int, default=20_000)
    parser.add_argument("--long-steps", type=int, default=1000, help="steps of the run compacted")
    parser.add_argument("--long-rows-per-step", type=int, default=2048)
    parser.add_argument("--keep-token-steps", type=int, default=100)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="forksight-storage-") as tmp:
        empty = file_bytes(tmp, lambda store, run_id: None)
        token = per_record(tmp, lambda n: write_tokens(n), args.token_rows // 4, args.token_rows)
        sample = per_record(tmp, lambda n: write_samples(n, args.completion_chars), args.samples // 5, args.samples)
        step = per_record(tmp, write_steps, args.steps // 5, args.steps)
        long_bytes = file_bytes(tmp, write_tokens(args.long_steps * args.long_rows_per_step, args.long_rows_per_step))
        path = os.path.join(tmp, f"bench-{next(_FILES) - 1}.duckdb")
        with Store(path) as store:
            run_id = store.reader.list_runs()["run_id"][0]
        compacted = compact_file(path, run_id, args.keep_token_steps)
    per_token = token["bytes_per_record"]
    report = {
        "empty_file_bytes": empty,
        "per_token_row": token,
        "per_sample": {**sample, "completion_chars": args.completion_chars, "prompt_chars": args.completion_chars // 4},
        "per_step_scalars_and_histogram": {**step, "scalar_keys": SCALAR_KEYS, "histogram_bins": len(ENTROPY_EDGES) - 1},
        "example_step_bytes": {  # a GRPO step of 64 completions × 512 tokens, all logged
            "token_rows": 64 * 512, "samples": 64,
            "bytes": round(64 * 512 * per_token + 64 * sample["bytes_per_record"] + step["bytes_per_record"]),
        },
        "compact": {"steps": args.long_steps, "rows_per_step": args.long_rows_per_step,
                    "file_bytes_written": long_bytes, **compacted},
    }
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
