"""The fork rule as a setting (issue 50, item 4 in part; item 6's bad input): `abs:τ` or `top:q`,
recorded in the run's config; the stored fork flag, `fork/frac` and `fork/threshold` follow it
(checked against numpy's quantile of the same entropies, and on a real `forksight train` run: every
stored row's flag is H ≥ that step's stored threshold); fork starvation under a quantile rule
watches the threshold fall; the tokens page's legend names the rule and the step's threshold."""
from __future__ import annotations

import duckdb
import numpy as np
import pytest
import torch

from forksight.base.fork_rule import DEFAULT_FORK_RULE, ForkRule


@pytest.mark.parametrize("text, rule", [("abs:0.672", ForkRule("abs", 0.672)), ("abs:0", ForkRule("abs", 0.0)),
                                        ("top:0.2", ForkRule("top", 0.2)), (" top:0.05 ", ForkRule("top", 0.05)),
                                        (None, DEFAULT_FORK_RULE)])
def test_a_rule_parses_and_prints_back(text, rule):
    assert ForkRule.parse(text) == rule and ForkRule.parse(str(rule)) == rule


@pytest.mark.parametrize("text", ["abs:-0.1", "abs:nan", "abs:inf", "top:0", "top:1", "top:1.5", "0.672",
                                  "abs:", "top:x", "bottom:0.2", ""])
def test_a_bad_rule_is_refused_naming_both_forms(text):
    with pytest.raises(ValueError, match=r"write abs:τ .* or top:q"):
        ForkRule.parse(text)


def _stats(seed: int = 0):
    from forksight.hooks.metrics import token_stats

    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(4, 12, 50, generator=g) * torch.linspace(0.2, 4.0, 12)[None, :, None]
    mask = torch.ones(4, 12, dtype=torch.bool)
    mask[1, 9:] = False
    mask[3, 5:] = False
    tokens = torch.randint(0, 50, (4, 12), generator=g)
    return token_stats(logits, mask=mask, tokens=tokens), tokens, mask


@pytest.mark.parametrize("rule", ["top:0.2", "top:0.5", "abs:2.0"])
def test_the_reporter_flags_forks_by_the_rule_as_numpy_computes_it(tmp_path, rule):
    from forksight.compose.local import LocalSink
    from forksight.hooks.capture.report import StepReporter

    stats, tokens, mask = _stats()
    sink = LocalSink(str(tmp_path / "f.duckdb"), "rule")
    scalars = StepReporter(sink, token_groups=4, fork_rule=rule).report(1, stats, tokens, group_ids=[0, 1, 2, 3])
    sink.finish()
    h = stats.entropy[mask].double().numpy()
    parsed = ForkRule.parse(rule)
    tau = parsed.value if parsed.kind == "abs" else np.quantile(h, 1 - parsed.value)   # linear, numpy's default
    assert scalars["fork/threshold"] == pytest.approx(tau, rel=1e-5)
    assert scalars["fork/frac"] == pytest.approx(float((h >= scalars["fork/threshold"]).mean()))
    assert ("fork/quantile" in scalars) == parsed.relative
    with duckdb.connect(str(tmp_path / "f.duckdb"), read_only=True) as conn:
        rows = conn.execute("SELECT entropy, fork FROM tokens WHERE entropy IS NOT NULL").fetchall()
    assert len(rows) == mask.sum() and all(f == (e >= scalars["fork/threshold"] - 1e-6) for e, f in rows)


def test_a_trained_run_records_its_rule_and_flags_each_step_by_its_threshold(tmp_path):
    from forksight.trainer.config import load_config
    from forksight.trainer.loop import train

    db = str(tmp_path / "t.duckdb")
    train(load_config(preset="tiny-test", overrides=dict(steps=3, run="top", db=db, fork_rule="top:0.3",
                                                          token_groups=2, progress=False)))
    with duckdb.connect(db, read_only=True) as conn:
        config = conn.execute("SELECT config FROM runs WHERE run_id = 'top'").fetchone()[0]
        tau = dict(conn.execute("SELECT step, value FROM scalars WHERE run_id = 'top' AND key = 'fork/threshold'"
                                ).fetchall())
        frac = dict(conn.execute("SELECT step, value FROM scalars WHERE run_id = 'top' AND key = 'fork/frac'"
                                 ).fetchall())
        rows = conn.execute("SELECT step, entropy, fork FROM tokens WHERE run_id = 'top' AND entropy IS NOT NULL"
                            ).fetchall()
    assert '"fork_rule": "top:0.3"' in config
    assert sorted(tau) == [1, 2, 3] and rows
    for step, h, fork in rows:
        assert fork == (h >= tau[step] - 1e-6)
    assert all(0.3 <= f <= 0.3 + 0.15 for f in frac.values())      # the top 30% (ties at the threshold count)
    with pytest.raises(ValueError, match="fork rule 'top:1'"):
        load_config(preset="tiny-test", overrides=dict(fork_rule="top:1"))


