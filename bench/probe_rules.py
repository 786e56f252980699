"""Which rule finds the pivotal tokens (issue 50, item 3): every candidate rule scored on the same probed
completions, with bootstrap 95% intervals over completions (the pivots cluster in them, so tokens are not
independent draws). Pure: a table of probed tokens in, figures out (bench/probes.py measures the table).

A token row has: run, step, split, sample_id, pos, entropy, js, margin (top-1 minus top-2 probability),
pivotal, and the step's entropy quantiles h_q10/h_q20/h_q30 (the threshold of the step's top 10/20/30%
of tokens by H, over the whole batch the step sampled). Two families of rules:
- as the product defines them, each at its own count: `abs:0.672` (H >= 0.672), `top:q` (H >= the step's
  top-q threshold) for q = 0.1, 0.2, 0.3;
- at one count per completion, n = max(1, round(f * T)) for f = 10/20/30% of its T tokens: the n highest
  H, the n highest JS (ICT's score), the n smallest margins, n drawn at random (ties broken at random).
Lift is precision over the base rate of the completions it reads (a random pick's expected precision at
any count), so a rule beats chance where its lift's interval excludes 1."""
from __future__ import annotations

import numpy as np
import pandas as pd

from forksight.base.constants import FORK_ENTROPY as FORK_TAU
TOP_QS = (0.1, 0.2, 0.3)
SHARES = (0.1, 0.2, 0.3)
RANKED = {"H": ("entropy", False), "JS": ("js", False), "margin": ("margin", True)}
UNIT = ["run", "step", "split", "sample_id"]      # one probed completion


def pick_columns(tokens: pd.DataFrame, seed: int = 0) -> pd.DataFrame:
    """One boolean column per rule: does the rule pick this token."""
    t = tokens.reset_index(drop=True).copy()
    rng = np.random.default_rng(seed)
    t["_tie"] = rng.random(len(t))            # breaks ties (H = 0 is common) at random, never by position
    t[f"abs:{FORK_TAU:g}"] = t.entropy >= FORK_TAU
    for q in TOP_QS:
        t[f"top:{q:g}"] = t.entropy >= t[f"h_q{round(q * 100)}"]
    length = t.groupby(UNIT).pos.transform("size")
    for share in SHARES:
        n = np.maximum(1, np.round(share * length)).astype(int)
        tag = f"{round(share * 100)}%"
        for name, (column, ascending) in RANKED.items():
            if t[column].isna().all():
                continue
            key = t[column].fillna(np.inf if ascending else -np.inf)
            order = t.assign(_key=key if ascending else -key).sort_values(UNIT + ["_key", "_tie"])
            rank = order.groupby(UNIT).cumcount()
            t[f"{name} {tag}"] = (rank.reindex(t.index) < n)
        rank = t.sort_values(UNIT + ["_tie"]).groupby(UNIT).cumcount().reindex(t.index)
        t[f"random {tag}"] = rank < n
    return t.drop(columns="_tie")


def rule_names(picked: pd.DataFrame) -> list[str]:
    fixed = [f"abs:{FORK_TAU:g}", *(f"top:{q:g}" for q in TOP_QS)]
    ranked = [f"{name} {round(s * 100)}%" for s in SHARES for name in (*RANKED, "random")]
    return [r for r in fixed + ranked if r in picked.columns]


def _interval(values: np.ndarray) -> list[float] | None:
    values = values[np.isfinite(values)]
    if not len(values):
        return None
    return [round(float(np.percentile(values, 2.5)), 4), round(float(np.percentile(values, 97.5)), 4)]


def score(picked: pd.DataFrame, *, resamples: int = 1000, seed: int = 0) -> dict:
    """Each rule's share of tokens picked, precision, recall and lift, each with a bootstrap 95% interval
    over completions (resampled whole), and the base rate; {} without a pivotal token."""
    rules = rule_names(picked)
    if picked.empty or not picked.pivotal.any():
        return {}
    piv = picked.pivotal.astype(bool)
    per = picked.assign(_tok=1, _piv=piv.astype(int),
                        **{f"_n{i}": picked[r].astype(int) for i, r in enumerate(rules)},
                        **{f"_h{i}": (picked[r] & piv).astype(int) for i, r in enumerate(rules)})
    counts = per.groupby(UNIT)[["_tok", "_piv", *(f"_n{i}" for i in range(len(rules))),
                                *(f"_h{i}" for i in range(len(rules)))]].sum()
    c = counts.to_numpy(dtype=float)            # completions x (tokens, pivots, picks..., hits...)
    rng = np.random.default_rng(seed)
    weights = rng.multinomial(len(c), np.full(len(c), 1.0 / len(c)), size=resamples).astype(float)
    boot = weights @ c                          # each resample's sums
    full = c.sum(0)
    out = {"completions": int(len(c)), "tokens": int(full[0]), "pivotal_tokens": int(full[1]),
           "base_rate": round(float(full[1] / full[0]), 5), "rules": {}}
    with np.errstate(divide="ignore", invalid="ignore"):
        for i, rule in enumerate(rules):
            n, h = 2 + i, 2 + len(rules) + i
            precision, recall = full[h] / full[n] if full[n] else np.nan, full[h] / full[1]
            base = full[1] / full[0]
            b_prec = boot[:, h] / boot[:, n]
            b_rec = boot[:, h] / boot[:, 1]
            b_lift = b_prec / (boot[:, 1] / boot[:, 0])
            b_f1 = np.where(b_prec + b_rec > 0, 2 * b_prec * b_rec / (b_prec + b_rec), 0.0)
            f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
            out["rules"][rule] = {
                "share": round(float(full[n] / full[0]), 4), "f1": None if np.isnan(f1) else round(float(f1), 4),
                "f1_ci": _interval(b_f1),
                "precision": None if np.isnan(precision) else round(float(precision), 4),
                "precision_ci": _interval(b_prec),
                "recall": round(float(recall), 4), "recall_ci": _interval(b_rec),
                "lift": None if np.isnan(precision) else round(float(precision / base), 3),
                "lift_ci": _interval(b_lift)}
    return out


def best(scored: dict, family: str = "%") -> str | None:
    """The rule of the equal-count family (`%` in its name) or the defined one (no `%`) with the
    highest lift at 20% (equal count) or highest F1 (defined rules); None without figures."""
    rules = scored.get("rules", {})
    if family == "%":
        at = {r: v for r, v in rules.items() if r.endswith("20%") and v["lift"] is not None}
        return max(at, key=lambda r: at[r]["lift"]) if at else None

    defined = {r: v for r, v in rules.items() if "%" not in r and v["f1"] is not None}
    return max(defined, key=lambda r: defined[r]["f1"]) if defined else None
