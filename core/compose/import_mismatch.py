"""An imported token export's training–inference mismatch (prime-rl's inference_logprobs): each step's
`mismatch/*` scalars and `mismatch_log_ratio` histogram from the same functions a live run's reporter
calls (forksight.hooks.metrics.mismatch), which the importers' room may not import."""
from __future__ import annotations

import numpy as np


def _grid(table, column: str, rows: np.ndarray, cols: np.ndarray, shape: tuple[int, int], fill, dtype):
    """One token column laid out [sequence, position] (fill where a sequence has no token)."""
    out = np.full(shape, fill, dtype)
    values = table.column(column).to_numpy(zero_copy_only=False)
    if dtype is bool:
        values = np.array([bool(v) for v in values.tolist()])       # null -> False
    else:
        values = np.asarray(values, np.float64)                       # null -> NaN
    out[rows, cols] = values
    return out


def step_mismatch(table, corrected: np.ndarray | None, where: str):
    """(scalars, histogram counts or None, the table with its sampler_logp cleaned, a problem or None)
    for one step's token table; trained = not env, as the importers mark it."""
    import pyarrow as pa
    import torch

    from forksight.base.constants import MISMATCH_EDGES
    from forksight.hooks.metrics.mismatch import clean_sampler_logp, log_ratio, ratio_scalars
    from forksight.hooks.metrics.summary import histogram

    if "sampler_logp" not in table.column_names or table.column("sampler_logp").null_count == table.num_rows:
        return {}, None, table, None
    ids, rows = np.unique(table.column("sample_id").to_numpy(), return_inverse=True)
    cols = table.column("pos").to_numpy().astype(np.int64)
    shape = (ids.size, int(cols.max()) + 1)
    mask = torch.from_numpy(~_grid(table, "env", rows, cols, shape, True, bool))
    logp = torch.from_numpy(_grid(table, "logp", rows, cols, shape, np.nan, np.float64))
    sampler = torch.from_numpy(_grid(table, "sampler_logp", rows, cols, shape, np.nan, np.float64))
    fork = torch.from_numpy(_grid(table, "fork", rows, cols, shape, False, bool))
    fixed = None
    if corrected is not None:
        fixed = np.zeros(shape, bool)
        fixed[rows, cols] = corrected
        fixed = torch.from_numpy(fixed)
    sampler, problem = clean_sampler_logp(sampler, mask, where)
    cleaned = sampler.numpy()[rows, cols]
    table = table.set_column(table.column_names.index("sampler_logp"), "sampler_logp",
                             pa.array(cleaned, pa.float32(), mask=np.isnan(cleaned)))
    # as StepReporter.report does: one log ratio per token feeds both the scalars and the histogram
    ratios = log_ratio(logp, sampler, mask)
    scalars = ratio_scalars(ratios, fork=fork & mask, corrected=fixed)
    counts = None
    if "mismatch/tokens" in scalars:
        counts = histogram(ratios[~torch.isnan(ratios)].numpy(), MISMATCH_EDGES)
    return scalars, counts, table, problem


def import_mismatch(steps: list[int], rows: list[dict], tokens: list, corrected: list, kind: str):
    """Each token table's step gains its mismatch scalars (where the log has none under those names);
    returns (steps, rows, cleaned token tables, histogram items, notes). A sampler log p that cannot be
    one is stored as null; one note for the whole import says so."""
    from forksight.base.constants import MISMATCH_EDGES

    by_step = {step: dict(row) for step, row in zip(steps, rows)}
    tables, items, problems = [], [], []
    for i, table in enumerate(tokens):
        step = int(table.column("step")[0].as_py())
        scalars, counts, table, problem = step_mismatch(table, corrected[i] if i < len(corrected) else None,
                                                        f"{kind} import, step {step}")
        tables.append(table)
        if problem:
            problems.append(problem)
        for key, value in scalars.items():
            by_step.setdefault(step, {}).setdefault(key, value)
        if counts is not None:
            items.append({"step": step, "key": "mismatch_log_ratio", "counts": counts, "edges": MISMATCH_EDGES})
    notes = [problems[0] + (f" (and in {len(problems) - 1} more step(s))" if len(problems) > 1 else "")
             ] if problems else []
    ordered = sorted(by_step)
    return ordered, [by_step[s] for s in ordered], tables, items, notes
