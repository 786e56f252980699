"""Alerts: detectors on synthetic series with a known answer, the hub's sinks, replay on DuckDB."""
from __future__ import annotations

import http.server
import json
import logging
import math
import threading

import numpy as np
import pandas as pd
import pytest
from pydantic import BaseModel

from forksight.monitor.alerts.hub import ALERT_COLUMNS, AlertConfig, AlertHub, AlertMonitor, load_alert_config
from forksight.monitor.alerts.detectors import DebiasedEMA, Gate, RollingOLS
from forksight.monitor.alerts.webhook import WebhookSink, validate_webhook_url


# ---------------------------------------------------------------------------- synthetic runs
def healthy_run(steps: int = 400, seed: int = 0, h0: float = 1.2, noise: float = 0.05) -> list[dict]:
    """Entropy settles 20% lower, reward climbs steadily, diversity and fork tokens stay."""
    rng = np.random.default_rng(seed)
    rows = []
    for t in range(steps):
        h = h0 * (0.8 + 0.2 * math.exp(-t / 150)) * (1 + rng.normal(0, noise))
        p1 = 0.2 + 0.6 * t / steps + rng.normal(0, 0.02)
        rows.append({"entropy/mean": h, "renyi2/mean": 0.7 * h, "reward/mean": p1, "pass@1": p1,
                     "pass@8": min(1.0, p1 + 0.3), "cov/logp_adv": rng.normal(0, 0.01),
                     "fork/frac": 0.2 * h / h0, "groups/zero_var_frac": 0.1 + rng.normal(0, 0.02),
                     "length/mean": 40 + rng.normal(0, 2), "loss": rng.normal()})
    return rows


def collapsing_run(steps: int, tau: float, onset: int = 30, seed: int = 0, noise: float = 0.05,
                   h0: float = 1.2) -> list[dict]:
    """Flat entropy until `onset`, then H0·exp(-(t - onset)/tau) with multiplicative noise."""
    rng = np.random.default_rng(seed)
    rows = []
    for t in range(steps):
        clean = h0 * math.exp(-max(0, t - onset) / tau)
        rows.append({"entropy/mean": clean * (1 + rng.normal(0, noise)),
                     "reward/mean": 0.8 - 0.5 * math.exp(clean - h0) + rng.normal(0, 0.02)})
    return rows


def observe_all(rows: list[dict], config: AlertConfig | None = None, vocab_size: int | None = None):
    monitor = AlertMonitor(config, vocab_size)
    return [a for step, row in enumerate(rows) for a in monitor.observe(step, row)]


def smoothed(values, beta: float = 0.9) -> np.ndarray:
    """Debiased EMA the other way: pandas' adjusted EWM is the normalised weighted average."""
    return pd.Series(values, dtype="float64").ewm(alpha=1 - beta, adjust=True).mean().to_numpy()


# ---------------------------------------------------------------------------- building blocks
def test_debiased_ema_equals_normalised_weighted_average():
    x = np.random.default_rng(1).normal(2.0, 1.0, 200)
    ema = DebiasedEMA(0.9)
    ours = [ema.update(v) for v in x]
    np.testing.assert_allclose(ours, smoothed(x), rtol=1e-12)


def test_rolling_ols_matches_polyfit_on_the_last_window_over_a_long_run():
    rng = np.random.default_rng(2)
    xs = np.arange(5000, 7000, dtype=float)          # large x: the running sums must stay exact
    ys = 0.3 - 0.002 * xs + rng.normal(0, 0.5, xs.size)
    ols = RollingOLS(25)
    for i, (x, y) in enumerate(zip(xs, ys)):
        ols.add(x, y)
        if i in (2, 24, 25, 777, 1999):
            lo = max(0, i - 24)
            wx, wy = xs[lo:i + 1], ys[lo:i + 1]
            slope, intercept = np.polyfit(wx, wy, 1)
            r2 = np.corrcoef(wx, wy)[0, 1] ** 2
            got_slope, got_fitted, got_r2 = ols.fit()
            assert got_slope == pytest.approx(slope, rel=1e-7, abs=1e-10)
            assert got_fitted == pytest.approx(intercept + slope * x, rel=1e-7)
            assert got_r2 == pytest.approx(r2, rel=1e-6)
            assert ols.mean_y == pytest.approx(wy.mean()) and ols.var_y == pytest.approx(wy.var(ddof=1))


