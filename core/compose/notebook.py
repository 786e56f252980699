"""A run in a notebook (Jupyter, VS Code): `forksight.show(run, db=|url=)` — the run page's figures,
drawn by the page's own code (run_view.draw_run) as plotly figures that display inline;
`forksight.show_tokens(run, step)` — that step's completions token by token on the run's fixed
entropy scale (the report's renderer, model text escaped) and the position × step heatmap the tokens
page draws; `forksight.load(run)` — the run's scalars, token rows, samples and alerts as pandas
DataFrames (`.arrow()`: pyarrow Tables) for one's own analysis.

`db=` reads a DuckDB file no collector holds; `url=` (and `token=`) a running collector's read API,
so a run can be looked at while it trains. Reads are bounded: at most `max_points` points per series,
token rows of `token_steps` steps (spread over the run, or the steps named)."""
from __future__ import annotations

import os
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Iterator, Sequence

import pandas as pd


@contextmanager
def open_reader(db: str | None = None, url: str | None = None, token: str | None = None) -> Iterator:
    """The Reader of a DuckDB file (`db`) or of a running collector (`url`), closed after."""
    if (db is None) == (url is None):
        raise ValueError("give db= (a DuckDB file) or url= (a running collector, e.g. http://127.0.0.1:8050), "
                         "one of the two")
    if url is not None:
        from forksight.compose.http_reader import HttpReader

        with HttpReader(url, token) as reader:
            yield reader
        return
    if not os.path.exists(db):
        raise FileNotFoundError(f"no DuckDB file at {db}: pass the file a run was stored in (forksight train "
                                "--db, attach(db=...)) or url= of the collector serving it")
    from forksight.monitor.collector.store import Store

    with Store(str(db), verify=False) as store:
        yield store.reader


def _known(reader, run: str) -> dict:
    found = reader.run(run)
    if found is None:
        runs = reader.list_runs()
        names = ", ".join(map(str, runs["run_id"].head(10))) if len(runs) else "none"
        raise KeyError(f"no run {run!r} there; runs: {names}")
    return found


class Figures(dict):
    """Figure name -> plotly Figure; displayed in a notebook as the verdict and each figure in turn."""

    verdict: str = ""

    def _ipython_display_(self) -> None:
        from IPython.display import HTML, display

        display(HTML(f"<p><b>{_escape(self.verdict)}</b></p>"))
        for figure in self.values():
            display(figure)


def show(run: str, *, db: str | None = None, url: str | None = None, token: str | None = None,
         max_points: int = 500) -> Figures:
    """The run page's figures for `run` (entropy, its distribution, reward and pass@k, training
    signals, and the held-out, mismatch, pivotal-token and trust-region panels where the run logs
    them), each series at most `max_points` points."""
    import plotly.graph_objects as go

    from forksight.dashboard.report_html import FIGURES
    from forksight.dashboard.run_view import Controls, draw_run

    with open_reader(db, url, token) as reader:
        _known(reader, run)
        out = draw_run(reader, run, Controls(max_points=max_points), None, "/")
    figures = Figures((key, go.Figure(out["figures"][key])) for key, _ in FIGURES
                      if key in ("entropy", "heatmap", "passk", "signals") or out.get(key))
    verdict = out["verdict"]
    figures.verdict = f"{verdict.label}: {verdict.why}"
    return figures


@dataclass
class TokenView:
    """One step's completions token by token (`html`) and the position × step heatmap (`figure`)."""

    run: str
    step: int
    html: str
    figure: object

    def _repr_html_(self) -> str:
        return self.html

    def _ipython_display_(self) -> None:
        from IPython.display import HTML, display

        display(HTML(self.html))
        display(self.figure)


