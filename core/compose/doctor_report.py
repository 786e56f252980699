"""`forksight doctor`'s report as terminal text, Markdown, JSON or one self-contained HTML page
(the run's charts with each finding's evidence drawn on them by the dashboard's alert layers)."""
from __future__ import annotations

import html
import json
from typing import Any

Diagnosis = Any      # forksight.compose.doctor.Diagnosis (not imported: doctor imports this module)

ICON = {"critical": "✖", "warning": "▲", "healthy": "✔"}
CHARTS = ("entropy/mean", "reward/mean")       # drawn whether or not anything fired on them


def findings(result: Diagnosis) -> list[dict]:
    """The first alert of each (detector, severity), worst first, with how often it fired."""
    first: dict[tuple[str, str], dict] = {}
    for a in result.alerts:
        key = (a["detector"], a["severity"])
        if key in first:
            first[key]["times"] += 1
        else:
            first[key] = {**a, "times": 1}
    return sorted(first.values(), key=lambda a: (a["severity"] != "critical", a["step"]))


def _span(result: Diagnosis) -> str:
    return f"steps {result.steps[0]}–{result.steps[-1]} ({len(result.steps)} logged)" if result.steps else "no steps"


def terminal(result: Diagnosis) -> str:
    out = [f"forksight doctor · {result.name} ({result.kind}, {_span(result)})",
           f"verdict: {ICON[result.verdict]} {result.verdict}", ""]
    for f in findings(result):
        again = f" (fired {f['times']}×)" if f["times"] > 1 else ""
        out += [f"{ICON[f['severity']]} {f['severity']:8} {f['detector']} at step {f['step']}{again}",
                f"    {f['message']}", f"    what to do: {f['action']}", ""]
    if not result.alerts:
        out += ["no detector fired.", ""]
    out.append(f"checked: {', '.join(result.checked) or 'nothing'}")
    if result.not_checked:
        out.append("not checked (the log lacks their signal): " +
                   "; ".join(f"{d} ({why})" for d, why in result.not_checked.items()))
    out += [f"note: {n}" for n in result.notes]
    return "\n".join(out) + "\n"


def markdown(result: Diagnosis) -> str:
    esc = lambda s: str(s).replace("|", "\\|").replace("\n", " ")   # noqa: E731 - table cells
    out = [f"# forksight doctor: {esc(result.name)}", "",
           f"**Verdict: {result.verdict}** · {result.kind} · {_span(result)}", ""]
    if result.alerts:
        out += ["| severity | detector | step | signal | value | threshold | what to do |", "|---|---|---|---|---|---|---|"]
        for f in findings(result):
            value = "" if f.get("value") is None else f"{f['value']:.4g}"
            thr = "" if f.get("threshold") is None else f"{f['threshold']:.4g}"
            out.append(f"| {f['severity']} | {f['detector']} | {f['step']} | {esc(f.get('signal') or '')} | {value} | "
                       f"{thr} | {esc(f['action'])} |")
        out.append("")
        for f in findings(result):
            out += [f"### {f['detector']} ({f['severity']}, step {f['step']})", "", esc(f["message"]), "",
                    f"Evidence: `{json.dumps(f['evidence'], sort_keys=True)}`", ""]
    else:
        out += ["No detector fired.", ""]
    out.append(f"Checked: {', '.join(result.checked) or 'nothing'}.")
    if result.not_checked:
        out.append("Not checked: " + "; ".join(f"{d} ({why})" for d, why in result.not_checked.items()) + ".")
    out += [f"Note: {esc(n)}" for n in result.notes]
    return "\n".join(out) + "\n"


