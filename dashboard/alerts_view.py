"""Alerts as page pieces: one row per alert with links to the run and tokens pages at its step
(the alerts view), and a run's full alert list with the first collapse forecast pinned (the run
page). Text children only: Dash escapes them."""
from __future__ import annotations

from urllib.parse import quote

import pandas as pd
from dash import dcc, html

from forksight.base.interfaces import Reader
from forksight.dashboard.verdict import COLLAPSE, Verdict

SHOWN = 3          # alerts shown before "show all N"
_FIX = " Fix: "


def split_fix(message: str | None, action: str | None) -> tuple[str, str]:
    """(what was seen, the one fix): the detector's own "Fix: …" from the message, else the
    stored action; the banner shows one fix line, not a fix and a near-duplicate recommendation."""
    message = message or ""
    if _FIX in message:
        body, fix = message.rsplit(_FIX, 1)
        return body.strip(), fix.strip()
    return message.strip(), (action or "").strip()


def step_link(page: str, run_id: str, step: int, prefix: str = "/") -> str:
    """/run?run=…&step=N or /tokens?run=…&step=N under the app's url prefix."""
    return f"{prefix}{page}?run={quote(str(run_id), safe='')}&step={int(step)}"


def alert_rows(alerts: pd.DataFrame, prefix: str = "/") -> list[dict]:
    """Plain rows for the alerts view: run, step, severity, detector, message, fix, links."""
    out = []
    for a in alerts.to_dict("records"):
        body, fix = split_fix(a.get("message"), a.get("action"))
        step = int(a["step"])
        out.append({"run_id": a["run_id"], "run": a.get("run_name") or a["run_id"],
                    "step": step, "severity": a.get("severity") or "warning",
                    "detector": a.get("detector") or "", "message": body, "fix": fix,
                    "forecast": None if pd.isna(a.get("forecast")) else int(a["forecast"]),
                    "run_link": step_link("run", a["run_id"], step, prefix),
                    "tokens_link": step_link("tokens", a["run_id"], step, prefix)})
    return out


def alert_card(a: dict, run_id: str, prefix: str = "/", pinned: str = "") -> html.Div:
    """One alert: severity, detector, step (links to the step), what was seen, one Fix line."""
    sev = a.get("severity") or "warning"
    body, fix = split_fix(a.get("message"), a.get("action"))
    step = int(a["step"])
    return html.Div(className=f"alert alert-{sev}", children=[
        html.Strong(f"{pinned}{sev.upper()} · {a.get('detector')} · "),
        dcc.Link(f"step {step}", href=step_link("run", run_id, step, prefix),
                 className="alert-step"),
        html.Span(": "), html.Span(body),
        html.Div(className="alert-action", children=[
            html.Strong("Fix: "), fix,
            dcc.Link(" · tokens at this step", href=step_link("tokens", run_id, step, prefix),
                     className="alert-tokens")]) if fix else None,
    ])


def first_forecast(alerts: pd.DataFrame) -> dict | None:
    """The earliest collapse warning that forecast a step: the alert that made the point."""
    if alerts is None or alerts.empty or "forecast" not in alerts:
        return None
    hits = alerts[(alerts["detector"] == COLLAPSE) & alerts["forecast"].notna()]
    return None if hits.empty else hits.sort_values("step").iloc[0].to_dict()


def alert_list(alerts: pd.DataFrame | None, run_id: str, prefix: str = "/") -> list:
    """Every alert of the run: the first collapse forecast pinned, the newest SHOWN (critical
    first), the rest behind "show all N", and a link to the alerts view."""
    if alerts is None or alerts.empty:
        return []
    pin = first_forecast(alerts)
    order = [c for c in ("step", "wall_time") if c in alerts]
    rest = alerts.sort_values(order, ascending=False, kind="stable")
    if pin is not None:
        rest = rest[~((rest["step"] == pin["step"]) & (rest["detector"] == pin["detector"])
                      & (rest["severity"] == pin["severity"]))]
    rest = rest.assign(rank=rest["severity"].map({"critical": 0}).fillna(1))
    top = rest.head(20).sort_values(["rank", "step"], ascending=[True, False]).head(SHOWN)
    more = rest.drop(index=top.index).sort_values("step", ascending=False)
    items = [alert_card(pin, run_id, prefix, pinned="FIRST FORECAST · ")] if pin else []
    items += [alert_card(a, run_id, prefix) for a in top.to_dict("records")]
    if len(more):
        items.append(html.Details(className="alert-more", children=[
            html.Summary(f"show all {len(alerts)} alerts ({len(more)} more)"),
            *[alert_card(a, run_id, prefix) for a in more.to_dict("records")]]))
    items.append(dcc.Link("open in the alerts view →",
                          href=f"{prefix}alerts?run={quote(str(run_id), safe='')}",
                          className="alert-view-link"))
    return items


def verdict_chip(v: Verdict, **kw) -> html.Span:
    """The run's health as a coloured chip; its title says why."""
    return html.Span(v.label, title=v.why, className=f"chip chip-{v.state}",
                     style={"backgroundColor": v.color}, **kw)


def read_verdicts(reader: Reader, run_ids=None) -> dict[str, Verdict]:
    """Every run's (or run_ids') verdict from its alerts and latest entropy (three queries)."""
    from forksight.dashboard.verdict import ENTROPY_KEY, verdicts_of_runs

    runs = reader.list_runs()          # one query (a run() per id: 20 ms each)
    if run_ids is not None:            # only their entropy: every run's took 28 s at 10,000 runs
        run_ids = list(dict.fromkeys(run_ids))
        runs = runs[runs["run_id"].isin(run_ids)]
    runs = runs.to_dict("records")
    last = reader.read_scalars_of_runs([ENTROPY_KEY], downsample=2, run_ids=run_ids)
    latest = {rid: {ENTROPY_KEY: float(rows["value"].iloc[-1])}
              for rid, rows in last.groupby("run_id")} if not last.empty else {}
    steps = {r["run_id"]: None if pd.isna(r["last_step"]) else int(r["last_step"]) for r in runs}
    return verdicts_of_runs(reader.read_alerts(), latest, steps)
