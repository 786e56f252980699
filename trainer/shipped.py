"""The models forksight ships: the tiny model's initial weights and tokenizer, and the warm-ups
the presets start from, as small versioned files with their SHA-256 (`trainer/models/`).

Why ship them: random initialisation and the supervised warm-up run through PyTorch's CPU kernels,
which round differently by CPU (and by `ATEN_CPU_CAPABILITY`: default, avx2 and avx512 gave three
different warmed models on one machine). Built locally, every machine trained its RL runs from its
own base model, and the demo's figures held on the machine that wrote them only. Shipped, the base
model is bit-identical everywhere; what still varies by machine is the RL trajectory itself, which
the tests bound with margins measured across kernel levels and seeds (bench/kernel_spread.py).

Lookups are by content: a shipped warm-up applies when the base it would warm has the weights of
its shipped base (SHA-256 of model.safetensors) and task, loss, target pass@1 and seed match (a
warm-up of a shipped warm-up, such as a distillation teacher, would be found the same way; none
ships yet). `python -m
forksight.trainer.ship_build` builds them all again (a new set: new hashes, new figures).
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

SHIPPED = Path(__file__).parent / "models"
MANIFEST = SHIPPED / "manifest.json"
WEIGHTS = "model.safetensors"


@dataclass(frozen=True)
class Warm:
    """One shipped warm-up: what ensure_warm would be asked for to build it."""

    name: str
    base: str            # the manifest entry it warms (the tiny base, or another warm-up)
    preset: str          # the preset whose task and warm-up settings it uses
    seed: int


# What the presets, the demo, the tests and bench/ start from: the readable preset over the three
# seeds the spread is measured on, and the healthy preset's two-digit reversed sums (seed 0 also
# starts bench/alerts_objective.py's TRL runs).
WARMUPS = ([Warm(f"readable-s{s}", "tiny", "readable", s) for s in (0, 1, 2)]
           + [Warm(f"healthy-s{s}", "tiny", "healthy", s) for s in (0, 1, 2)])


class ShippedModelError(RuntimeError):
    """A shipped file is missing or its bytes are not the ones the manifest names."""


def sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def manifest() -> dict:
    """{"models": {name: {"files": {file: sha256}, ...}}}, or an empty set when none is shipped."""
    if not MANIFEST.exists():
        return {"models": {}}
    return json.loads(MANIFEST.read_text())


def weights_of(name: str) -> str:
    """SHA-256 of a shipped model's weights."""
    return manifest()["models"][name]["files"][WEIGHTS]


def verify(name: str) -> Path:
    """The shipped directory of `name`, every file checked against the manifest."""
    entry = manifest()["models"].get(name)
    if entry is None:
        raise ShippedModelError(f"no shipped model {name!r} (trainer/models/manifest.json lists "
                                f"{sorted(manifest()['models'])})")
    folder = SHIPPED / name
    for file, digest in entry["files"].items():
        got = folder / file
        if not got.exists() or sha256(got) != digest:
            raise ShippedModelError(
                f"shipped file {got} is {'missing' if not got.exists() else 'changed'} (expected sha256 "
                f"{digest[:12]}…): reinstall forksight, or rebuild the set with "
                "`python -m forksight.trainer.ship_build`")
    return folder


def materialize(name: str, out: Path) -> Path:
    """`out` holding the verified shipped model `name`: copied there (a temp folder renamed,
    under a file lock: concurrent trainers wait for one copy) unless it already does."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    # not ensure_warm's lock file: a second flock of one file in one process would wait forever
    with open(out.parent / f".{out.name}.ship.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if is_materialized(name, out):
            return out
        source = verify(name)
        tmp = out.with_name(f"{out.name}.shipping{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.copytree(source, tmp)
        shutil.rmtree(out, ignore_errors=True)   # a changed or foreign copy
        tmp.replace(out)
    return out


def is_materialized(name: str, out: Path) -> bool:
    """Whether `out` holds shipped `name`'s weights (a changed or foreign copy is not it)."""
    weights = Path(out) / WEIGHTS
    return weights.exists() and (Path(out) / "config.json").exists() and sha256(weights) == weights_of(name)


def base_name(spec_key: str) -> str | None:
    """The shipped entry of a tiny-model spec (by `TinySpec.key()`): the one it was built from, else none."""
    entry = manifest()["models"].get("tiny")
    return "tiny" if entry is not None and entry.get("spec") == spec_key else None


def find_warm(base: Path, task_name: str, loss: str, target_pass: float, seed: int) -> str | None:
    """The shipped warm-up of `base` (matched by its weights' hash) for this task, loss, target
    and seed, or None: then the caller warms up here."""
    weights = Path(base) / WEIGHTS
    models = manifest()["models"]
    if not weights.exists() or not models:
        return None
    digest = sha256(weights)
    for name, entry in models.items():
        key = entry.get("warmup")
        if (key and models.get(key["base"], {}).get("files", {}).get(WEIGHTS) == digest
                and (key["task"], key["loss"], key["seed"]) == (task_name, loss, seed)
                and abs(key["target_pass"] - target_pass) < 1e-12):
            return name
    return None
