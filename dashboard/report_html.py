"""A run as one self-contained HTML file (`forksight report`): the verdict, the run page's charts
(the same figures, drawn by run_view.draw_run), every alert with its evidence and its fix, the
completions of a few token steps coloured by entropy on the run's fixed scale, and the run's
config. plotly.js (the dashboard's own bundle) is inlined: the file opens from disk with no request
to any host.

Bounded in size: each series downsampled to `max_points` (default 500), at most `token_steps` token
steps (first, middle and last stored; default 3) of at most `completions` completions each (default
4). Model text is escaped (html.escape) everywhere it appears: a completion holding `<script>` shows it."""
from __future__ import annotations

import html
import json
import math
import time

from pathlib import Path

import pandas as pd

from forksight.base.interfaces import Reader

# the dashboard's own plotly.js bundle (the trace types its figures use: 1.5 MB, not plotly's 4.8 MB)
PLOTLY_JS = Path(__file__).resolve().parent / "assets" / "plotly-forksight.min.js"

FIGURES = (("entropy", "Entropy"), ("heatmap", "Entropy distribution"), ("passk", "Reward and pass@k"),
           ("heldout", "Held-out pass@k"), ("mismatch", "Training–inference mismatch"),
           ("probes", "Pivotal tokens"), ("trust", "Trust region"), ("signals", "Training signals"))
# the token strips' look (the report's and a notebook's)
TOKEN_CSS = (".tok{font-family:ui-monospace,monospace;white-space:pre;padding:1px 0;color:#212529}"
             ".fork{outline:2px solid #7048e8}.completion{margin:6px 0 12px;line-height:1.9}.meta{color:#495057}")
_CSS = TOKEN_CSS + """
body{font-family:system-ui,sans-serif;margin:24px;color:#212529;max-width:1400px}
h1{margin:0 0 4px}h2{margin:28px 0 8px;font-size:18px}
.chip{display:inline-block;padding:2px 10px;border-radius:12px;color:#fff;font-weight:600}
table{border-collapse:collapse;font-size:13px}td,th{border:1px solid #dee2e6;padding:4px 8px;
vertical-align:top;text-align:left}
pre{background:#f8f9fa;padding:8px;overflow:auto;font-size:12px}
td pre{white-space:pre-wrap;word-break:break-all;max-width:360px;margin:0}td{min-width:60px}
td.what{min-width:380px}.warning{color:#e67700}
.critical{color:#c92a2a}"""


