"""The reference page's work, as plain functions (docs/algorithms.md §15): the run's reference set at its base
and at a chosen step, position by position — one completion drawn twice on the same colour scale (H, or
ΔH from the base), the set's |ΔH| by base decile and its base-vs-now scatter, and its words (per token
string: count, fork share and H at the base and now). Model text stays in `children` (escaped)."""
from __future__ import annotations

import numpy as np
import pandas as pd
from dash import dcc, html

from forksight.base.interfaces import Reader
from forksight.dashboard.reference_figures import decile_figure, scatter_figure
from forksight.dashboard.token_figures import TokenScale, token_scale
from forksight.dashboard.tokens_view import token_spans

WORD_COLUMNS = ("token", "count", "fork_share_base", "fork_share_now", "entropy_base", "entropy_now", "dh")


def base_step(rows_at, steps: list[int]) -> int | None:
    """The step whose rows hold the set's prompts (its base; usually the first re-scored); `rows_at(step)`
    reads a step's rows."""
    for step in steps:
        if (rows_at(step)["pos"] < 0).any():
            return step
    return steps[0] if steps else None


def joined(base: pd.DataFrame, now: pd.DataFrame) -> pd.DataFrame:
    """One row per completion position: the base's and this step's H and fork flag, ΔH = H now − H base."""
    keep = ["sample_id", "pos", "token_id", "token", "entropy", "fork"]
    b = base[base["pos"] >= 0][keep]
    n = now[now["pos"] >= 0][["sample_id", "pos", "entropy", "fork", "logp"]]
    out = b.merge(n, on=["sample_id", "pos"], suffixes=("_base", "_now"), how="inner")
    for column in ("entropy_base", "entropy_now", "logp"):       # stored as FLOAT: exact float64 from here
        out[column] = out[column].astype("float64")
    out["dh"] = out["entropy_now"] - out["entropy_base"]
    return out.sort_values(["sample_id", "pos"], kind="stable").reset_index(drop=True)


def shown_word(token) -> str:
    """A token string as the words table shows it: escapes visible ('\\n'), a space as '␣'."""
    return repr(token)[1:-1].replace(" ", "␣") if isinstance(token, str) else ""


def words_table(pairs: pd.DataFrame) -> list[dict]:
    """Per token string of the set: count, fork share and mean H at the base and now, ΔH."""
    if pairs.empty:
        return []
    g = pairs.assign(token=pairs["token"].fillna("#" + pairs["token_id"].astype(str))).groupby("token")
    table = pd.DataFrame({"count": g.size(), "fork_share_base": g["fork_base"].mean(),
                          "fork_share_now": g["fork_now"].mean(), "entropy_base": g["entropy_base"].mean(),
                          "entropy_now": g["entropy_now"].mean()}).reset_index()
    table["dh"] = table["entropy_now"] - table["entropy_base"]
    table["token"] = table["token"].map(shown_word)
    rounded = table.round({c: 4 for c in WORD_COLUMNS[2:]})
    return rounded.sort_values(["count", "token"], ascending=[False, True]).to_dict("records")


def training_words(reader: Reader, run_id: str, step: int, window: int = 10) -> tuple[list[dict], str]:
    """The words of the stored training tokens (the writer's aggregate, GET /words): the run's first `window`
    token steps against the `window` steps up to `step`, per string: count now, fork share and mean H then
    and now; and a caption naming the windows."""
    n, first, _ = reader.token_step_span(run_id)
    if not n:
        return [], "no stored training tokens in this run"
    start = (first, first + window - 1)
    now = (max(first, step - window + 1), max(step, first))
    a = reader.read_words(run_id, *start, limit=500).set_index("token")
    b = reader.read_words(run_id, *now, limit=500).set_index("token")
    table = pd.DataFrame({"count": b["count"], "fork_share_base": a["fork_share"], "fork_share_now": b["fork_share"],
                          "entropy_base": a["entropy_mean"], "entropy_now": b["entropy_mean"]}).dropna(subset=["count"])
    table["dh"] = table["entropy_now"] - table["entropy_base"]
    table = table.reset_index().rename(columns={"index": "token"})
    table["token"] = table["token"].map(shown_word)
    table["count"] = table["count"].astype(int)
    rounded = table.round({c: 4 for c in WORD_COLUMNS[2:]}).astype(object).where(table.notna(), None)
    caption = (f"training tokens (the writer's per-step aggregate): 'base' = steps {start[0]}–{start[1]}, "
               f"'now' = steps {now[0]}–{now[1]}")
    return rounded.sort_values(["count", "token"], ascending=[False, True]).to_dict("records"), caption