def show_tokens(run: str, step: int | None = None, *, db: str | None = None, url: str | None = None,
                token: str | None = None, completions: int = 4, history_steps: int = 24) -> TokenView:
    """`completions` completions of token step `step` (default: the newest stored) coloured by
    entropy on the run's fixed scale, forks outlined; and mean entropy by position over (at most
    `history_steps` of) the run's token steps, on the same scale."""
    import plotly.graph_objects as go

    from forksight.dashboard.pages.tokens import run_scale
    from forksight.dashboard.report_html import TOKEN_CSS, completions_html
    from forksight.dashboard.token_figures import position_step_heatmap

    with open_reader(db, url, token) as reader:
        _known(reader, run)
        steps = reader.token_steps(run)
        if not steps:
            raise ValueError(f"run {run!r} stored no token rows (forksight keeps them for `sample` completions "
                             "per step: attach(..., sample=N))")
        if step is None:
            step = steps[-1]
        if step not in steps:
            near = min(steps, key=lambda s: abs(s - step))
            raise ValueError(f"run {run!r} has no token rows at step {step}; the nearest stored is {near} "
                             f"({len(steps)} token steps, {steps[0]}…{steps[-1]})")
        body = completions_html(reader, run, [int(step)], completions)
        picked = _spread(steps, history_steps)
        history = pd.concat([reader.read_tokens(run, s)[["step", "pos", "entropy"]] for s in picked],
                            ignore_index=True)
        figure = go.Figure(position_step_heatmap(history, run_scale(reader, run, "entropy")))
    return TokenView(run, int(step), f"<style>{TOKEN_CSS}</style>{body}", figure)


@dataclass
class RunTables:
    """A run's tables: `scalars` (key, step, value, wall_time; `.wide()` one column per key),
    `tokens` (the token rows of `token_steps`), `samples`, `alerts`, its `config`, and `reference` (its
    reference set at every re-scored step: step, sample_id, pos, token_id, token, entropy, renyi2, logp,
    fork; empty for a run without one)."""

    run: str
    config: dict
    scalars: pd.DataFrame
    tokens: pd.DataFrame
    samples: pd.DataFrame
    alerts: pd.DataFrame
    token_steps: list[int] = field(default_factory=list)
    reference: pd.DataFrame = field(default_factory=pd.DataFrame)

    def wide(self) -> pd.DataFrame:
        """The scalars as one row per step, one column per key."""
        if self.scalars.empty:
            return pd.DataFrame()
        return self.scalars.pivot_table(index="step", columns="key", values="value", aggfunc="mean")

    def arrow(self) -> dict:
        """Each table as a pyarrow Table."""
        import pyarrow as pa

        return {name: pa.Table.from_pandas(getattr(self, name), preserve_index=False)
                for name in ("scalars", "tokens", "samples", "alerts", "reference")}


def load(run: str, *, db: str | None = None, url: str | None = None, token: str | None = None,
         keys: Sequence[str] | None = None, max_points: int = 100_000,
         token_steps: int | Sequence[int] = 8) -> RunTables:
    """The run's scalars (`keys`, default every key; at most `max_points` per key, first and last
    step kept), the token rows and samples of `token_steps` steps (a number: spread over the stored
    token steps, first and last among them; or the steps themselves), and its alerts."""
    with open_reader(db, url, token) as reader:
        found = _known(reader, run)
        stored = reader.token_steps(run)
        if isinstance(token_steps, int):
            steps = _spread(stored, token_steps)
        else:
            missing = sorted(set(int(s) for s in token_steps) - set(stored))
            if missing:
                raise ValueError(f"run {run!r} has no token rows at step(s) {missing[:10]}; token steps: "
                                 f"{stored[:5]}{'…' if len(stored) > 5 else ''}")
            steps = sorted(set(int(s) for s in token_steps))
        scalars = reader.read_scalars(run, list(keys) if keys else None, downsample=max_points)
        tokens = [reader.read_tokens(run, s) for s in steps]
        samples = [reader.read_samples(run, step=s) for s in steps]
        alerts = reader.read_alerts(run)
        reference = [reader.read_reference(run, s) for s in reader.reference_steps(run)]
    return RunTables(run, found.get("config") or {}, scalars,
                     pd.concat(tokens, ignore_index=True) if tokens else pd.DataFrame(),
                     pd.concat(samples, ignore_index=True) if samples else pd.DataFrame(), alerts, steps,
                     pd.concat(reference, ignore_index=True) if reference else pd.DataFrame())


def _spread(steps: list[int], n: int) -> list[int]:
    """At most n of the steps, evenly spread, the last (and, from 2, the first) among them."""
    from forksight.dashboard.figures import downsample_indices

    if n < 1 or not steps:
        return []
    return steps[-1:] if n == 1 else [steps[i] for i in downsample_indices(len(steps), n)]


def _escape(text: str) -> str:
    import html

    return html.escape(text, quote=True)