def _e(value) -> str:
    """Escaped text of any value (None: an en dash)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    return html.escape(str(value), quote=True)


def _figure_json(figure: dict) -> str:
    """A figure as JSON safe inside <script> (no "</" can close the tag early)."""
    from plotly.utils import PlotlyJSONEncoder

    return json.dumps(figure, cls=PlotlyJSONEncoder).replace("</", "<\\/")


def _alerts(alerts: pd.DataFrame) -> str:
    from forksight.dashboard.alerts_view import split_fix

    if alerts is None or alerts.empty:
        return "<p>No alert fired.</p>"
    rows = []
    for a in alerts.sort_values(["step", "wall_time"]).to_dict("records"):
        body, fix = split_fix(a.get("message"), a.get("action"))
        evidence = a.get("evidence")
        rows.append(f"<tr><td>{_e(a.get('step'))}</td><td class='{_e(a.get('severity'))}'>{_e(a.get('severity'))}"
                    f"</td><td>{_e(a.get('detector'))}</td><td class='what'>{_e(body)}</td><td>{_e(fix)}</td>"
                    f"<td><pre>{_e(evidence) if evidence else '–'}</pre></td></tr>")
    return ("<table id='alerts'><tr><th>step</th><th>severity</th><th>detector</th><th>what was seen</th>"
            "<th>fix</th><th>evidence</th></tr>" + "".join(rows) + "</table>")


def _picked_steps(steps: list[int], n: int) -> list[int]:
    """First, middle and last (n of them, evenly spread) of the stored token steps."""
    if len(steps) <= n:
        return steps
    return sorted({steps[round(i * (len(steps) - 1) / max(1, n - 1))] for i in range(n)})


def _tokens(reader: Reader, run_id: str, token_steps: int, completions: int) -> str:
    return completions_html(reader, run_id, _picked_steps(reader.token_steps(run_id), token_steps), completions)


def completions_html(reader: Reader, run_id: str, steps: list[int], completions: int) -> str:
    """The completions of `steps` (at most `completions` each) token by token, coloured by entropy on
    the run's fixed scale, forks outlined, each token's numbers in its title; model text escaped.
    Styled by TOKEN_CSS (the report's <style> holds it; a notebook cell carries its own)."""
    from forksight.dashboard.pages.tokens import run_scale

    if not steps:
        return "<p>No token rows stored for this run.</p>"
    scale = run_scale(reader, run_id, "entropy")
    parts = [f"<p class='meta'>colour: entropy H, fixed for this run (0 → {scale.top:.3g} nats, {_e(scale.source)}); "
             "outlined: fork tokens</p>"]
    for step in steps:
        tokens = reader.read_tokens(run_id, step)
        samples = reader.read_samples(run_id, step=step)
        reward = dict(zip(samples["sample_id"], samples["reward"])) if len(samples) else {}
        parts.append(f"<h3>step {step}</h3>")
        for sid in sorted(tokens["sample_id"].unique())[:completions]:
            rows = tokens[tokens["sample_id"] == sid].sort_values("pos").to_dict("records")
            r = reward.get(sid)
            parts.append(completion_html(rows, scale, f"sample {int(sid)} · reward "
                                                      f"{'–' if r is None else f'{r:.3g}'}"))
    return "".join(parts)


def completion_html(rows: list[dict], scale, label: str) -> str:
    """One completion's token rows (in order) as coloured spans under a label; model text escaped."""
    from forksight.dashboard.tokens_view import token_title

    spans = []
    for row in rows:
        row = {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in row.items()}
        cls = "tok fork" if row.get("fork") else "tok"
        text = row.get("token")
        spans.append(f"<span class='{cls}' style='background:{scale.color(row.get('entropy'))}' "
                     f"title='{_e(token_title(row))}'>{_e('∅' if not text else text)}</span>")
    return f"<div class='meta'>{_e(label)}</div><div class='completion'>{''.join(spans)}</div>"


def token_view_html(columns: dict, step: int, *, completions: int = 4, scale=None) -> tuple[str, object]:
    """A step's token rows as a producer holds them (columns of equal-length lists: sample_id, pos,
    token, entropy, fork, ...) as one self-styled HTML block of `completions` completions, coloured by
    entropy on `scale` (None: one read from these rows); returns (html, the scale used), so a caller
    keeps one scale for a run (the trackers' token views)."""
    from forksight.dashboard.token_figures import token_scale

    frame = pd.DataFrame(columns)
    if frame.empty or "entropy" not in frame:
        return "", scale
    scale = scale or token_scale(frame["entropy"].dropna().astype(float), "entropy", steps=[int(step)])
    parts = [f"<style>{TOKEN_CSS}</style><p class='meta'>forksight · step {int(step)} · colour: entropy H "
             f"(0 → {scale.top:.3g} nats, {_e(scale.source)}) · outlined: fork tokens</p>"]
    for sid in sorted(frame["sample_id"].unique())[:completions]:
        rows = frame[frame["sample_id"] == sid].sort_values("pos").to_dict("records")
        parts.append(completion_html(rows, scale, f"sample {int(sid)}"))
    return "".join(parts), scale


def render_report(reader: Reader, run_id: str, *, max_points: int = 500, token_steps: int = 3,
                  completions: int = 4) -> str:
    """The run's report as one HTML document (a str); the run must exist (ValueError otherwise)."""
    from forksight.dashboard.run_view import Controls, draw_run

    run = reader.run(run_id)
    if run is None:
        raise ValueError(f"no run {run_id!r} in this store")
    out = draw_run(reader, run_id, Controls(max_points=max_points), None, "/")
    verdict = out["verdict"]
    shown = [(key, title) for key, title in FIGURES
             if key in ("entropy", "heatmap", "passk", "signals") or out.get(key)]
    divs = "".join(f"<h2>{_e(title)}</h2><div id='fig-{key}' class='figure'></div>" for key, title in shown)
    plots = "".join(f"Plotly.newPlot('fig-{key}', F['{key}'].data, F['{key}'].layout, "
                    "{displaylogo: false, responsive: true});" for key, _ in shown)
    figures = "{" + ",".join(f'"{key}": {_figure_json(out["figures"][key])}' for key, _ in shown) + "}"
    config = json.dumps(run.get("config") or {}, indent=1, sort_keys=True, default=str)
    alerts = reader.read_alerts(run_id)
    name = run.get("name") or run_id
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>forksight · {_e(name)}</title>
<style>{_CSS}</style></head><body>
<h1>{_e(name)}</h1>
<p class="meta">project {_e(run.get('project'))} · strategy {_e(run.get('strategy'))} · status {_e(run.get('status'))}
 · last step {_e(run.get('last_step'))} · report written {time.strftime('%Y-%m-%d %H:%M:%S %Z')} by forksight</p>
<p><span class="chip" id="verdict" style="background:{verdict.color}">{_e(verdict.label)}</span> {_e(verdict.why)}</p>
{divs}
<h2>Alerts</h2>{_alerts(alerts)}
<h2>Completions</h2>{_tokens(reader, run_id, token_steps, completions)}
<h2>Config</h2><pre id="config">{_e(config)}</pre>
<script>{PLOTLY_JS.read_text(encoding="utf-8")}</script>
<script>const F = {figures}; {plots}</script>
</body></html>
"""