def _figures(result: Diagnosis) -> list[dict]:
    """One chart per signal a finding names (and entropy, reward): the series and the findings'
    markers, thresholds, forecasts and fitted trends, as the dashboard draws them."""
    import pandas as pd

    from forksight.dashboard import alert_figures as A

    alerts = pd.DataFrame(result.alerts) if result.alerts else None
    if alerts is not None:
        alerts = alerts.assign(forecast=alerts["forecast"].astype("Int64"))
    signals = list(dict.fromkeys([*(a["signal"] for a in result.alerts if a.get("signal")), *CHARTS]))
    figures = []
    for signal in signals:
        points = [(s, r[signal]) for s, r in zip(result.steps, result.rows) if signal in r]
        if not points:
            continue
        rows = pd.DataFrame(points, columns=["step", "value"]).assign(wall_time=float("nan"))
        mine = alerts[alerts["signal"] == signal] if alerts is not None else None
        layers = A.alert_layers(mine, {signal: (rows, "x", "y")}, "step")
        data = [{"type": "scatter", "mode": "lines", "name": A.escape_markup(signal), "x": rows["step"].tolist(),
                 "y": rows["value"].tolist(), "line": {"color": "#1c7ed6"}}, *layers["data"]]
        figures.append({"data": data, "layout": {
            "title": {"text": A.escape_markup(signal)}, "height": 320, "margin": {"l": 60, "r": 20, "t": 40, "b": 40},
            "xaxis": {"title": {"text": "step"}}, "shapes": layers["shapes"],
            "annotations": layers["annotations"], "showlegend": False}})
    return figures


def html_page(result: Diagnosis) -> str:
    import plotly.graph_objects as go
    import plotly.io as pio

    e = html.escape
    charts = [pio.to_html(go.Figure(f), include_plotlyjs=(i == 0), full_html=False, div_id=f"chart-{i}")
              for i, f in enumerate(_figures(result))]
    color = {"critical": "#c92a2a", "warning": "#e67700", "healthy": "#2b8a3e"}[result.verdict]
    items = "".join(
        f'<li class="{e(f["severity"])}"><b>{e(f["severity"])} · {e(f["detector"])}</b> at step {f["step"]}'
        f'{" (fired " + str(f["times"]) + "×)" if f["times"] > 1 else ""}<p>{e(f["message"])}</p>'
        f'<p><i>What to do:</i> {e(f["action"])}</p><details><summary>evidence</summary>'
        f'<pre>{e(json.dumps(f["evidence"], indent=1, sort_keys=True))}</pre></details></li>'
        for f in findings(result)) or "<li>No detector fired.</li>"
    rows = "".join(f'<tr class="{e(f["severity"])}"><td><b>{e(f["severity"])}</b></td><td>{e(f["detector"])}</td>'
                   f'<td>step {f["step"]}</td><td>{e(f.get("signal") or "")}</td><td>{e(f["action"][:140])}</td></tr>'
                   for f in findings(result))
    missing = "".join(f"<li>{e(d)}: {e(why)}</li>" for d, why in result.not_checked.items())
    return f"""<!doctype html><html lang="en"><head><meta charset="utf-8">
<title>forksight doctor: {e(result.name)}</title><style>
body{{font-family:system-ui,sans-serif;margin:2em auto;max-width:1100px;color:#212529}}
.verdict{{font-size:1.6em;color:{color}}} li{{margin-bottom:1em}} li.critical b{{color:#c92a2a}}
li.warning b{{color:#e67700}} tr.critical b{{color:#c92a2a}} tr.warning b{{color:#e67700}}
td{{padding:.2em .6em;font-size:.9em;vertical-align:top}} pre{{background:#f1f3f5;padding:.5em;font-size:.8em;overflow:auto}}
</style></head><body><h1>forksight doctor: {e(result.name)}</h1>
<p class="verdict" id="verdict">{e(result.verdict)}</p><p>{e(result.kind)} · {e(_span(result))} · {e(result.source)}</p>
<table id="summary">{rows}</table>
<h2>Charts</h2>{''.join(charts)}<h2>Findings</h2><ul id="findings">{items}</ul>
<h2>Checked</h2><p>{e(', '.join(result.checked) or 'nothing')}</p>
<h2>Not checked (the log lacks their signal)</h2><ul>{missing or '<li>none</li>'}</ul></body></html>
"""


def render(result: Diagnosis, fmt: str) -> str:
    if fmt == "json":
        return json.dumps(result.to_json(), indent=1, allow_nan=False, default=str)
    return {"terminal": terminal, "markdown": markdown, "html": html_page}[fmt](result)
