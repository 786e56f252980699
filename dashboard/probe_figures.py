"""Value probes on the pages (pure): the probe rows joined to a step's token rows (the tokens
page's "value Δ" colour and hover), and the run page's pivotal-tokens panel over steps — are the
forks the pivotal tokens, and does each selection rule catch more of them than random?"""
from __future__ import annotations

import json
import math
from collections.abc import Sequence

import numpy as np
import pandas as pd

from forksight.dashboard.figures import (X_TITLES, base_layout, empty_figure, grid_axes, series, use_webgl, spec_lines, panel_notes)

PREFIX = "probe/"
# the probe columns the tokens page shows beside a token's own (tokens has fork and entropy)
PROBE_COLUMNS = ("v_before", "v_after", "delta", "se", "se_before", "se_after", "k", "pivotal",
                 "alternatives")
# the panel: (key, legend name, colour, dash); a baseline is grey and dashed
PRECISION = (("probe/fork_precision", "fork precision: probed forks that are pivotal", "#7048e8", "solid"),
             ("probe/pivot_fork_share", "pivots that are forks", "#e8590c", "solid"),
             ("probe/pivotal_frac", "baseline: probed tokens that are pivotal", "#868e96", "dash"))
RECALL = (("probe/recall/fork", "fork (top-20% H)", "#7048e8", "solid"),
          ("probe/recall/ict", "ICT (top-10% JS)", "#0b7285", "solid"),
          ("probe/recall/own", "the run's own selection", "#2b8a3e", "solid"),
          ("probe/recall/random", "baseline: random, as many as fork", "#868e96", "dash"),
          ("probe/recall/random/ict", "baseline: random, as many as ICT", "#0b7285", "dot"))
PANEL_KEYS = tuple(k for k, *_ in PRECISION + RECALL)


def has_probes(keys: Sequence[str]) -> bool:
    """Whether a run logs value-probe scalars (any probe/ key the panel draws)."""
    return any(k in PANEL_KEYS for k in keys)


def with_probes(tokens: pd.DataFrame, probes: pd.DataFrame | None) -> pd.DataFrame:
    """The token rows with the probe columns of their (rank, sample, position) beside them; a
    token nobody probed has NaN Δ (the page leaves it uncoloured), as has one inside a segment the
    bisection search did not enter (`span` > 1). A probed completion whose token
    rows were not stored (a trainer logs token rows for some samples, probes others) is shown from
    its probe rows when they cover every position (the probe's `all` sweep): they carry the token,
    its entropy and fork flag."""
    if probes is not None and "span" in probes:     # a bisection's unsearched segments colour no token
        probes = probes[probes["span"].fillna(1) == 1]
    if probes is None or probes.empty:
        return tokens.assign(**{c: np.full(len(tokens), np.nan) for c in ("delta", "v_before", "v_after")})
    on = [c for c in ("rank", "sample_id", "pos") if c in probes and (tokens.empty or c in tokens)]
    keep = probes[[*on, *[c for c in PROBE_COLUMNS if c in probes]]].drop_duplicates(on, keep="last")
    joined = tokens.drop(columns=[c for c in PROBE_COLUMNS if c in tokens]).merge(keep, on=on, how="left") \
        if not tokens.empty else tokens
    seq = [c for c in ("rank", "sample_id") if c in on]
    have = set(map(tuple, tokens[seq].drop_duplicates().to_numpy().tolist())) if not tokens.empty else set()
    alone = [rows for key, rows in probes.drop_duplicates(on, keep="last").groupby(seq)
             if (key if isinstance(key, tuple) else (key,)) not in have
             and sorted(rows["pos"]) == list(range(len(rows)))]
    if not alone:
        return joined
    extra = pd.concat(alone, ignore_index=True)
    return pd.concat([joined, extra[[c for c in extra if c in joined or c in PROBE_COLUMNS or joined.empty]]],
                     ignore_index=True)


def alternatives(text) -> list[dict]:
    """The stored alternatives (JSON text: [{token_id, token, value, k}]) as a list; [] for none
    or for text that is not such a list."""
    if not isinstance(text, str) or not text:
        return []
    try:
        items = json.loads(text)
    except ValueError:
        return []
    return [a for a in items if isinstance(a, dict)] if isinstance(items, list) else []


def _num(value, digits: int = 2) -> str:
    ok = isinstance(value, (int, float, np.integer, np.floating)) and math.isfinite(value)
    return f"{value:.{digits}f}" if ok else "–"


def _true(value) -> bool:
    """A stored flag: True, not False, None or NaN (a token nobody probed)."""
    return value is not None and not (isinstance(value, float) and math.isnan(value)) and bool(value)


