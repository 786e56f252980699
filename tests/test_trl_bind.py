"""forksight.trl.attach refusing a bad argument after it opened its sink (`correct_reward` that is not one of the
trainer's reward functions): the ValueError reaches the caller, and the sink it opened is finished, not left open
(its DuckDB file closed, so the next attach or `forksight serve` can open it)."""
from __future__ import annotations

import subprocess
import sys

import pytest

import forksight.trl
from test_trl import make_trainer

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_a_refused_attach_closes_the_sink_it_opened(tiny_model_path, tmp_path):
    db = tmp_path / "runs.duckdb"
    trainer = make_trainer(tiny_model_path, tmp_path / "out", 1, [])
    with pytest.raises(ValueError, match="not a reward function"):
        forksight.trl.attach(trainer, db=str(db), run="refused", correct_reward="no_such_reward")
    # another process can open the file only once this one let go of it (DuckDB's lock)
    read = subprocess.run([sys.executable, "-c", "import duckdb, sys; print(duckdb.connect(sys.argv[1])"
                           ".execute('SELECT name, status FROM runs').fetchall())", str(db)],
                          capture_output=True, text=True, timeout=60)
    assert read.returncode == 0, read.stderr
    assert read.stdout.strip() == str([("refused", "failed")])
    assert all(not isinstance(c, forksight.trl.ForksightCallback) for c in trainer.callback_handler.callbacks)