def test_gate_fires_once_per_episode_with_persist_cooldown_and_hysteresis():
    gate = Gate(cooldown=10, persist=2)
    # step: (active, cleared) -> fired?   worked by hand from the rule in Gate's docstring
    script = [(0, True, False, False), (1, True, False, True),    # second consecutive step fires
              (2, True, False, False), (3, False, False, False),  # dead band: not cleared, stays latched
              (4, True, False, False), (5, True, False, False),
              (6, False, True, False),                            # cleared: re-armed
              (7, True, False, False), (8, True, False, False),   # persisted, but cooldown (fired at 1)
              (11, True, False, True),                            # 11 - 1 >= 10: fires
              (12, True, False, False)]
    for step, active, cleared, fired in script:
        assert gate.update(step, active, cleared) is fired, step


# ---------------------------------------------------------------------------- detectors
@pytest.mark.parametrize("tau,noise,seed", [(20, 0.05, 0), (60, 0.1, 1), (12, 0.1, 2)])
def test_collapse_forecast_warns_at_least_20_steps_before_ground_truth(tau, noise, seed):
    rows = collapsing_run(400, tau, noise=noise, seed=seed)
    h = np.array([r["entropy/mean"] for r in rows])
    smooth, initial = smoothed(h), h[:10].mean()
    truth = int(np.argmax(smooth < 0.1 * initial))          # first step below 10% of the start
    alerts = [a for a in observe_all(rows) if a.detector == "entropy_collapse"]
    first = alerts[0]
    assert first.severity == "warning" and first.forecast is not None
    assert first.step <= truth - 20, (first.step, truth)
    # the forecast is nearer the truth than the warning is early
    assert abs(first.forecast - truth) < truth - first.step
    # critical when smoothed entropy has been below the floor for `persist` steps
    persist = AlertConfig().collapse.persist
    below = smooth < max(0.05, 0.1 * initial)
    crit_step = next(t for t in range(persist - 1, len(h)) if below[t - persist + 1:t + 1].all())
    critical = [a for a in alerts if a.severity == "critical"]
    assert [a.step for a in critical] == [crit_step]
    assert critical[0].value == pytest.approx(smooth[crit_step]) and critical[0].value < critical[0].threshold
    assert len(alerts) == 2                                  # no repeats while it stays collapsed
    assert "clip-high" in first.action and "fork" in first.action


def test_collapse_message_carries_the_reward_ceiling_of_the_fitted_law():
    rows = collapsing_run(300, 20, noise=0.01, seed=3)
    first = next(a for a in observe_all(rows) if a.detector == "entropy_collapse")
    # R = 0.8 - 0.5·exp(H - H0) = -(0.5·e^-H0)·e^H + 0.8: ceiling b - a = 0.8 - 0.5·e^-1.2
    ceiling = 0.8 - 0.5 * math.exp(-1.2)
    got = float(first.message.split("caps the reward near ")[1].split(" ")[0])
    assert got == pytest.approx(ceiling, abs=0.05)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_healthy_noisy_run_raises_no_alert(seed):
    assert observe_all(healthy_run(500, seed=seed, noise=0.1)) == []


