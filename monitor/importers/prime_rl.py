"""prime-rl's per-token export (`--enable-token-export`) read as forksight token rows.

What it is, from its writer: src/prime_rl/trainer/rl/token_export.py in PrimeIntellect-ai/prime-rl
(SCHEMA_VERSION = 1; commit 559b447, Aug 2026). TokenExporter writes
<output_dir>/token_exports/step_<step>/rank_<rank>.jsonl, one JSON object per packed sequence
(`json.dumps(..., allow_nan=False)`: a non-finite float is written as null) with schema_version,
step, rank, micro_step, micro_sequence_idx, export_sequence_idx, env_name and per-position lists of
equal length: token_ids, position_ids, loss_mask, advantages, inference_logprobs, trainer_logprobs,
entropy, mismatch_kl, log_importance_ratio, importance_ratio, prob_delta, is_masked,
is_masked_high, is_masked_low, rl_weights, ce_weights, ref_kl_weights (optional ones all null).
A sequence is the prompt followed by the completion; loss_mask marks the trained (sampled) tokens,
and in multi-turn rollouts the environment's text between turns has loss_mask false. Once every
rank has flushed a step, the trainer touches step_<step>/STABLE (mark_stable).

Mapped to forksight's tokens table: the completion starts at the first loss_mask token (pos 0);
a later token with loss_mask false is environment text (env, not scored); entropy and logp
(trainer_logprobs: the trainer's log p of the token) as exported; sampler_logp = inference_logprobs
(the inference engine's log p) on the trained tokens the policy sampled (prime-rl's mismatch mask:
loss_mask and a non-zero rl or ref_kl weight; a ce-only token was not sampled by it); selected =
loss_mask and not is_masked (DPPO's trust region mask, where the loss config computed it), and
is_masked is kept as the step's `corrected` tokens. Per step, entropy/mean and fork/frac over the
trained tokens become the run's steps here; the `mismatch/*` scalars are computed from the token
tables by the same function as a live run's (forksight.compose.import_mismatch: this room may not
import hooks). sample_id numbers a step's sequences across its rank files in rank order (unique per
step, as forksight's sinks number them)."""
from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pyarrow as pa

from forksight.base.fork_rule import ForkRule
from forksight.monitor.importers.run import ImportedRun, SourceError

SCHEMA_VERSION = 1
MAX_TOKENS = 2_000_000          # token rows kept from one export (memory bounded whatever the input)
_STEP = re.compile(r"step_(\d+)")
_RANK = re.compile(r"rank_(\d+)\.jsonl")
EXPECTED = ("prime-rl's token export (<output_dir>/token_exports/step_N/rank_R.jsonl, written with "
            "--enable-token-export)")


def _root(path: Path) -> Path | None:
    if path.is_dir() and path.name == "token_exports":
        return path
    if path.is_dir() and (path / "token_exports").is_dir():
        return path / "token_exports"
    return None


def export_files(path: Path) -> dict[int, list[Path]]:
    """step -> its rank files, for a token_exports/ folder, the output dir above it, or one step_N dir."""
    if path.is_dir() and _STEP.fullmatch(path.name):
        steps = [path]
    else:
        root = _root(path)
        steps = [p for p in root.iterdir() if p.is_dir() and _STEP.fullmatch(p.name)] if root else []
    out = {int(_STEP.fullmatch(p.name).group(1)): sorted((f for f in p.iterdir() if _RANK.fullmatch(f.name)),
                                                         key=lambda f: int(_RANK.fullmatch(f.name).group(1)))
           for p in steps}
    return {s: files for s, files in sorted(out.items()) if files}


