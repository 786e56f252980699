"""The fork rule on the tokens page, in a real headless Chromium against a real `forksight serve`, on
two real `forksight train` runs of the readable preset's warm start: one under the default rule
(abs:0.672), one under the paper's per-step rule (top:0.2). The legend names each run's rule and,
under top:q, the step's threshold in nats (the stored fork/threshold); the outlined tokens are the
stored fork flags, which are the tokens at or above that threshold.

Screenshots (fork-rule-abs.png, fork-rule-top.png) go to $FORKSIGHT_SCREENSHOTS or the test's tmp dir."""
from __future__ import annotations

import subprocess
import sys

import pytest

pytest.importorskip("playwright")
from browser_util import context, page, shots_dir  # noqa: E402,F401 (fixtures)
from collector_util import ServeProcess  # noqa: E402
from conftest import require_browser  # noqa: E402
from test_browser_probes import api  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.browser]
RULES = {"abs": "abs:0.672", "top": "top:0.2"}


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    chromium = require_browser()
    db = tmp_path_factory.mktemp("fork-rule-browser") / "runs.duckdb"
    for name, rule in RULES.items():
        done = subprocess.run([sys.executable, "-m", "forksight", "train", "--preset", "readable", "--steps", "2",
                               "--token-groups", "2", "--seed", "0", "--fork-rule", rule, "--run", name,
                               "--db", str(db), "--no-progress"], capture_output=True, text=True, timeout=900)
        assert done.returncode == 0, done.stderr[-3000:]
    with ServeProcess(db, dashboard=True) as srv:
        yield srv, chromium, {r["name"]: r["run_id"] for r in api(srv, "")}


@pytest.mark.parametrize("name", ["abs", "top"])
def test_the_legend_names_the_rule_and_the_outline_is_the_stored_fork_flag(served, page, tmp_path, name):
    srv, _, ids = served
    run, step = ids[name], 2
    threshold = [r for r in api(srv, f"{run}/scalars", keys="fork/threshold") if r["step"] == step][0]["value"]
    tokens = api(srv, f"{run}/tokens", step=step, sample_id=0)
    page.goto(f"{srv.url}/tokens?run={run}&step={step}&sample=0")
    page.wait_for_function("""s => { const el = document.querySelector('#tok-step-label');
        return el !== null && el.innerText === 'step ' + s; }""", arg=step, timeout=30_000)
    page.wait_for_selector("#tok-main .tok")
    page.wait_for_selector("#tok-fork-rule")
    legend = page.inner_text("#tok-fork-rule")
    if name == "abs":
        assert legend == "fork: H ≥ 0.672 nats (abs:0.672)" and threshold == pytest.approx(0.672)
    else:
        assert legend == f"fork: the step's top 20% of tokens by H (top:0.2; this step H ≥ {threshold:.3g} nats)"
    marks = page.evaluate("() => Array.from(document.querySelectorAll('#tok-scale .scale-tick.above'), e => e.innerText)")
    assert marks == [f"{threshold:.3g} fork"]                     # the bar marks this step's threshold
    outlined = page.evaluate("() => Array.from(document.querySelectorAll('#tok-main .tok'), "
                             "e => e.classList.contains('fork'))")
    assert outlined == [bool(t["fork"]) for t in tokens]
    assert [bool(t["fork"]) for t in tokens if t["entropy"] is not None] == \
        [t["entropy"] >= threshold - 1e-6 for t in tokens if t["entropy"] is not None]
    page.screenshot(path=str(shots_dir(tmp_path) / f"fork-rule-{name}.png"), full_page=True)
    assert page.errors == []