def test_entropy_explosion_is_critical_when_reward_falls():
    rng = np.random.default_rng(4)
    rows = []
    for t in range(200):
        h = 1.0 if t < 60 else 1.0 + 0.02 * (t - 60)                 # climbs from step 60
        reward = 0.6 if t < 100 else 0.6 - 0.004 * (t - 100)          # and then reward falls
        rows.append({"entropy/mean": h + rng.normal(0, 0.02), "renyi2/mean": 0.6 * h, "reward/mean": reward})
    alerts = [a for a in observe_all(rows) if a.detector == "entropy_explosion"]
    assert [a.severity for a in alerts] == ["warning", "critical"]
    h = np.array([r["entropy/mean"] for r in rows])
    ceiling = max(h[:10].mean() * 1.5, h[:10].mean() + 0.3)
    assert alerts[0].threshold == pytest.approx(ceiling)
    assert alerts[0].value > ceiling and smoothed(h)[alerts[0].step] == pytest.approx(alerts[0].value)
    assert "reward fell" in alerts[1].message and alerts[1].step > 100


def test_explosion_ceiling_is_a_fraction_of_log_vocab_when_that_is_lower():
    rows = [{"entropy/mean": 2.0 + 0.02 * max(0, t - 30)} for t in range(150)]
    alerts = [a for a in observe_all(rows, vocab_size=100) if a.detector == "entropy_explosion"]
    ceiling = 0.6 * math.log(100)                  # 2.76 nats, below the baseline rule's 2.0 * 1.5 = 3.0
    assert alerts[0].threshold == pytest.approx(ceiling)
    h = smoothed(np.array([r["entropy/mean"] for r in rows]))
    assert alerts[0].value > ceiling and h[alerts[0].step] == pytest.approx(alerts[0].value)
    # the log |V| ceiling is what fired: the smoothed curve had not reached the baseline's 3.0 yet
    assert h[alerts[0].step] < 3.0


def test_plateau_raises_stagnation_with_the_fitted_gain():
    rng = np.random.default_rng(5)
    reward = 0.4 + rng.normal(0, 0.03, 260)
    rows = [{"reward/mean": r, "pass@1": r} for r in reward]
    alerts = observe_all(rows)
    assert [a.detector for a in alerts] == ["stagnation"]   # cooldown 200: one alert in 260 steps
    step = alerts[0].step
    assert step == 99                                        # first step with a full 100-step window
    gain = np.polyfit(np.arange(step - 99, step + 1), reward[step - 99:step + 1], 1)[0] * 99
    assert alerts[0].value == pytest.approx(gain, rel=1e-6)
    # the same plateau above the pass@1 target is success, not stagnation
    assert observe_all([{"reward/mean": r, "pass@1": 0.97} for r in reward]) == []


def test_lost_diversity_warns_then_goes_critical():
    rows = []
    for t in range(300):
        gap = 0.3 * math.exp(-max(0, t - 20) / 40)
        rows.append({"pass@1": 0.5, "pass@4": 0.5 + gap, "pass@8": 0.5 + gap,
                     "groups/zero_var_frac": min(0.95, 0.1 + 0.006 * max(0, t - 20))})
    alerts = [a for a in observe_all(rows) if a.detector == "lost_diversity"]
    assert [a.severity for a in alerts] == ["warning", "critical"]
    gaps = smoothed([r["pass@8"] - r["pass@1"] for r in rows])
    zero_var = smoothed([r["groups/zero_var_frac"] for r in rows])
    gap_thr = max(0.02, 0.25 * 0.3)
    zv_thr = max(0.6, np.mean([r["groups/zero_var_frac"] for r in rows[:10]]) + 0.25)
    first_gap = int(np.argmax(gaps < gap_thr))
    first_zv = int(np.argmax(zero_var > zv_thr))
    assert alerts[0].step == min(first_gap, first_zv)
    assert alerts[1].step == max(first_gap, first_zv)
    assert "pass@8 − pass@1" in alerts[1].message