def completion(rows: pd.DataFrame, column: str, fork: str, metric: str, scale: TokenScale,
               word: str | None) -> list:
    """One completion's spans: `column` coloured on `scale`, `fork` outlined, the picked word marked."""
    frame = pd.DataFrame({"pos": rows["pos"], "token": rows["token"], metric: rows[column], "fork": rows[fork],
                          "entropy": rows[column] if metric == "entropy" else rows["entropy_now"]})
    spans = token_spans(frame, metric, scale)
    if word is not None:
        for span, token in zip(spans, rows["token"]):
            if shown_word(token) == word:
                span.className += " hit"
    return spans


def view(reader: Reader, run_id: str, step: int | None, sample: int | None, metric: str,
         word: str | None = None, vocab_size: int | None = None) -> dict:
    """Everything the page shows for a run, a re-scored step and one completion of the set."""
    steps = reader.reference_steps(run_id)
    read: dict[int, pd.DataFrame] = {}

    def rows_at(s: int) -> pd.DataFrame:          # each step read once per view (the base, this step, the ends)
        if s not in read:
            read[s] = reader.read_reference(run_id, s)
        return read[s]

    base = base_step(rows_at, steps)
    if base is None:
        return {"steps": [], "note": "this run keeps no reference set: --reference-every N while training, or "
                                     "forksight rescore on its checkpoints"}
    later = [s for s in steps if s != base] or [base]
    step = step if step in steps else later[-1]
    base_rows = rows_at(base)
    pairs = joined(base_rows, rows_at(step))
    samples = sorted(pairs["sample_id"].unique().tolist())
    sample = sample if sample in samples else (samples[0] if samples else None)
    prompts = base_rows[base_rows["pos"] < 0].sort_values(["sample_id", "pos"])
    prompt = "".join(str(t) for t in prompts[prompts["sample_id"] == sample]["token"].fillna(""))
    h_scale = token_scale(pairs["entropy_base"].to_numpy(np.float64), "entropy", vocab_size=vocab_size,
                          steps=[base])
    last = joined(base_rows, rows_at(later[-1])) if later[-1] != step else pairs
    dh_scale = token_scale(last["dh"].to_numpy(np.float64), "dh", steps=[later[-1]])
    mine = pairs[pairs["sample_id"] == sample]
    top = completion(mine, "entropy_base", "fork_base", "entropy", h_scale, word)
    bottom = completion(mine, "entropy_now" if metric == "entropy" else "dh", "fork_now", metric,
                        h_scale if metric == "entropy" else dh_scale, word)
    first = [s for s in later if s != base][:1]
    first_pairs = joined(base_rows, rows_at(first[0])) if first and first[0] != step else None
    b, n = pairs["entropy_base"].to_numpy(np.float64), pairs["entropy_now"].to_numpy(np.float64)
    holders = pairs[pairs["token"].map(lambda t: shown_word(t) == word)] if word else pairs[:0]
    return {"steps": steps, "base": base, "step": step, "samples": samples, "sample": sample, "prompt": prompt,
            "top": top, "bottom": bottom, "scale": h_scale if metric == "entropy" else dh_scale, "h_scale": h_scale,
            "deciles": decile_figure(b, n, step, None if first_pairs is None else
                                     first_pairs["entropy_now"].to_numpy(np.float64), first[0] if first else None),
            "scatter": scatter_figure(b, n, pairs["fork_base"].fillna(False).to_numpy(bool),
                                      pairs["fork_now"].fillna(False).to_numpy(bool), pairs["token"].tolist(),
                                      step, base),
            "words": words_table(pairs), "holders": holders.groupby("sample_id").size().to_dict(), "note": None}


def holder_links(holders: dict[int, int], run_id: str, step: int, word: str, href) -> list:
    """'in completions #3 (2×), #7 (1×)': each a link to that completion with the word marked."""
    if not holders:
        return []
    from urllib.parse import urlencode

    links = [dcc.Link(f"#{s} ({n}×)", href=href("/reference?" + urlencode(
        {"run": run_id, "step": step, "sample": s, "word": word})), className="word-link")
             for s, n in sorted(holders.items())]
    return [html.Span(f"{word!s} occurs in completions "), *[x for link in links for x in (link, " ")]]
