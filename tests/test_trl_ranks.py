"""TRL's GRPOTrainer on two processes (torchrun, and `accelerate launch`; gloo, CPU) with
forksight.trl attached on each: every rank's rows land in one run of a real collector, ids never
collide across ranks, and the merged step entropy is the number TRL logged (its mean over both
ranks' tokens)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest
import torch

from collector_util import free_port
from forksight.monitor.collector.store import Store
from rank_checks import assert_ranks_share_one_run

REPO = Path(__file__).resolve().parents[1]


def _launcher(name: str) -> list[str]:
    if name == "torchrun":
        return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    # what most TRL users type; with no GPU here the script's use_cpu=True makes it gloo on CPU
    # (accelerate's own --cpu flag would start one process: its multi-CPU path needs mpirun)
    return [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
            "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
            "--main_process_port", str(free_port())]


@pytest.mark.parametrize("launcher", ["torchrun", "accelerate"])
def test_two_trl_ranks_stream_into_one_merged_run(tmp_path, collector, tiny_model_path, launcher):
    cmd = _launcher(launcher) + [str(REPO / "tests" / "trl_ranks_script.py"), str(tiny_model_path),
                                 collector.url, "trl2", str(tmp_path / "out")]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    out = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=400, env=env)
    assert out.returncode == 0, (out.stdout[-2000:], out.stderr[-4000:])
    trl_logs = {int(k): v for k, v in json.loads((tmp_path / "out" / "trl_logs.json").read_text()).items()}
    collector.stop()

    con = duckdb.connect(collector.db, read_only=True)
    try:
        assert_ranks_share_one_run(con, "trl2", [0, 1])
        # every completion of the generation batch (2 ranks x 8) is stored once, with its length
        per_step = con.execute("SELECT step, count(*), count(DISTINCT sample_id), count(length) FROM samples "
                               "WHERE run_id='trl2' GROUP BY step ORDER BY step").fetchall()
        assert per_step == [(s, 16, 16, 16) for s in (1, 2, 3)]
        lengths = dict(con.execute("SELECT step, avg(length) FROM samples WHERE run_id='trl2' GROUP BY step").fetchall())
        tokens = con.execute("SELECT step, rank, entropy, selected FROM tokens WHERE run_id='trl2'").df()
    finally:
        con.close()
    with Store(collector.db) as store:
        merged = store.reader.read_scalars("trl2", downsample=100000)
    value = lambda key, step: float(merged[(merged.key == key) & (merged.step == step)].value.iloc[0])  # noqa: E731
    for step in (1, 2, 3):
        logs = trl_logs[step]
        assert value("entropy/mean", step) == pytest.approx(logs["entropy"], abs=1e-6)
        assert value("reward/mean", step) == pytest.approx(logs["reward"], abs=1e-6)  # rank 0, all 16 rows
        assert lengths[step] == pytest.approx(logs["completions/mean_length"], abs=1e-6)
        assert value("loss", step) == pytest.approx(logs["loss"], rel=1e-9)
        # every token of both ranks is stored (sample=2 groups = all rows): the stored selection is
        # TRL's top_entropy_quantile mask, whose threshold is gathered over both ranks
        rows = tokens[tokens.step == step]
        threshold = float(torch.quantile(torch.tensor(rows.entropy.to_numpy()), 0.8))
        clear = (rows.entropy - threshold).abs() > 1e-5
        assert (rows.selected[clear] == (rows.entropy[clear] >= threshold)).all()
