"""The warm starts the bench runs share (built once, cached; trainer/warmup.py): the readable preset's
(the tiny model warmed to the preset's pass@1 with seed 0) and the three-digit worked sums' (the
`steps` task at level 2 warmed to sampled pass@1 0.3: readable reasoning of 40-58 tokens whose
outcome is undecided on most problems, where pivotal tokens live)."""
from __future__ import annotations


def _warm(task: str, level: int, graded: bool, target_pass: float, max_seconds: float) -> str:
    from forksight.trainer.model import build_tiny
    from forksight.trainer.tasks import make_task
    from forksight.trainer.warmup import ensure_warm

    return str(ensure_warm(str(build_tiny()), make_task(task, level=level, graded=graded), target_pass=target_pass,
                           seed=0, max_seconds=max_seconds, progress=False))


def warm_model() -> str:
    from forksight.trainer.config import PRESETS

    p = PRESETS["readable"]
    return _warm(p["task"], p["level"], p["graded"], p["warmup_pass"], p["warmup_max_seconds"])


def steps3_model() -> str:
    return _warm("steps", 2, True, 0.3, 1500)
