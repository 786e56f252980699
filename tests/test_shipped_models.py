"""The shipped models (issue 46): the tiny base and the presets' warm-ups are files with their
SHA-256, the same bits on every machine. Checked: every file against the manifest; the base and a
warm-up materialised in an empty FORKSIGHT_HOME under other PyTorch kernel levels (stand-ins for
other CPUs; MKL's MKL_CBWR another BLAS path) hash to the manifest, where building them there gives
other bits; the content lookup
(a teacher is a warm-up of a warm-up); a changed file refused with what to do; no training when a
shipped warm-up applies."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from forksight.trainer import shipped
from forksight.trainer.model import TinySpec, build_tiny
from forksight.trainer.tasks import make_task
from forksight.trainer.warmup import ensure_warm

# kernel paths that stand in for other CPUs: PyTorch's levels this CPU has (default and avx2 on every
# x86_64, avx512 where present) and MKL's reproducibility branch at the machine's own level
NATIVE = torch.backends.cpu.get_cpu_capability()
PATHS = {"default": {"ATEN_CPU_CAPABILITY": "default"}, "avx2": {"ATEN_CPU_CAPABILITY": "avx2"},
         **({"avx512": {"ATEN_CPU_CAPABILITY": "avx512"}} if NATIVE == "AVX512" else {}),
         "mkl-compatible": {"MKL_CBWR": "COMPATIBLE"}}


def test_every_shipped_file_matches_its_manifest_hash_and_every_warm_up_reached_its_target():
    models = shipped.manifest()["models"]
    assert {"tiny", "readable-s0", "readable-s1", "readable-s2", "healthy-s0"} <= set(models)
    for name, entry in models.items():
        folder = shipped.verify(name)
        assert {"config.json", "model.safetensors", "tokenizer.json"} <= set(entry["files"]), name
        assert sorted(p.name for p in folder.iterdir()) == sorted(entry["files"]), name  # nothing unlisted
        if "warmup" in entry:
            info = json.loads((folder / "warmup.json").read_text())
            assert info["reached"] and info["pass@1"] >= entry["warmup"]["target_pass"], (name, info)
            assert entry["warmup"]["base"] in models
    # under 4 MiB in all (7 models of ~400 KB): small enough to ship in the wheel
    assert sum(f.stat().st_size for f in shipped.SHIPPED.rglob("*") if f.is_file()) < 4 * 2**20


def _hashes_under(path: dict, home: Path) -> dict:
    """In a fresh process at this kernel level with an empty FORKSIGHT_HOME: the weights' hashes of
    the shipped base, the readable warm-up, and the base built here from its seed (shipped=False)."""
    code = """
import json, sys
from forksight.trainer import shipped
from forksight.trainer.config import load_config
from forksight.trainer.model import build_tiny
from forksight.trainer.tasks import make_task
from forksight.trainer.warmup import ensure_warm
import torch
c = load_config(None, "readable", {})
base = build_tiny()
warm = ensure_warm(base, make_task(c.task, level=c.level, graded=c.graded), target_pass=c.warmup_pass, progress=False)
local = build_tiny(sys.argv[1], shipped=False)
print(json.dumps({"level": torch.backends.cpu.get_cpu_capability(), "base": shipped.sha256(base / "model.safetensors"),
                  "warm": shipped.sha256(warm / "model.safetensors"), "local": shipped.sha256(local / "model.safetensors")}))
"""
    env = {**os.environ, **path, "FORKSIGHT_HOME": str(home)}
    proc = subprocess.run([sys.executable, "-c", code, str(home / "local")], env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_the_base_and_the_warm_up_are_the_shipped_bits_under_each_kernel_path(tmp_path):
    got = {name: _hashes_under(env, tmp_path / name) for name, env in PATHS.items()}
    assert (got["default"]["level"], got["avx2"]["level"]) == ("DEFAULT", "AVX2")   # the level really changed
    for name, g in got.items():
        assert g["base"] == shipped.weights_of("tiny"), name
        assert g["warm"] == shipped.weights_of("readable-s0"), name
    # what the shipped files replace: built from the same seed, the kernel levels disagree
    assert got["default"]["local"] != got["avx2"]["local"]


def test_a_shipped_warm_up_is_found_by_content_and_copied_without_training(tmp_path, monkeypatch):
    monkeypatch.setenv("FORKSIGHT_HOME", str(tmp_path))
    base = build_tiny()
    assert shipped.sha256(base / "model.safetensors") == shipped.weights_of("tiny")
    task = make_task("steps", level=1, graded=True)
    said = []
    monkeypatch.setattr("forksight.trainer.warmup.supervised", lambda *a, **k: said.append("trained"))
    out = ensure_warm(base, task, target_pass=0.3, seed=1, progress=False)
    assert said == [] and shipped.sha256(out / "model.safetensors") == shipped.weights_of("readable-s1")
    assert out.parent == tmp_path / "warm"                                      # in the cache, as before
    # keyed as the cache is: another target, seed or loss has no shipped warm-up
    assert shipped.find_warm(base, task.name, "ce", 0.3, 2) == "readable-s2"
    assert shipped.find_warm(base, task.name, "ce", 0.5, 0) is None
    assert shipped.find_warm(base, task.name, "bounded", 0.3, 0) is None
    assert shipped.find_warm(base, task.name, "ce", 0.3, 3) is None
    # a warm-up of a warm-up (distillation's teacher) is looked up by its base's weights
    assert shipped.find_warm(out, task.name, "ce", 0.3, 1) is None
    assert shipped.find_warm(tmp_path / "nowhere", task.name, "ce", 0.3, 1) is None


def test_a_changed_copy_in_the_cache_is_replaced_by_the_shipped_bits(tmp_path, monkeypatch):
    monkeypatch.setenv("FORKSIGHT_HOME", str(tmp_path))
    base = build_tiny()
    (base / "model.safetensors").write_bytes(b"not the weights")
    again = build_tiny()
    assert again == base and shipped.sha256(again / "model.safetensors") == shipped.weights_of("tiny")


def test_a_changed_shipped_file_is_refused_with_what_to_do(tmp_path, monkeypatch):
    copy = tmp_path / "models"
    shutil.copytree(shipped.SHIPPED, copy)
    monkeypatch.setattr(shipped, "SHIPPED", copy)
    monkeypatch.setattr(shipped, "MANIFEST", copy / "manifest.json")
    monkeypatch.setenv("FORKSIGHT_HOME", str(tmp_path / "home"))
    weights = copy / "tiny" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-1] + b"\x00")
    with pytest.raises(shipped.ShippedModelError, match=r"tiny/model.safetensors is changed .*reinstall forksight"):
        build_tiny()
    assert not (tmp_path / "home" / "models").exists() or not any(
        (p / "config.json").exists() for p in (tmp_path / "home" / "models").iterdir())   # nothing half-copied
    with pytest.raises(shipped.ShippedModelError, match="no shipped model 'nope'"):
        shipped.verify("nope")


def test_another_spec_is_built_here_and_not_taken_from_the_shipped_files(tmp_path):
    spec = TinySpec(hidden_size=32, intermediate_size=64)
    assert shipped.base_name(spec.key()) is None and shipped.base_name(TinySpec().key()) == "tiny"
    out = build_tiny(tmp_path / "other", spec)
    assert json.loads((out / "config.json").read_text())["hidden_size"] == 32