def test_a_bad_rule_is_refused_by_attach_before_anything_opens(tmp_path, tiny):
    import forksight

    model, _ = tiny
    with pytest.raises(ValueError, match="fork rule 'abs:-1'"):
        forksight.attach(model, "bad", db=str(tmp_path / "never.duckdb"), fork_rule="abs:-1")
    assert not (tmp_path / "never.duckdb").exists()
    from forksight.hooks.integrations.trl import ForksightCallback

    with pytest.raises(ValueError, match="fork rule 'top:0'"):
        ForksightCallback(db=str(tmp_path / "never.duckdb"), fork_rule="top:0")


def _fork_alerts(points: list[tuple[float, float | None]]):
    from forksight.monitor.alerts.config import AlertConfig
    from forksight.monitor.alerts.hub import AlertMonitor

    monitor = AlertMonitor(AlertConfig())
    out = []
    for step, (tau, q) in enumerate(points, start=1):
        scalars = {"fork/threshold": tau, "fork/frac": 0.2 if q else 0.3, "entropy/mean": 1.0}
        if q:
            scalars["fork/quantile"] = q
        out += [a for a in monitor.observe(step, scalars) if a.detector == "fork_starvation"]
    return out


def test_starvation_under_a_quantile_rule_watches_its_threshold_fall():
    steady = _fork_alerts([(0.8, 0.2)] * 80)
    assert steady == []                                   # the share is q by construction: no false alarm
    falling = _fork_alerts([(0.8, 0.2)] * 20 + [(0.8 * 0.97 ** k, 0.2) for k in range(1, 80)])
    assert falling and falling[0].signal == "fork/threshold"
    first = falling[0]
    assert first.value <= first.threshold and first.threshold == pytest.approx(0.5 * 0.8, rel=0.05)
    assert "top 20%" in first.message and "top:0.2" in first.message
    # the same threshold series without a quantile rule: the absolute rule's share stays at 30%, no alert
    assert _fork_alerts([(0.8, None)] * 20 + [(0.8 * 0.97 ** k, None) for k in range(1, 80)]) == []


def test_the_tokens_legend_names_the_rule_and_the_steps_threshold():
    from forksight.dashboard.token_figures import token_scale
    from forksight.dashboard.tokens_view import fork_note, legend

    assert fork_note({"fork_rule": "top:0.2"}, 0.4123) == \
        "fork: the step's top 20% of tokens by H (top:0.2; this step H ≥ 0.412 nats)"
    assert fork_note({}, None) == "fork: H ≥ 0.672 nats (abs:0.672)"          # runs from before the setting
    assert fork_note({"fork_rule": "abs:1.5"}, 1.5) == "fork: H ≥ 1.5 nats (abs:1.5)"
    shown = legend(token_scale([0.1, 0.9], "entropy"), fork_note({"fork_rule": "top:0.2"}, 0.4))
    spans = [c for c in shown.children if getattr(c, "id", None) == "tok-fork-rule"]
    assert spans and "top 20%" in spans[0].children


def test_serve_fork_rule_redraws_a_stored_run_under_another_rule(tmp_path, capsys):
    """`forksight serve --fork-rule top:0.5` outlines, on the tokens page, the tokens at or above the median
    H of the step's stored rows, whatever rule the run was stored under (abs:0.672 here); a bad rule is
    refused before anything starts."""
    import numpy as np

    from forksight.compose.cli import main
    from forksight.dashboard.pages.tokens import render_step
    from forksight.monitor.collector.store import Store
    from forksight.trainer.config import load_config
    from forksight.trainer.loop import train

    db = str(tmp_path / "t.duckdb")
    train(load_config(preset="tiny-test", overrides=dict(steps=1, run="abs", db=db, token_groups=2, progress=False)))
    rule = ForkRule.parse("top:0.5")
    with Store(db, verify=False) as store:
        tokens = store.reader.read_tokens("abs", 1)
        sample = int(tokens.sample_id.iloc[0])
        mine = tokens[tokens.sample_id == sample].sort_values("pos")
        median = float(np.quantile(tokens.entropy.to_numpy(np.float64), 0.5))
        spans = render_step(store.reader, "abs", 1, str(sample), "entropy", fork_rule=rule)["main"][0].children[1].children
        stored = render_step(store.reader, "abs", 1, str(sample), "entropy")["main"][0].children[1].children
    outlined = ["fork" in s.className.split() for s in spans]
    assert outlined == (mine.entropy.to_numpy(np.float64) >= median).tolist()
    assert ["fork" in s.className.split() for s in stored] == mine.fork.tolist()       # the stored flags
    assert main(["serve", "--db", str(tmp_path / "x.duckdb"), "--fork-rule", "top:2"]) == 2
    assert "fork rule 'top:2'" in capsys.readouterr().err and not (tmp_path / "x.duckdb").exists()
