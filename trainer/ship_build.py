"""Build the shipped models again (`python -m forksight.trainer.ship_build`): the tiny model's
random initialisation, then each warm-up of `shipped.WARMUPS`, in a private FORKSIGHT_HOME with
shipped lookups off, copied into trainer/models/ with a new manifest. A new set is new base
weights: rerun bench/kernel_spread.py and the figures built on them (README, docs/*.json).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from forksight.trainer import shipped


def _files(folder: Path) -> dict[str, str]:
    return {f.name: shipped.sha256(f) for f in sorted(folder.iterdir()) if f.is_file()}


def _warm_one(home: str, base: str, warm: shipped.Warm) -> tuple[str, str, dict]:
    """Run one warm-up as the preset would (its task, target, loss, time budget); one thread."""
    os.environ["FORKSIGHT_HOME"] = home
    import torch

    from forksight.trainer.config import load_config
    from forksight.trainer.tasks import make_task
    from forksight.trainer.warmup import ensure_warm

    torch.set_num_threads(1)
    config = load_config(None, warm.preset, {"seed": warm.seed})
    task = make_task(config.task, level=config.level, reverse=config.reverse, graded=config.graded)
    out = ensure_warm(base, task, target_pass=config.warmup_pass, loss=config.warmup_loss, seed=warm.seed,
                      max_seconds=config.warmup_max_seconds, progress=False, shipped=False)
    key = {"base": warm.base, "task": task.name, "loss": config.warmup_loss, "target_pass": config.warmup_pass,
           "seed": warm.seed}
    return warm.name, str(out), key


def rebuild(workers: int = 2) -> dict:
    from forksight.trainer.model import TinySpec, build_tiny

    home = tempfile.mkdtemp(prefix="forksight-ship-")
    os.environ["FORKSIGHT_HOME"] = home
    started = time.time()
    base = build_tiny(shipped=False)
    import torch

    built = {"torch": torch.__version__, "cpu_capability": torch.backends.cpu.get_cpu_capability(),
             "machine": platform.machine(), "date": time.strftime("%Y-%m-%d")}
    folders = {"tiny": base}
    models = {"tiny": {"spec": TinySpec().key(), "about": "TinySpec() at its seed: random init + BPE tokenizer"}}
    with ProcessPoolExecutor(max_workers=workers) as pool:
        jobs = [pool.submit(_warm_one, home, str(folders[w.base]), w) for w in shipped.WARMUPS]
        for job in jobs:
            name, out, key = job.result()
            folders[name] = Path(out)
            info = json.loads((Path(out) / "warmup.json").read_text())
            if not info.get("reached"):
                raise SystemExit(f"warm-up {name} stopped short of its target: {info}; rerun on a quieter machine")
            models[name] = {"warmup": key, "about": info}
            print(f"ship_build: {name} pass@1 {info['pass@1']} after {info['steps']} steps, {info['seconds']} s",
                  flush=True)
    shutil.rmtree(shipped.SHIPPED, ignore_errors=True)
    shipped.SHIPPED.mkdir(parents=True)
    for name, folder in folders.items():
        shutil.copytree(folder, shipped.SHIPPED / name)
        models[name]["files"] = _files(shipped.SHIPPED / name)
    doc = {"format": 1, "built": {**built, "seconds": round(time.time() - started)}, "models": models}
    shipped.MANIFEST.write_text(json.dumps(doc, indent=1) + "\n")
    shutil.rmtree(home, ignore_errors=True)
    return doc


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, default=2, help="warm-ups run side by side (one thread each)")
    args = parser.parse_args(argv)
    doc = rebuild(args.workers)
    print(json.dumps({"built": doc["built"], "models": {k: v["files"]["model.safetensors"][:12]
                                                        for k, v in doc["models"].items()}}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
