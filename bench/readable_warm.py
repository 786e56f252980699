"""The readable preset's warm start, as every bench run on it starts from: the tiny model warmed to the
preset's pass@1 with seed 0 (built once, cached; trainer/warmup.py)."""
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
