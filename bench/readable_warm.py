"""The warm starts the bench runs share (built once, cached; trainer/warmup.py): the readable preset's
(the tiny model warmed to the preset's pass@1 with seed 0) and the three-digit worked sums' (the
`steps` task at level 2 warmed to sampled pass@1 0.3: readable reasoning of 40-58 tokens whose
outcome is undecided on most problems, where pivotal tokens live)."""
from __future__ import annotations


def warm_model() -> str:
    from forksight.trainer.config import PRESETS
    from forksight.trainer.model import build_tiny
    from forksight.trainer.tasks import make_task
    from forksight.trainer.warmup import ensure_warm

    p = PRESETS["readable"]
    task = make_task(p["task"], level=p["level"], graded=p["graded"])
    return str(ensure_warm(str(build_tiny()), task, target_pass=p["warmup_pass"], seed=0,
                           max_seconds=p["warmup_max_seconds"], progress=False))


def steps3_model() -> str:
    from forksight.trainer.model import build_tiny
    from forksight.trainer.tasks import make_task
    from forksight.trainer.warmup import ensure_warm

    task = make_task("steps", level=2, graded=True)
    return str(ensure_warm(str(build_tiny()), task, target_pass=0.3, seed=0, max_seconds=1500, progress=False))
