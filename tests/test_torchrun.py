"""`torchrun --nproc_per_node=2` on CPU (gloo): both ranks stream into ONE run of a real
collector, and the collector's merged step is the token-weighted mean of the two ranks."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest

from forksight.monitor.collector.store import Store
from rank_checks import assert_ranks_share_one_run

REPO = Path(__file__).resolve().parents[1]


def _torchrun() -> list[str]:
    exe = shutil.which("torchrun", path=os.path.dirname(sys.executable))
    return [exe] if exe else [sys.executable, "-m", "torch.distributed.run"]


def test_two_ranks_stream_into_one_merged_run(tmp_path, collector):
    cmd = _torchrun() + [
        # "--" keeps torchrun's own parser from reading our flags (--run is ambiguous to it)
        "--standalone", "--nproc_per_node=2", "-m", "forksight", "--", "train",
        "--preset", "tiny-test", "--strategy", "fork", "--steps", "2", "--url", collector.url,
        "--run", "ddp", "--out-dir", str(tmp_path / "runs")]
    # unbuffered, as in many CI images: each rank's summary must still arrive as one whole line
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    out = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=400, env=env)
    assert out.returncode == 0, (out.stdout[-2000:], out.stderr[-4000:])
    summaries = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    assert len(summaries) == 2 and {s["run_id"] for s in summaries} == {"ddp"}
    collector.stop()

    con = duckdb.connect(collector.db, read_only=True)
    try:
        assert_ranks_share_one_run(con, "ddp", [0, 1])
        per_rank = {(step, rank, key): (value, weight) for step, rank, key, value, weight in con.execute(
            "SELECT step, rank, key, value, weight FROM scalars WHERE run_id='ddp'").fetchall()}
    finally:
        con.close()
    for step in (1, 2):
        # gradients were all-reduced before clipping: both ranks saw the same gradient norm
        assert per_rank[(step, 0, "grad_norm")][0] == pytest.approx(per_rank[(step, 1, "grad_norm")][0], rel=1e-5)
    with Store(collector.db) as store:
        merged = store.reader.read_scalars("ddp", keys=["entropy/mean"])
    for step in (1, 2):
        (h0, w0), (h1, w1) = per_rank[(step, 0, "entropy/mean")], per_rank[(step, 1, "entropy/mean")]
        expected = (h0 * w0 + h1 * w1) / (w0 + w1)
        assert merged[merged.step == step].value.iloc[0] == pytest.approx(expected, rel=1e-9)