def test_covariance_early_warning_needs_sustained_positive_covariance_and_falling_entropy():
    rng = np.random.default_rng(6)
    falling = [{"cov/logp_adv": 0.01 + rng.normal(0, 0.005), "entropy/mean": 1.2 * math.exp(-t / 60)}
               for t in range(120)]
    alerts = [a for a in observe_all(falling) if a.detector == "covariance"]
    assert len(alerts) == 1 and alerts[0].severity == "warning"
    cfg = AlertConfig().covariance
    step = alerts[0].step
    window = np.array([r["cov/logp_adv"] for r in falling[step - cfg.window + 1:step + 1]])
    assert alerts[0].value == pytest.approx(window.mean())
    # it waited for entropy to be min_entropy_drop below baseline, then `persist` steps
    h = np.array([r["entropy/mean"] for r in falling])
    first_drop = int(np.argmax(smoothed(h) <= (1 - cfg.min_entropy_drop) * h[:10].mean()))
    assert step == first_drop + cfg.persist - 1
    flat = [{**r, "entropy/mean": 1.2} for r in falling]      # same covariance, entropy not falling
    assert [a for a in observe_all(flat) if a.detector == "covariance"] == []


def test_fork_starvation_fires_once_while_it_hovers_and_again_after_a_real_recovery():
    fracs = [0.2] * 20 + [0.049, 0.051] * 40 + [0.1] * 20 + [0.03] * 30   # hover at the floor, recover, fall
    alerts = [a for a in observe_all([{"fork/frac": f} for f in fracs], load_alert_config(
        overrides=["fork.smoothing=0", "fork.cooldown=30"])) if a.detector == "fork_starvation"]
    assert [(a.step, a.severity) for a in alerts] == [(20, "warning"), (120, "warning")]
    assert alerts[1].value == pytest.approx(0.03)


def test_non_finite_statistic_is_critical_once_and_does_not_poison_other_detectors():
    rows = healthy_run(120, seed=7)
    for t in (50, 51, 52):
        rows[t]["loss"] = float("nan")
    rows[90]["loss"] = float("inf")                            # finite again in between: alerts again
    alerts = observe_all(rows)
    assert [(a.detector, a.step, a.severity) for a in alerts] == [("non_finite", 50, "critical"),
                                                                    ("non_finite", 90, "critical")]
    assert "loss=nan" in alerts[0].message and "loss=inf" in alerts[1].message
    # a NaN entropy is skipped, not averaged in: the smoothed entropy matches the finite series
    monitor = AlertMonitor()
    values = [1.0, 1.1, float("nan"), 0.9]
    for step, v in enumerate(values):
        monitor.observe(step, {"entropy/mean": v})
    collapse = next(d for d in monitor._detectors if d.name == "entropy_collapse")
    assert collapse.ema.value == pytest.approx(smoothed([1.0, 1.1, 0.9])[-1])


def test_monitor_ignores_repeated_steps_and_non_numeric_values():
    monitor = AlertMonitor()
    assert monitor.observe(5, {"entropy/mean": 1.0, "note": "text", "none": None}) == []
    assert monitor.observe(5, {"entropy/mean": 0.0}) == [] and monitor.seen == 1
    assert monitor.observe(4, {"entropy/mean": 0.0}) == [] and monitor.seen == 1


# ---------------------------------------------------------------------------- config
def _all_fields(model: type[BaseModel], prefix=""):
    for name, field in model.model_fields.items():
        yield prefix + name, field
        if isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel):
            yield from _all_fields(field.annotation, prefix + name + ".")


def test_every_config_field_is_described():
    missing = [name for name, field in _all_fields(AlertConfig) if not field.description]
    assert missing == []


def test_config_overrides_and_files_with_clear_errors(tmp_path):
    cfg = load_alert_config(overrides=["collapse.floor=0.2", "stagnation.enabled=false"])
    assert cfg.collapse.floor == 0.2 and cfg.stagnation.enabled is False
    path = tmp_path / "alerts.yaml"
    path.write_text("collapse:\n  forecast_horizon: 40\n")
    assert load_alert_config(path, ["collapse.floor=0.1"]).collapse.forecast_horizon == 40
    with pytest.raises(ValueError, match="collapse.flor"):
        load_alert_config(overrides=["collapse.flor=0.1"])
    with pytest.raises(ValueError, match="section.field=value"):
        load_alert_config(overrides=["floor=0.1"])
    with pytest.raises(ValueError, match="smoothing"):
        load_alert_config(overrides=["fork.smoothing=1.5"])