def probe_lines(row: dict) -> list[str]:
    """The hover's lines on a probed token: V before and after ± SE, Δ ± SE with K, whether it is
    pivotal, and each alternative's branch value (plain text: the page sets it as a title, which
    React escapes). Nothing for a token nobody probed."""
    if not isinstance(row.get("delta"), (int, float)) or not math.isfinite(row["delta"]):
        return []
    k = row.get("k")
    k_text = f"K {int(k)}" if isinstance(k, (int, float, np.integer)) and math.isfinite(k) else "K –"
    lines = [f"V before {_num(row.get('v_before'))} ± {_num(row.get('se_before'))}   "
             f"V after {_num(row.get('v_after'))} ± {_num(row.get('se_after'))}   ({k_text} continuations each)",
             f"value Δ {row['delta']:+.3f} ± {_num(row.get('se'), 3)}"
             + ("   pivotal (|Δ| ≥ 0.2 and > 2 SE)" if _true(row.get("pivotal")) else "")]
    alts = alternatives(row.get("alternatives"))
    if alts:
        lines.append("alternatives here: " + ",  ".join(
            f"{str(a.get('token'))!r} V {_num(a.get('value'))}" + (f" (K {a['k']})" if a.get("k") else "")
            for a in alts))
    return lines


def pivotal_figure(scalars: dict[str, pd.DataFrame], *, x_axis: str = "step",
                   max_points: int | None = None, uirevision: str = "run", fork_rule: str | None = None) -> dict:
    """Two panels over the probed steps: are the forks the pivotal tokens (fork precision, the
    share of pivots that are forks, against the share of all probed tokens that are pivotal), and
    each selection rule's recall of the pivotal tokens against random picks of the same count.
    `fork_rule`: the run's (its config's), named above the first panel: it decides which tokens are forks."""
    rows = {k: series(scalars, k, max_points) for k in PANEL_KEYS}
    if all(r.empty for r in rows.values()):
        return empty_figure("no value probes in this run: forksight train --probe-every N "
                            "(or forksight probe) measures them", height=90)
    gl = use_webgl(sum(map(len, rows.values())))
    (x1, y1, xa1, ya1), (x2, y2, xa2, ya2) = grid_axes(2, 2, hgap=0.08)
    style = dict(x_axis=x_axis, gl=gl, width=lambda dash: 1.6 if dash == "dash" else 2.2,
                 mode="lines+markers", marker={"size": 5})
    data = spec_lines(rows, PRECISION, xref=x1, yref=y1, legend="legend", **style) + \
        spec_lines(rows, RECALL, xref=x2, yref=y2, legend="legend2", **style)
    # each panel: its question on top, its legend (one entry a line) below it, the plot under both
    from forksight.base.fork_rule import recorded

    rule = recorded(fork_rule).describe()
    notes = panel_notes([(f"are the forks pivotal? ({rule})", xa1), ("recall of pivotal tokens by selection rule", xa2)])
    layout = base_layout("Pivotal tokens (value probes: |Δ| ≥ 0.2 and > 2 SE)", height=420, x_axis=x_axis,
                         uirevision=uirevision, hovermode="closest", annotations=notes)
    axis = {"type": "date" if x_axis == "wall" else "linear", "title": {"text": X_TITLES[x_axis], "standoff": 2}}
    share = {"range": [-0.02, 1.02], "tickformat": ".0%", "zeroline": False}
    layout.update({"xaxis": {**xa1, **axis}, "yaxis": {**ya1, **share, "domain": [0.0, 0.62]},
                   "xaxis2": {**xa2, **axis}, "yaxis2": {**ya2, **share, "domain": [0.0, 0.62]},
                   "margin": {"l": 55, "r": 25, "t": 60, "b": 48}})
    for name, xa in (("legend", xa1), ("legend2", xa2)):
        layout[name] = {"orientation": "v", "x": xa["domain"][0], "xanchor": "left", "y": 0.97,
                        "yanchor": "top", "font": {"size": 11}, "bgcolor": "rgba(255,255,255,0)",
                        "tracegroupgap": 0}
    return {"data": data, "layout": layout}


def probe_history(parts: Sequence[pd.DataFrame]) -> pd.DataFrame:
    """(step, pos, delta) of several probed steps' one-token rows, for the position × step heatmap."""
    parts = [(p[p["span"].fillna(1) == 1] if "span" in p else p)[["step", "pos", "delta"]]
             for p in parts if p is not None and len(p)]
    return pd.concat(parts, ignore_index=True) if parts else \
        pd.DataFrame({"step": pd.Series(dtype="int64"), "pos": pd.Series(dtype="int64"),
                      "delta": pd.Series(dtype="float64")})
