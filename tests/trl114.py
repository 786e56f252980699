"""A TRL test module reruns itself on TRL 1.14 (the logits path, `.venv/trl114`, which `make setup`
installs beside TRL 1.16): one subprocess of pytest with 1.14 first on the path."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TRL114 = REPO / ".venv" / "trl114"
INNER_114 = "FORKSIGHT_TRL114_INNER"  # set when a module reruns itself on TRL 1.14


def rerun_on_trl_114(module_file: str, expected: str) -> None:
    """Run module_file's tests again on TRL 1.14; `expected` is pytest's closing count there."""
    assert (TRL114 / "trl").is_dir(), f"TRL 1.14 is missing at {TRL114}: run `make setup` (it installs it there)"
    path = os.pathsep.join(p for p in (str(TRL114), str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "PYTHONPATH": path, INNER_114: "1", "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", module_file],
                         cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-4000:]
    assert expected in out.stdout, out.stdout[-2000:]
