"""The built wheel, installed into a fresh venv (no editable install), works from a folder full
of files named like forksight's rooms: one import name, nothing generic at the top level."""
from __future__ import annotations

import os
import shutil
import site
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
COLLIDING = ("trainer", "hooks", "monitor", "dashboard")

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    # build from a copy of the packaged files: an in-tree build would leave build/ in the checkout
    import tomllib

    src, out = tmp_path_factory.mktemp("src"), tmp_path_factory.mktemp("dist")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    for folder in set(project["tool"]["setuptools"]["package-dir"].values()):
        shutil.copytree(ROOT / folder, src / folder, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                    "-w", str(out), str(src)], check=True, capture_output=True, text=True)
    (path,) = out.glob("forksight-*.whl")
    return path


def test_wheel_top_level_holds_forksight_only(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    top = {n.split("/")[0] for n in names}
    assert top == {"forksight", next(t for t in top if t.endswith(".dist-info"))}, top
    for room in COLLIDING:
        assert f"forksight/{room}/__init__.py" in names
    assert "forksight/dashboard/assets/style.css" in names
    assert "forksight/hooks/metrics/token_kernels.cpp" in names  # the C++ kernels build from it
    # the shipped models (the same base on every machine), each file the manifest lists
    import json

    manifest = json.loads((ROOT / "trainer" / "models" / "manifest.json").read_text())
    assert "forksight/trainer/models/manifest.json" in names
    for model, entry in manifest["models"].items():
        for file in entry["files"]:
            assert f"forksight/trainer/models/{model}/{file}" in names, (model, file)
    assert "forksight/__main__.py" in names and "forksight/compose/cli.py" in names
    # every sub-package (room) the source declares is in the wheel
    packages = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    for package in packages:
        assert package.replace(".", "/") + "/__init__.py" in names, package


def test_installed_wheel_works_beside_users_own_trainer_and_hooks(wheel, tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    py = venv / "bin" / "python"
    # the dependencies come from this environment (no network); forksight itself from the wheel only
    purelib = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             check=True, capture_output=True, text=True).stdout.strip()
    Path(purelib, "deps.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    subprocess.run([str(py), "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)], check=True)

    work = tmp_path / "project"
    work.mkdir()
    for name in COLLIDING:   # a user's own modules; importing any of them is the bug
        (work / f"{name}.py").write_text(f"raise ImportError('the user\\'s {name}.py was imported by forksight')\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}

    cli = subprocess.run([str(venv / "bin" / "forksight"), "--help"], cwd=work, env=env,
                         capture_output=True, text=True, timeout=120)
    assert cli.returncode == 0, cli.stderr
    for command in ("serve", "train", "demo", "export"):
        assert command in cli.stdout

    db = work / "one.duckdb"
    script = f"""
import sys, duckdb, forksight
assert forksight.__file__.startswith({str(venv)!r}), forksight.__file__
assert 'torch' not in sys.modules, 'import forksight must stay light'
from forksight.trainer import loop                   # the trainer room, beside ./trainer.py
from forksight.dashboard import app                  # the dashboard room, beside ./dashboard.py
assert callable(forksight.attach) and callable(forksight.serve)
assert abs(forksight.pass_at_k(4, 2, 2) - 5 / 6) < 1e-12   # 1 - C(2,2)/C(4,2)
with forksight.open_sink(run="wheel-run", db={str(db)!r}) as sink:
    sink.log_scalars(0, {{"entropy/mean": 0.5, "reward": 1.0}})
import torch
from forksight.hooks.metrics import fused, token_stats
token_stats(torch.randn(2, 3, 40), fused=True)   # the C++ kernels, built from the installed source
assert fused.kernels_run() == ["rows (C++)"], fused.kernels_run()
con = duckdb.connect({str(db)!r}, read_only=True)
print(sorted(con.execute("SELECT key, value FROM scalars WHERE run_id = 'wheel-run'").fetchall()))
"""
    env["TORCH_EXTENSIONS_DIR"] = str(tmp_path / "extensions")   # no build cached from the checkout
    out = subprocess.run([str(py), "-c", script], cwd=work, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().splitlines()[-1] == "[('entropy/mean', 0.5), ('reward', 1.0)]"
