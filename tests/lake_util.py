"""Helpers of the lake tests: batches with every table's rows sent over real HTTP, and the rows of a
DuckDB file and of the lake read back the two ways (DuckDB's own file, pyiceberg's scan) for comparing."""
from __future__ import annotations

import time

import duckdb
import httpx
import pyarrow as pa

# the columns that name one row of each table (what sorts both sides the same way)
KEYS = {"scalars": ("run_id", "step", "key", "rank"), "tokens": ("run_id", "step", "sample_id", "pos"),
        "samples": ("run_id", "step", "sample_id"), "histograms": ("run_id", "step", "key", "bin_lo"),
        "probes": ("run_id", "step", "sample_id", "pos"), "reference": ("run_id", "step", "sample_id", "pos"),
        "runs": ("run_id",),
        "alerts": ("run_id", "step", "detector")}
STEP_TABLES = ("scalars", "tokens", "samples", "histograms", "probes", "reference")


def batch(step: int, tokens: int = 40, tag: str = "b") -> dict:
    """One step's batch: 2 scalars, `tokens` token rows (sampler_logp included), 2 samples, 3 bins, 2 probes,
    3 reference rows (a prompt token at pos -1, two completion tokens)."""
    ids = [i // 10 for i in range(tokens)]
    return {"batch_id": f"{tag}{step}",
            "scalars": [{"step": step, "key": "entropy/mean", "value": 1.0 + step / 7},
                        {"step": step, "key": "reward/mean", "value": step * 0.25, "weight": 3.0}],
            "tokens": [{"step": step, "sample_id": ids, "pos": [i % 10 for i in range(tokens)],
                        "token_id": list(range(tokens)), "token": [f"t{i}" for i in range(tokens)],
                        "entropy": [(i * 37 % 11) / 7 for i in range(tokens)],
                        "logp": [-(i % 5) / 3 for i in range(tokens)],
                        "sampler_logp": [-(i % 7) / 4 for i in range(tokens)],
                        "fork": [i % 3 == 0 for i in range(tokens)]}],
            "samples": [{"step": step, "sample_id": s, "group_id": 0, "prompt": f"p{step}", "completion": f"c{s}",
                         "reward": float(s), "correct": s == 1, "length": 10} for s in (0, 1)],
            "histograms": [{"step": step, "key": "entropy", "counts": [1.0, 2.0, step], "edges": [0, 1, 2, 3]}],
            "probes": [{"step": step, "sample_id": 0, "pos": p, "token_id": p, "token": f"t{p}", "fork": p == 0,
                        "v_before": 0.5, "v_after": 0.25 * p, "delta": 0.25 * p - 0.5, "se": 0.1, "k": 16,
                        "alternatives": '[{"token_id": 3, "token": "t3", "value": 1.0, "k": 16}]'} for p in (0, 1)],
            "reference": [{"step": step, "sample_id": 0, "pos": p, "token_id": 5 + p, "token": f"r{p}",
                           "entropy": None if p < 0 else 0.5 * p + step / 100, "renyi2": None if p < 0 else 0.2 * p,
                           "logp": None if p < 0 else -0.1 * p, "fork": None if p < 0 else p == 1}
                          for p in (-1, 0, 1)]}


def rows_of(body: dict) -> dict[str, int]:
    """The rows one batch adds per table, counted from the body (not from the collector's answer)."""
    return {"scalars": len(body["scalars"]), "tokens": sum(len(b["sample_id"]) for b in body["tokens"]),
            "samples": len(body["samples"]), "histograms": sum(len(h["counts"]) for h in body["histograms"]),
            "probes": len(body.get("probes", [])), "reference": len(body.get("reference", []))}


def post(url: str, run: str, body: dict) -> dict:
    r = httpx.post(f"{url}/api/runs/{run}/ingest", json=body, timeout=30)
    assert r.status_code == 200, r.text
    return r.json()


def create_run(url: str, name: str) -> str:
    r = httpx.post(f"{url}/api/runs", json={"name": name}, timeout=30)
    assert r.status_code == 201, r.text
    return r.json()["run_id"]


def wait_drained(url: str, timeout: float = 60.0) -> dict:
    """Poll /api/health/lake until the backlog is 0 and the state ok; the last answer."""
    deadline, last = time.monotonic() + timeout, None
    while time.monotonic() < deadline:
        r = httpx.get(f"{url}/api/health/lake", timeout=10)
        last = r.json()
        if r.status_code == 200 and last["backlog_total"] == 0:
            return last
        time.sleep(0.3)
    raise AssertionError(f"the lake backlog did not drain within {timeout} s: {last}")


def sort(table: pa.Table, name: str) -> list[dict]:
    return table.sort_by([(k, "ascending") for k in KEYS[name]]).to_pylist()


def duck_rows(db: str, name: str) -> list[dict]:
    """A closed DuckDB file's rows of one table (its declared columns: not the lake's _lake_seq), sorted."""
    from forksight.base.tables import TABLES

    with duckdb.connect(db, read_only=True) as conn:
        return sort(conn.sql(f"SELECT {', '.join(TABLES[name].names)} FROM {name}").to_arrow_table(), name)


def lake_rows(catalog, name: str, collector: str) -> list[dict]:
    """The lake's rows of one table written by `collector`, without the collector column, sorted."""
    from pyiceberg.expressions import EqualTo

    table = catalog.load_table(f"forksight.{name}").scan(row_filter=EqualTo("collector", collector)).to_arrow()
    return sort(table.drop_columns(["collector"]), name)


def child_patch_env(folder, code: str) -> dict:
    """Env for a child `forksight serve` that runs `code` at interpreter start (a sitecustomize on its
    PYTHONPATH): the test seam for what a test must do inside a real collector process."""
    import os
    from pathlib import Path

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "sitecustomize.py").write_text(code)
    return {"PYTHONPATH": os.pathsep.join(p for p in (str(folder), os.environ.get("PYTHONPATH")) if p)}


def pause_after_commit_env(folder, seconds: float) -> dict:
    """A child collector whose committer, after its first Iceberg commit and before the outbox delete,
    prints 'pausing' and sleeps `seconds` (Committer.after_commit, the seam for a crash there)."""
    return child_patch_env(folder, f"""
import sys, time
from forksight.monitor.lake.committer import Committer

def _pause(self, name, lo, hi):
    print(f"forksight lake test seam: committed {{name}} {{lo}}-{{hi}}; pausing {seconds} s", file=sys.stderr, flush=True)
    time.sleep({seconds})

Committer.after_commit = _pause
""")