# ---------------------------------------------------------------------------- hub and webhook
class _Receiver(http.server.BaseHTTPRequestHandler):
    bodies: list = []
    statuses: list = []          # status to answer per request, then 200
    gate: threading.Event | None = None

    def do_POST(self):  # noqa: N802 - http.server's name
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.gate is not None:
            self.gate.wait(10)
        type(self).bodies.append(body)
        status = type(self).statuses.pop(0) if type(self).statuses else 200
        self.send_response(status)
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture()
def receiver():
    handler = type("Receiver", (_Receiver,), {"bodies": [], "statuses": [], "gate": None})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield handler, f"http://127.0.0.1:{server.server_address[1]}/hook/secret"
    if handler.gate is not None:
        handler.gate.set()
    server.shutdown()
    server.server_close()


def test_hub_rows_log_and_webhook_reach_a_real_http_server(receiver, caplog):
    handler, url = receiver
    hub = AlertHub(webhook_url=url)
    rows = collapsing_run(120, 20, seed=8)   # < 100 steps of plateau: no stagnation
    with caplog.at_level(logging.WARNING, logger="forksight.alerts"):
        out = [r for step, s in enumerate(rows) for r in hub.on_step("run-a", step, s)]
        hub.on_step("run-b", 0, rows[110])                        # a second run has its own state
    hub.close()
    assert len(out) == 2 and all(set(r) == set(ALERT_COLUMNS) and r["run_id"] == "run-a" for r in out)
    assert [r["detector"] for r in out] == ["entropy_collapse"] * 2
    assert len(caplog.records) == 2 and out[0]["message"] in caplog.records[0].getMessage()
    assert caplog.records[1].levelno == logging.CRITICAL
    assert [b["alert"] for b in handler.bodies] == [json.loads(json.dumps(r)) for r in out]
    text = handler.bodies[0]["text"]
    assert "entropy_collapse" in text and "run-a" in text and str(out[0]["step"]) in text
    assert hub.webhook.sent == 2 and hub.webhook.failed == 0


def test_webhook_retries_server_errors_then_delivers(receiver):
    handler, url = receiver
    handler.statuses = [503, 500]
    sink = WebhookSink(url, backoff=0.01)
    sink.post({"run_id": "r", "step": 3, "detector": "stagnation", "severity": "warning",
               "message": "m", "action": "a", "value": float("nan")})
    sink.close()
    assert len(handler.bodies) == 3 and sink.sent == 1
    assert handler.bodies[-1]["alert"]["value"] is None      # NaN is not JSON: sent as null


def test_webhook_never_blocks_on_step_and_drops_when_its_queue_is_full(receiver):
    handler, url = receiver
    handler.gate = threading.Event()                           # the receiver hangs until released
    sink = WebhookSink(url, max_queue=2)
    row = {"run_id": "r", "step": 1, "detector": "d", "severity": "warning", "message": "m", "action": "a"}
    accepted = [sink.post(row) for _ in range(6)]              # returns at once although nothing answers
    assert handler.bodies == []
    assert accepted.count(False) == sink.dropped >= 3          # one in flight, two queued, rest dropped
    handler.gate.set()
    sink.close()
    assert len(handler.bodies) == accepted.count(True) == sink.sent


def test_hub_reads_config_and_webhook_from_the_environment(receiver, tmp_path, monkeypatch):
    handler, url = receiver
    path = tmp_path / "alerts.json"
    path.write_text(json.dumps({"fork": {"floor": 0.5, "max_baseline_fraction": 1.0, "smoothing": 0}}))
    monkeypatch.setenv("FORKSIGHT_ALERTS_CONFIG", str(path))
    monkeypatch.setenv("FORKSIGHT_WEBHOOK_URL", url)
    hub = AlertHub()                                           # what the collector's store builds
    fracs = [0.6] * 10 + [0.4] * 2                             # 0.4 < the configured floor 0.5
    rows = [r for step, f in enumerate(fracs) for r in hub.on_step("env", step, {"fork/frac": f})]
    hub.close()
    assert hub.config.fork.floor == 0.5
    assert [(r["detector"], r["step"], r["threshold"]) for r in rows] == [("fork_starvation", 10, 0.5)]
    assert [b["alert"]["step"] for b in handler.bodies] == [10]


