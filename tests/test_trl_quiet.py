"""Attaching forksight to a TRL script adds nothing to what it prints beyond forksight's own line:
the same warnings, each shown once, as without it. (The per-step ingest used to run pandas, whose
dtype checks enter warnings.catch_warnings; that resets every module's warning registry, so TRL's
once-only deprecation warnings printed again at every step: 10,208 warnings against 375 in TRL's
own test suite.)"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

SCRIPT = Path(__file__).with_name("trl_quiet_script.py")
WARNING = re.compile(r"^\S+:\d+: (\w+(?:Warning|Deprecation\w*)): (.*)$", re.M)

pytestmark = pytest.mark.slow


def _run(tmp_path, model_dir, db: Path | None) -> tuple[str, str]:
    argv = [sys.executable, "-W", "default", str(SCRIPT), str(model_dir), str(tmp_path / "out")]
    env = dict(os.environ, OMP_NUM_THREADS="1", FORKSIGHT_URL="http://127.0.0.1:9")
    proc = subprocess.run(argv + ([str(db)] if db else []), capture_output=True, text=True,
                          env=env, timeout=600, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout, proc.stderr


def _warnings(stderr: str) -> Counter:
    return Counter(WARNING.findall(stderr))


def test_attaching_forksight_repeats_no_warning_of_the_training_script(tmp_path, tiny_model_path):
    _, plain = _run(tmp_path, tiny_model_path, None)
    _, attached = _run(tmp_path, tiny_model_path, tmp_path / "runs.duckdb")
    without, with_forksight = _warnings(plain), _warnings(attached)
    assert without, "TRL printed no warning at all: nothing to compare (the check needs one)"
    assert max(without.values()) == 1            # without forksight each warning shows once
    assert with_forksight == without, (with_forksight - without)
    assert (tmp_path / "runs.duckdb").exists()
    # what forksight itself adds to the script's output: one line, where to see the run
    ours = [line for line in attached.splitlines() if line.startswith("forksight")]
    assert ours == [f"forksight: run quiet is stored in {tmp_path / 'runs.duckdb'}; to see it: forksight serve "
                    f"--db {tmp_path / 'runs.duckdb'}, then http://127.0.0.1:8050/run?run=quiet"]
    assert not [line for line in plain.splitlines() if line.startswith("forksight")]