def read_token_export(path: Path, fork_rule: ForkRule | str | None = None) -> ImportedRun:
    rule = ForkRule.parse(fork_rule)
    files = export_files(path)
    if not files:
        raise SourceError(f"{path} holds no step_N/rank_R.jsonl; expected {EXPECTED}")
    stable = {s for s, fs in files.items() if (fs[0].parent / "STABLE").exists()}
    root = _root(path)
    run = ImportedRun((root.parent.name if root else path.parent.parent.name) or "prime-rl", "prime-rl")
    run.config["fork_rule"] = str(rule)
    kept = 0
    for step, rank_files in files.items():
        if stable and step not in stable:     # a step still being written when the export was copied
            run.config.setdefault("skipped_unstable_steps", []).append(step)
            continue
        columns: dict[str, list] = {n: [] for n in ("sample_id", "pos", "token_id", "entropy", "logp",
                                                    "sampler_logp", "corrected", "fork", "selected", "env")}
        sample_id = 0
        for file in rank_files:
            if kept >= MAX_TOKENS:
                break
            for record in _records(file):
                n = _sequence(record, sample_id, columns)
                if n:
                    sample_id += 1
                    kept += n
                if kept >= MAX_TOKENS:
                    break
        if not columns["pos"]:
            continue
        h = np.array([np.nan if v is None else v for v in columns["entropy"]], dtype=np.float64)
        tau = rule.threshold(h[~np.array(columns["env"], dtype=bool)])          # the run's fork rule
        columns["fork"] = [None if v is None else bool(v >= tau) for v in columns["entropy"]]
        corrected = columns.pop("corrected")
        table = pa.table({"step": pa.array(np.full(len(columns["pos"]), step, np.int64)),
                          "sample_id": pa.array(columns.pop("sample_id"), pa.int64()),
                          "pos": pa.array(columns.pop("pos"), pa.int32()),
                          "token_id": pa.array(columns.pop("token_id"), pa.int32()),
                          "entropy": pa.array(columns.pop("entropy"), pa.float32()),
                          "logp": pa.array(columns.pop("logp"), pa.float32()),
                          "sampler_logp": pa.array(columns.pop("sampler_logp"), pa.float32()),
                          **{k: pa.array(v, pa.bool_()) for k, v in columns.items()}})
        run.tokens.append(table)
        # is_masked is null throughout where the loss config computes no mask: nothing to say then
        known = any(c is not None for c in corrected)
        run.corrected.append(np.array([bool(c) for c in corrected]) if known else None)
        run.steps.append(step)
        run.rows.append(_step_row(table, tau, rule))
        if kept >= MAX_TOKENS:
            run.config["truncated_at_tokens"] = MAX_TOKENS
            break
    if not run.steps:
        raise SourceError(f"{path} holds no exported sequence with a trained token; expected {EXPECTED}")
    return run


def _records(file: Path):
    with file.open("rb") as fh:
        for number, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except (json.JSONDecodeError, UnicodeDecodeError):
                if number == 1:
                    raise SourceError(f"{file} line 1 is not JSON; expected {EXPECTED}") from None
                continue        # a line cut short by a crash: keep the rest
            if not isinstance(record, dict) or "token_ids" not in record or "loss_mask" not in record:
                raise SourceError(f"{file} line {number} has no token_ids/loss_mask; expected {EXPECTED}")
            if record.get("schema_version") != SCHEMA_VERSION:
                raise SourceError(f"{file} line {number} has schema_version {record.get('schema_version')!r}; "
                                  f"forksight reads prime-rl's token export schema {SCHEMA_VERSION}")
            yield record


def _column(record: dict, name: str, n: int) -> list:
    values = record.get(name)
    return values if isinstance(values, list) and len(values) == n else [None] * n


def _sequence(record: dict, sample_id: int, columns: dict[str, list]) -> int:
    ids, mask = record["token_ids"], record["loss_mask"]
    n = len(ids)
    if len(mask) != n:
        raise SourceError(f"a sequence of step {record.get('step')} has {n} token_ids but {len(mask)} loss_mask "
                          f"values; expected {EXPECTED}")
    start = next((i for i, m in enumerate(mask) if m), None)
    if start is None:
        return 0
    entropy, logp = _column(record, "entropy", n), _column(record, "trainer_logprobs", n)
    sampler, masked = _column(record, "inference_logprobs", n), _column(record, "is_masked", n)
    rl, ref_kl = _column(record, "rl_weights", n), _column(record, "ref_kl_weights", n)
    for i in range(start, n):
        trained = bool(mask[i])
        h = entropy[i] if trained else None
        # as prime-rl's trainer picks the tokens of its mismatch_kl: null rl weights mean 1.0 on the loss mask
        sampled = trained and (rl[i] is None or rl[i] != 0 or (ref_kl[i] is not None and ref_kl[i] != 0))
        columns["sample_id"].append(sample_id)
        columns["pos"].append(i - start)
        columns["token_id"].append(int(ids[i]))
        columns["entropy"].append(h)
        columns["logp"].append(logp[i] if trained else None)
        columns["sampler_logp"].append(_float(sampler[i]) if sampled else None)
        columns["corrected"].append(masked[i] if trained else None)
        columns["fork"].append(None)             # set per step under the run's fork rule
        columns["selected"].append(trained and not masked[i])
        columns["env"].append(not trained)
    return n - start


def _float(value) -> float | None:
    """A JSON number as float; anything else (null, a string) is unknown."""
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _step_row(table: pa.Table, tau: float, rule: ForkRule) -> dict[str, float]:
    entropy = table.column("entropy").to_numpy(zero_copy_only=False).astype(np.float64)
    trained = ~table.column("env").to_numpy(zero_copy_only=False).astype(bool)
    h = entropy[trained & np.isfinite(entropy)]
    row = {"tokens/count": float(trained.sum())}
    if h.size:
        row["entropy/mean"] = float(h.mean())
        row["fork/frac"] = float((h >= tau).mean())
        row["fork/threshold"] = float(tau)
        if rule.relative:
            row["fork/quantile"] = rule.value
    return row
