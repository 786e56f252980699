"""`forksight report`: a run as one self-contained HTML file (issue 47, item 2), written from a real
`forksight train` run's store and opened from disk in a real headless Chromium with the network
off: every chart is drawn from the stored numbers, no request leaves the file, the alerts show
their fixes, completions are coloured on the run's scale, and model text stays text (a completion
holding <script> shows it and runs nothing). Bad input: an unknown run, an unwritable folder, bad
bounds — a clear error, exit 2, nothing written and an existing file left as it was."""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from forksight.compose.cli import main
from forksight.compose.local import LocalSink
from forksight.monitor.collector.store import Store

pytestmark = pytest.mark.slow
HOSTILE = "<script>window.__pwned = 1</script>"


@pytest.fixture(scope="module")
def stored(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("report")
    db = tmp / "runs.duckdb"
    done = subprocess.run([sys.executable, "-m", "forksight", "train", "--preset", "tiny-test", "--task", "collapse",
                           "--lr", "0.03", "--max-new-tokens", "6", "--steps", "8", "--seed", "0", "--run", "trained",
                           "--db", str(db)], capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    sink = LocalSink(str(db), "hostile", config={"note": HOSTILE})
    for step in range(1, 4):
        sink.log_scalars(step, {"entropy/mean": 1.0 / step})
        sink.log_samples(step, [{"sample_id": 0, "prompt": "1+1=", "completion": HOSTILE, "reward": 1.0}])
        sink.log_tokens(step, {"sample_id": [0, 0], "pos": [0, 1], "token_id": [1, 2],
                               "token": [HOSTILE, "&amp;"], "entropy": [0.9, 0.1]})
    sink.finish()
    return db


def _report(db, run, out, *extra) -> int:
    return main(["report", "--db", str(db), "--run", run, "-o", str(out), *extra])


def test_the_report_opens_offline_with_every_chart_drawn_from_the_stored_numbers(stored, tmp_path):
    from conftest import require_browser
    from playwright.sync_api import sync_playwright

    chromium = require_browser()
    out = tmp_path / "trained.html"
    assert _report(stored, "trained", out) == 0
    with Store(str(stored), verify=False) as store:
        entropy = store.reader.read_scalars("trained", keys=["entropy/mean"])
        alerts = store.reader.read_alerts("trained")
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, args=["--headless", "--no-sandbox", "--disable-gpu"])
        context = browser.new_context(offline=True)
        page = context.new_page()
        requests, errors = [], []
        page.on("request", lambda r: requests.append(r.url))
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(out.as_uri())
        page.wait_for_selector("#fig-signals .main-svg", timeout=30_000)
        drawn = page.evaluate("() => Array.from(document.querySelectorAll('.figure'), d => [d.id, !!d.querySelector('.main-svg')])")
        mean = page.evaluate("""() => document.getElementById('fig-entropy').data
            .filter(t => t.meta && t.meta.key === 'entropy/mean' && t.meta.role === 'raw')
            .map(t => ({x: Array.from(t.x), y: Array.from(t.y)}))""")
        verdict = page.inner_text("#verdict")
        table = page.inner_text("#alerts") if len(alerts) else ""
        spans = page.evaluate("() => document.querySelectorAll('.completion .tok').length")
        browser.close()
    assert errors == [] and [u for u in requests if not u.startswith("file:")] == []
    assert {d for d, _ in drawn} >= {"fig-entropy", "fig-heatmap", "fig-passk", "fig-signals"} and all(ok for _, ok in drawn)
    assert mean and mean[0]["x"] == entropy.step.tolist()
    np.testing.assert_allclose(mean[0]["y"], entropy.value.to_numpy(), rtol=1e-6)
    assert verdict
    for a in alerts.to_dict("records"):
        assert a["detector"] in table
    assert spans > 0


def test_model_text_in_the_report_is_text(stored, tmp_path):
    from conftest import require_browser
    from playwright.sync_api import sync_playwright

    chromium = require_browser()
    out = tmp_path / "hostile.html"
    assert _report(stored, "hostile", out) == 0
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, args=["--headless", "--no-sandbox", "--disable-gpu"])
        page = browser.new_context(offline=True).new_page()
        page.goto(out.as_uri())
        page.wait_for_selector("#fig-entropy .main-svg", timeout=30_000)
        pwned = page.evaluate("() => window.__pwned === undefined")
        shown = page.evaluate("() => Array.from(document.querySelectorAll('.completion .tok'), s => s.textContent)")
        config = page.inner_text("#config")
        browser.close()
    assert pwned
    assert shown[:2] == [HOSTILE, "&amp;"]
    assert HOSTILE in config


@pytest.mark.parametrize("args, says", [
    (["--run", "nope"], "no run 'nope'"),
    (["--token-steps", "0"], "--token-steps must be >= 1"),
    (["--db", "/nonexistent/x.duckdb"], "no DuckDB file"),
])
def test_bad_input_is_a_clear_error_and_nothing_is_written(stored, tmp_path, capsys, args, says):
    out = tmp_path / "kept.html"
    out.write_text("an earlier report")
    base = {"--db": str(stored), "--run": "trained", "-o": str(out)}
    for flag, value in zip(args[::2], args[1::2]):
        base[flag] = value
    code = main(["report", *[x for kv in base.items() for x in kv]])
    assert code == 2 and says in capsys.readouterr().err
    assert out.read_text() == "an earlier report" and sorted(p.name for p in tmp_path.iterdir()) == ["kept.html"]


def test_an_unwritable_folder_is_named(stored, tmp_path, capsys):
    code = _report(stored, "trained", tmp_path / "no" / "such" / "dir" / "r.html")
    assert code == 2 and "not a writable folder" in capsys.readouterr().err


def test_a_collector_serving_the_run_gives_the_same_report(stored, tmp_path, capsys):
    import re

    from collector_util import InProcessCollector

    by_file, by_url = tmp_path / "file.html", tmp_path / "url.html"
    assert _report(stored, "trained", by_file) == 0
    with InProcessCollector(stored, token="s3cret") as srv:
        assert main(["report", "--url", srv.url, "--token", "s3cret", "--run", "trained", "-o", str(by_url)]) == 0
        assert main(["report", "--url", srv.url, "--run", "trained", "-o", str(tmp_path / "x.html")]) == 2
        assert "bearer token" in capsys.readouterr().err
    written = re.compile(r"report written [^<]* by forksight")      # the one line that differs: when
    assert written.sub("", by_url.read_text()) == written.sub("", by_file.read_text())
    assert main(["report", "--url", "http://127.0.0.1:1", "--run", "trained", "-o", str(tmp_path / "y.html")]) == 2
    assert "no collector answers at http://127.0.0.1:1" in capsys.readouterr().err
    assert not (tmp_path / "x.html").exists() and not (tmp_path / "y.html").exists()