@pytest.mark.parametrize("url,fragment", [("ftp://example.com/x", "http:// or https://"),
                                          ("hooks.slack.com/services/x", "http:// or https://"),
                                          ("http://", "no host"), ("", "empty")])
def test_invalid_webhook_url_is_refused_with_a_clear_error(url, fragment):
    with pytest.raises(ValueError, match=fragment):
        validate_webhook_url(url)
    with pytest.raises(ValueError, match=fragment):
        AlertHub(webhook_url=url or " ")


# ---------------------------------------------------------------------------- replay CLI
def _stored_run(path, rows, *, hub=True) -> str:
    from forksight.monitor.collector.ingest import Ingest
    from forksight.base.records import Records, scalars_table
    from forksight.monitor.collector.store import Store

    with Store(str(path)) as store:
        ingest = Ingest(store, alerts=hub)
        run_id = store.create_run("collapse-run")
        for step, row in enumerate(rows):
            table = scalars_table([{"step": step, "key": k, "value": v} for k, v in row.items()])
            ingest.write(run_id, Records(scalars=table), batch_id=f"b{step}")
        store.flush()
    return run_id


def _count_alerts(path) -> int:
    import duckdb

    with duckdb.connect(str(path), read_only=True) as con:
        return con.execute("SELECT count(*) FROM alerts").fetchone()[0]


def test_replay_reproduces_the_live_hub_and_writes_only_when_asked(tmp_path, capsys):
    from forksight.compose.cli import main

    db = tmp_path / "runs.duckdb"
    rows = collapsing_run(95, 15, seed=9)
    run_id = _stored_run(db, rows)                             # live ingest: the store's hub stores alerts
    import duckdb

    with duckdb.connect(str(db), read_only=True) as con:
        live = con.execute("SELECT step, detector, severity, forecast FROM alerts ORDER BY step").fetchall()
    assert [d for _, d, _, _ in live] == ["entropy_collapse"] * 2

    assert main(["alerts", "replay", "--db", str(db), "--run", run_id, "--format", "json"]) == 0
    replayed = json.loads(capsys.readouterr().out)
    assert [(r["step"], r["detector"], r["severity"], r["forecast"]) for r in replayed] == [tuple(x) for x in live]
    direct = observe_all(rows)
    assert [r["message"] for r in replayed] == [a.message for a in direct]

    # other settings: a later-firing horizon and no critical floor; still nothing written
    assert main(["alerts", "replay", "--db", str(db), "--run", run_id, "--set", "collapse.forecast=false",
                 "--set", "collapse.floor=0.0", "--set", "collapse.drop_fraction=0.99"]) == 0
    table = capsys.readouterr().out
    assert "forecast" in table.splitlines()[0] and "Entropy falling fast" in table
    assert _count_alerts(db) == len(live)

    assert main(["alerts", "replay", "--db", str(db), "--run", run_id, "--set", "collapse.enabled=false",
                 "--write"]) == 0
    assert "no alerts" in capsys.readouterr().out and _count_alerts(db) == 0


def test_replay_errors_name_the_problem(tmp_path, capsys):
    from forksight.compose.cli import main

    db = tmp_path / "runs.duckdb"
    run_id = _stored_run(db, collapsing_run(5, 15), hub=False)
    assert main(["alerts", "replay", "--db", str(db), "--run", "nope"]) == 2
    assert f"no run 'nope'" in capsys.readouterr().err and run_id
    assert main(["alerts", "replay", "--db", str(db), "--run", run_id, "--set", "collapse.bogus=1"]) == 2
    assert "collapse.bogus" in capsys.readouterr().err
    assert main(["alerts", "replay", "--db", str(tmp_path / "missing.duckdb"), "--run", run_id]) == 2
    assert "no DuckDB file" in capsys.readouterr().err
