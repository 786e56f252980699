"""The live tick: append steps ingested since the last draw to the drawn figures with a Dash
`Patch` (only the new points travel; the browser never redraws the whole chart)."""

# A figure's growable traces are described by their `meta` (set by the figure builders); the
# "plan" is that list kept in a dcc.Store, including each EMA's running state, so the smoothed
# line continues exactly where the full draw stopped.
from __future__ import annotations

import copy
from typing import Any

import numpy as np
import pandas as pd
from dash import Patch

from forksight.base.constants import ENTROPY_EDGES
from forksight.dashboard.figures import by_key, ema_debiased, series, steps_x, x_values
from forksight.dashboard.run_figures import bin_labels, histogram_matrix, median_labels

GROWING_ROLES = ("raw", "smooth", "heatmap", "median")
# How often an open run or tokens page asks for new steps: a step shows within one tick (plus
# the tick's read), so 750 ms keeps ingest -> visible under 1 s; a tick with nothing new costs
# one small statement (Reader.run_progress, token_step_span). Not 500 ms or less: an open page
# would then never be quiet for the 500 ms that browsers' "network idle" (Playwright's
# networkidle, prerender and screenshot tools) waits for.
TICK_MS = 750


def trace_plan(figure: Any) -> list[dict]:
    """[{"i": trace index, **meta}] for every trace the tick can extend."""
    data = figure.to_plotly_json()["data"] if hasattr(figure, "to_plotly_json") \
        else figure["data"]
    plan = []
    for i, trace in enumerate(data):
        meta = trace.get("meta")
        if isinstance(meta, dict) and meta.get("role") in GROWING_ROLES:
            plan.append({"i": i, **meta})
    return plan


def _new_rows(scalars: dict, key: str, last_step: int) -> pd.DataFrame:
    rows = series(scalars, key)
    return rows[rows["step"] > last_step] if len(rows) else rows


def _gap_rows(scalars: dict, hi_key: str, lo_key: str, last_step: int) -> pd.DataFrame:
    hi, lo = _new_rows(scalars, hi_key, last_step), _new_rows(scalars, lo_key, last_step)
    both = hi.merge(lo[["step", "value"]], on="step", suffixes=("", "_lo"))
    return both.assign(value=both["value"] - both["value_lo"])


def extend_patch(plan: list[dict], scalars: pd.DataFrame | dict, *, last_step: int,
                 smoothing: float, x_axis: str, hist: pd.DataFrame | None = None
                 ) -> tuple[Patch | None, list[dict]]:
    """A Patch appending rows with step > last_step to the planned traces, and the plan with
    its EMA states advanced. (None, plan) when nothing new touches this figure. Alerts are not
    patched: a new one adds shapes, so run_view.tick_run redraws."""
    patch, plan, touched = Patch(), copy.deepcopy(plan), False
    scalars = scalars if isinstance(scalars, dict) else by_key(scalars)
    for entry in plan:
        i, role = entry["i"], entry["role"]
        if role in ("raw", "smooth"):
            rows = _gap_rows(scalars, *entry["gap"], last_step) if "gap" in entry \
                else _new_rows(scalars, entry["key"], last_step)
            if rows.empty:
                continue
            values = rows["value"].astype(float).to_numpy()
            if role == "smooth":
                acc, count = entry["ema"]
                values, acc, count = ema_debiased(values, smoothing, acc, int(count))
                entry["ema"] = [acc, count]
            patch["data"][i]["x"].extend(x_values(rows, x_axis))
            patch["data"][i]["y"].extend([None if np.isnan(v) else float(v) for v in values])
            touched = True
        elif role in ("heatmap", "median") and hist is not None and not hist.empty:
            new = hist[hist["step"] > last_step]
            steps, los, his, frac = histogram_matrix(new)
            if not steps:
                continue
            # map the new columns onto the drawn bins (edges are shared, ENTROPY_EDGES); a
            # drawn bin the new steps lack holds 0 (the nearest bin would count twice)
            drawn = np.asarray(entry["bins"], np.float64)
            where = {float(lo): c for c, lo in enumerate(los)}
            frac = np.column_stack([frac[:, where[b]] if b in where else np.zeros(len(steps))
                                    for b in drawn.tolist()])
            # wall-time axis: the columns' times from the entropy rows that came with them
            patch["data"][i]["x"].extend(steps_x(steps, series(scalars, "entropy/mean"), x_axis))
            if role == "heatmap":
                patch["data"][i]["z"].extend(frac.tolist())
            else:
                hi = {float(lo): h for lo, h in zip(los, his)}
                nxt = ENTROPY_EDGES[np.minimum(np.searchsorted(ENTROPY_EDGES, drawn) + 1,
                                               len(ENTROPY_EDGES) - 1)]
                labels = bin_labels(drawn.tolist(), [hi.get(b, float(n))
                                                     for b, n in zip(drawn.tolist(), nxt)])
                patch["data"][i]["y"].extend(median_labels(frac, labels))
            touched = True
    return (patch if touched else None), plan
