"""TRL's completions log (GRPOConfig(log_completions=True)) read as forksight samples.

What it is, from its writer (trl/trainer/grpo_trainer.py, GRPOTrainer.log, TRL 1.x): at every
logging step the main process writes <output_dir>/completions/completions_<global_step:05d>.parquet,
a pandas frame with columns `step`, `prompt`, `completion`, one column per reward function (its
name: the function's __name__ or the reward model's name, NaN where that function did not apply),
the extra columns reward functions logged, and `advantage`. Rows are the last generation batch
(a deque of generation_batch_size); the RepeatSampler puts each prompt's num_generations
completions next to each other, so a group is a run of consecutive rows with the same prompt.
Prompts and completions are text, or (conversational datasets) lists of {role, content} messages.

TRL logs no verdict: a sample's reward is the sum of its reward functions' values (NaN ignored, as
TRL's nansum; the file does not hold reward_weights) and it counts as correct when that is > 0,
the binary-verifier convention pass@k needs."""
from __future__ import annotations

import math
import re
from pathlib import Path

from forksight.base.limits import MAX_TEXT_CHARS
from forksight.monitor.importers.run import SourceError

MAX_SAMPLES = 200_000      # samples kept from one run (memory bounded whatever the input)
_FILE = re.compile(r"completions_(\d+)\.parquet")
_NOT_REWARD = {"step", "prompt", "completion", "advantage", "image", "images"}
EXPECTED = ("TRL's completions directory (<output_dir>/completions/completions_NNNNN.parquet, written by "
            "GRPOTrainer with log_completions=True)")


def completion_files(path: Path) -> list[Path]:
    """completions_N.parquet under a TRL output directory, its completions/ folder, or one file."""
    if path.is_file():
        return [path] if _FILE.fullmatch(path.name) else []
    folder = path if path.name == "completions" else path / "completions"
    if not folder.is_dir():
        return []
    return sorted((p for p in folder.iterdir() if _FILE.fullmatch(p.name)), key=lambda p: int(_FILE.fullmatch(
        p.name).group(1)))


def _text(value) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        text = value
    elif hasattr(value, "tolist") or isinstance(value, (list, tuple)):   # conversational: messages
        items = value.tolist() if hasattr(value, "tolist") else value
        parts = []
        for m in items:
            if isinstance(m, dict):
                content = m.get("content")
                if not isinstance(content, str) and content is not None:  # multimodal content blocks
                    content = " ".join(str(c.get("text", "")) if isinstance(c, dict) else str(c) for c in content)
                parts.append(f"{m.get('role', '')}: {content or ''}".strip())
            else:
                parts.append(str(m))
        text = "\n".join(parts)
    else:
        text = str(value)
    return text[:MAX_TEXT_CHARS]


def _number(value) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        try:
            value = float(value)
        except (TypeError, ValueError):
            return None
    return float(value) if math.isfinite(float(value)) else None


def read_completions(path: Path) -> tuple[list[dict], list[str]]:
    """(sample rows for forksight's samples table, the reward columns found); SourceError otherwise."""
    files = completion_files(path)
    if not files:
        raise SourceError(f"{path} holds no completions_N.parquet; expected {EXPECTED}")
    try:
        import pyarrow.parquet as pq
    except ImportError:   # pragma: no cover - pyarrow is a dependency of forksight
        raise SourceError("reading TRL's completions parquet needs pyarrow") from None
    rows: list[dict] = []
    reward_columns: list[str] = []
    for file in files:
        try:
            table = pq.read_table(file)
        except Exception as exc:   # pyarrow raises ArrowInvalid / OSError on a damaged file
            raise SourceError(f"{file} is not a readable parquet file ({exc}); expected {EXPECTED}") from None
        names = table.column_names
        if "prompt" not in names or "completion" not in names:
            raise SourceError(f"{file} has columns {names[:10]}; expected {EXPECTED} (prompt, completion, "
                              "one column per reward function, advantage)")
        fallback = int(_FILE.fullmatch(file.name).group(1))
        rewards = [n for n in names if n not in _NOT_REWARD and _numeric(table.schema.field(n).type)]
        rewards = [n for n in rewards if n in _reward_names(names)]
        for n in rewards:
            if n not in reward_columns:
                reward_columns.append(n)
        data = table.to_pylist()
        group, previous = -1, object()
        for index, entry in enumerate(data):
            if len(rows) >= MAX_SAMPLES:
                return rows, reward_columns
            prompt = _text(entry.get("prompt"))
            if prompt != previous:
                group, previous = group + 1, prompt
            values = [v for n in rewards if (v := _number(entry.get(n))) is not None]
            reward = sum(values) if values else None
            step = _number(entry.get("step"))
            completion = _text(entry.get("completion"))
            rows.append({"step": int(step) if step is not None else fallback, "sample_id": index, "group_id": group,
                         "prompt": prompt, "completion": completion, "reward": reward,
                         "correct": None if reward is None else reward > 0, "source": "trl"})
    return rows, reward_columns


def _numeric(kind) -> bool:
    import pyarrow as pa

    return pa.types.is_floating(kind) or pa.types.is_integer(kind)


def _reward_names(names: list[str]) -> set[str]:
    # TRL writes the reward functions' columns between completion and the extra/advantage columns
    try:
        start, end = names.index("completion") + 1, names.index("advantage")
    except ValueError:
        start, end = names.index("completion") + 1, len(names)
    return set(names[start:end])
