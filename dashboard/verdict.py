"""A run's health in one word, from its alerts and its latest signals: healthy, collapsing
(forecast step N), collapsed, exploding, length hacking, stagnating, misconfigured (a KL term that
does nothing, a clip that binds on one side) or waiting, before the first step.
One pure function, `verdict`, shown by the runs table, the run page and the compare legend."""
from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from forksight.monitor.alerts.config import LengthHackingConfig, StagnationConfig

COLLAPSE, EXPLOSION, STAGNATION, NON_FINITE = ("entropy_collapse", "entropy_explosion",
                                               "stagnation", "non_finite")
RECENT_STEPS = 50     # an alert this many steps old still describes the run
# the stagnation detector warns once and not again within its cooldown (200 steps by default)
# while the reward stays flat: its warning describes the run for that long (a run whose reward
# fell away after its one stagnation warning is not healthy 50 steps later)
STAGNATION_HOLD_STEPS = max(RECENT_STEPS, StagnationConfig().cooldown)
# length hacking likewise warns once per cooldown while the length keeps being paid
LENGTH_HACKING = "length_hacking"
HACKING_HOLD_STEPS = max(RECENT_STEPS, LengthHackingConfig().cooldown)
# a setting that makes a loss term do nothing or bind on one side stays until the run is restarted
# with another: those alerts fire once and describe the run from then on
MISCONFIGURED = {"kl_inert": "the KL term is inert: the reference is the policy",
                 "clip_asymmetry": "one side of the ratio clip binds far more than the other"}
ENTROPY_KEY = "entropy/mean"
# worst first: the chip shows the worst state that holds
STATES = ("collapsed", "exploding", "hacking", "collapsing", "stagnating", "misconfigured", "healthy", "waiting")
CHIP_COLORS = {"collapsed": "#c92a2a", "exploding": "#862e9c", "hacking": "#d6336c", "collapsing": "#e67700",
               "stagnating": "#5c7cfa", "misconfigured": "#0b7285", "healthy": "#2b8a3e", "waiting": "#868e96"}


@dataclass(frozen=True)
class Verdict:
    """state: one of STATES; step: where it was decided (the alert's step), forecast: the
    predicted collapse step of a collapsing run; why: one sentence with the numbers."""

    state: str
    step: int | None = None
    forecast: int | None = None
    why: str = ""

    @property
    def label(self) -> str:
        """The chip's text: "collapsed at step 37", "collapsing (forecast step 52)", "healthy"."""
        if self.state == "collapsing" and self.forecast is not None:
            return f"collapsing (forecast step {self.forecast})"
        if self.state == "hacking" and self.step is not None:
            return f"length hacking at step {self.step}"
        if self.state in ("collapsed", "exploding", "stagnating", "misconfigured") and self.step is not None:
            return f"{self.state} at step {self.step}"
        return self.state

    @property
    def color(self) -> str:
        return CHIP_COLORS[self.state]


def _num(x) -> float | None:
    try:
        x = float(x)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


def _step(alert: Mapping) -> int:
    return int(alert.get("step") or 0)


def verdict(alerts: Iterable[Mapping], latest: Mapping[str, float], last_step: int | None
            ) -> Verdict:
    """The run's health. alerts: its alert rows (detector, severity, step, value, threshold,
    forecast); latest: its latest signals ({"entropy/mean": H, …}); last_step: its newest step
    (None before the first one).

    - collapsed: a critical entropy_collapse, unless entropy has since climbed back above that
      alert's floor (its threshold);
    - exploding: an entropy_explosion or non_finite alert within RECENT_STEPS of the last step;
    - collapsing: a collapse warning within RECENT_STEPS, or older while entropy is still at or
      below the level that raised it; its forecast step when it made one;
    - hacking: a length_hacking alert within HACKING_HOLD_STEPS (the detector's cooldown);
    - stagnating: a stagnation alert within STAGNATION_HOLD_STEPS (the detector's cooldown);
    - misconfigured: a kl_inert or clip_asymmetry alert at any earlier step;
    - healthy otherwise (waiting before the first step)."""
    if last_step is None:
        return Verdict("waiting", why="no step logged yet")
    rows = sorted((dict(a) for a in alerts), key=_step)
    h = _num(latest.get(ENTROPY_KEY))
    recent = [a for a in rows if _step(a) >= last_step - RECENT_STEPS]
    collapse = [a for a in rows if a.get("detector") == COLLAPSE]
    critical = [a for a in collapse if a.get("severity") == "critical"]
    if critical:
        floor = _num(critical[-1].get("threshold"))
        if h is None or floor is None or h <= floor:
            first = critical[0]
            return Verdict("collapsed", _step(first), why=(
                f"entropy fell below the floor {floor:.3g} nats at step {_step(first)}"
                if floor is not None else f"critical entropy collapse at step {_step(first)}"))
    blown = [a for a in recent if a.get("detector") in (EXPLOSION, NON_FINITE)]
    if blown:
        a = blown[-1]
        what = "non-finite statistics" if a.get("detector") == NON_FINITE else "entropy running away"
        return Verdict("exploding", _step(a), why=f"{what} at step {_step(a)}")
    hacked = [a for a in rows if a.get("detector") == LENGTH_HACKING and _step(a) >= last_step - HACKING_HOLD_STEPS]
    if hacked:
        return Verdict("hacking", _step(hacked[0]), why=f"the reward pays for length (step {_step(hacked[0])})")
    warnings = [a for a in collapse if a.get("severity") != "critical"]
    if warnings:
        a = warnings[-1]
        level = _num(a.get("value"))
        still_low = h is not None and level is not None and h <= level
        if _step(a) >= last_step - RECENT_STEPS or still_low:
            forecasts = [int(f) for w in warnings if (f := _num(w.get("forecast"))) is not None]
            forecast = forecasts[-1] if forecasts else None
            return Verdict("collapsing", _step(a), forecast, why=(
                f"collapse warned at step {_step(a)}"
                + (f", forecast to reach the floor at step {forecast}" if forecast else "")))
    stalled = [a for a in rows if a.get("detector") == STAGNATION
               and _step(a) >= last_step - STAGNATION_HOLD_STEPS]
    if stalled:
        return Verdict("stagnating", _step(stalled[-1]),
                       why=f"reward stopped improving (step {_step(stalled[-1])})")
    settings = [a for a in rows if a.get("detector") in MISCONFIGURED]
    if settings:
        a = settings[0]
        return Verdict("misconfigured", _step(a), why=f"{MISCONFIGURED[a['detector']]} (step {_step(a)})")
    return Verdict("healthy", why="no collapse, explosion, length hacking, stagnation or misconfiguration alert holds")


def verdicts_of_runs(alerts, latest: Mapping[str, Mapping[str, float]],
                     last_steps: Mapping[str, int | None]) -> dict[str, Verdict]:
    """verdict() for every run in last_steps; alerts: the Reader's frame of all runs' alerts."""
    by_run: dict[str, list[dict]] = {}
    if alerts is not None and len(alerts):
        for row in alerts.to_dict("records"):
            by_run.setdefault(row["run_id"], []).append(row)
    return {rid: verdict(by_run.get(rid, []), latest.get(rid, {}), step)
            for rid, step in last_steps.items()}
