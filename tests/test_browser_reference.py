"""The reference set in a real headless Chromium against a real `forksight serve` (issue 48 item 5), on a
real `forksight train` run of the readable preset re-scoring its set every 2 steps: the run page's
entropy-pattern panel and its link; the reference page drawing one completion at the base and at the
chosen step (outlines = the stored fork flags of each; colours = H on one scale, or ΔH from the base:
orange where H rose, blue where it fell), the |ΔH|-by-decile and scatter figures, and the words table
whose picked word marks its occurrences and links the completions holding it. Model text is escaped.

Screenshots (reference-page.png, run-pattern.png) go to $FORKSIGHT_SCREENSHOTS or the test's tmp dir."""
from __future__ import annotations

import subprocess
import sys
from collections import Counter

import pytest

pytest.importorskip("playwright")
from browser_util import context, page, shots_dir  # noqa: E402,F401 (fixtures)
from collector_util import ServeProcess  # noqa: E402
from conftest import require_browser  # noqa: E402
from test_browser_probes import api  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.browser]
STEP = 6


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    chromium = require_browser()
    db = tmp_path_factory.mktemp("reference-browser") / "runs.duckdb"
    done = subprocess.run([sys.executable, "-m", "forksight", "train", "--preset", "readable", "--steps", str(STEP),
                           "--reference-every", "2", "--reference-size", "8", "--reference-budget", "100",
                           "--lr", "3e-3", "--seed", "0", "--run", "refrun", "--db", str(db), "--no-progress"],
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    with ServeProcess(db, dashboard=True) as srv:
        from forksight.monitor.sinks.http import HttpSink

        evil = HttpSink(srv.url, "evil")          # model text that is markup must be shown, never run
        evil.log_reference(0, [{"sample_id": 0, "pos": -1, "token_id": 1, "token": "Q"},
                               {"sample_id": 0, "pos": 0, "token_id": 2, "token": "<img src=x onerror=alert(1)>",
                                "entropy": 0.9, "fork": True}])
        evil.log_reference(1, [{"sample_id": 0, "pos": 0, "token_id": 2, "token": "<img src=x onerror=alert(1)>",
                                "entropy": 0.2, "fork": False}])
        evil.log_scalars(1, {"ref/fork_overlap": 0.0})
        assert evil.finish() == {}
        yield srv, chromium


def _rows(srv, step: int) -> list[dict]:
    return api(srv, "refrun/reference", step=step, limit=100_000)


def _open(page, srv, query: str) -> None:
    page.goto(f"{srv.url}/reference?{query}")
    page.wait_for_selector("#ref-bottom .tok", timeout=30_000)


def test_the_run_page_shows_the_pattern_panel_and_links_the_reference_page(served, page, tmp_path):
    srv, _ = served
    page.goto(f"{srv.url}/run?run=refrun")
    page.wait_for_selector("#run-pattern-wrap .js-plotly-plot", state="visible", timeout=30_000)
    names = page.evaluate("() => document.querySelector('#run-pattern .js-plotly-plot').data.map(t => t.name)")
    assert {"base forks still forks", "Spearman ρ of H", "d1", "d10"} <= set(names)
    overlap = page.evaluate("() => document.querySelector('#run-pattern .js-plotly-plot').data"
                            ".find(t => t.name === 'base forks still forks')")
    stored = {r["step"]: r["value"] for r in api(srv, "refrun/scalars", keys="ref/fork_overlap")}
    assert dict(zip(overlap["x"], overlap["y"])) == pytest.approx(stored) and sorted(stored) == [0, 2, 4, 6]
    page.locator("#run-pattern-wrap").screenshot(path=str(shots_dir(tmp_path) / "run-pattern.png"))
    page.click("#run-pattern-link")
    page.wait_for_selector("#ref-bottom .tok", timeout=30_000)
    assert "run=refrun" in page.url and page.errors == []


def test_one_completion_at_the_base_and_at_a_step_on_one_scale_and_in_dh(served, page, tmp_path):
    srv, _ = served
    base = [r for r in _rows(srv, 0) if r["sample_id"] == 3 and r["pos"] >= 0]
    now = [r for r in _rows(srv, STEP) if r["sample_id"] == 3]
    _open(page, srv, f"run=refrun&step={STEP}&sample=3")
    prompt = "".join(r["token"] for r in _rows(srv, 0) if r["sample_id"] == 3 and r["pos"] < 0)
    assert page.inner_text("#ref-prompt") == prompt
    for where, rows in (("#ref-top", base), ("#ref-bottom", now)):
        shown = page.evaluate(f"() => Array.from(document.querySelectorAll('{where} .tok'), "
                              "e => [e.innerText, e.classList.contains('fork')])")
        assert [s[1] for s in shown] == [bool(r["fork"]) for r in rows]
        assert [s[0] for s in shown] == [r["token"] or "∅" for r in rows]
    page.click("#ref-metric input[value=dh]")
    page.wait_for_function("() => document.querySelector('#ref-legend').innerText.includes('ΔH from the base')",
                           timeout=30_000)
    hues = page.evaluate("""() => Array.from(document.querySelectorAll('#ref-bottom .tok'), el => {
        const m = getComputedStyle(el).backgroundColor.match(/rgba?\\(([^)]*)\\)/);
        return m ? m[1].split(',').map(Number) : [0, 0, 0, 0]; })""")
    for (r, g, b, *alpha), was, is_ in zip(hues, base, now):
        dh = is_["entropy"] - was["entropy"]
        if abs(dh) > 0.02 and alpha and alpha[0] > 0.05:     # a visible colour: its hue says the sign
            assert (r, g, b) == ((232, 89, 12) if dh > 0 else (33, 102, 172)), (was["token"], dh)
    page.screenshot(path=str(shots_dir(tmp_path) / "reference-page.png"), full_page=True)
    assert page.errors == []


def test_the_words_table_marks_a_picked_word_and_links_its_completions(served, page):
    srv, _ = served
    _open(page, srv, f"run=refrun&step={STEP}&sample=0")
    page.wait_for_selector("#ref-words td", timeout=30_000)
    rows = [r for r in _rows(srv, STEP)]
    counts = Counter(repr(r["token"])[1:-1].replace(" ", "␣") for r in rows)
    first = page.inner_text("#ref-words tbody tr:nth-child(2) td:nth-child(1)")     # row 1 is the header
    assert int(page.inner_text("#ref-words tbody tr:nth-child(2) td:nth-child(2)")) == counts[first]
    page.click("#ref-words tbody tr:nth-child(2) td:nth-child(1)")
    page.wait_for_selector("#ref-holders a", timeout=30_000)
    links = page.evaluate("() => Array.from(document.querySelectorAll('#ref-holders a'), e => e.innerText)")
    holders = Counter(r["sample_id"] for r in rows if repr(r["token"])[1:-1].replace(" ", "␣") == first)
    assert links == [f"#{s} ({n}×)" for s, n in sorted(holders.items())]
    marked = page.evaluate("() => document.querySelectorAll('#ref-bottom .tok.hit').length")
    assert marked == holders.get(0, 0)
    assert page.errors == []


def test_model_text_that_is_markup_is_shown_not_run(served, page):
    srv, _ = served
    _open(page, srv, "run=evil&step=1")
    assert page.inner_text("#ref-bottom .tok") == "<img src=x onerror=alert(1)>"
    assert page.evaluate("() => document.querySelectorAll('#ref-bottom img, #ref-top img').length") == 0
    page.wait_for_selector("#ref-words td", timeout=30_000)
    assert "<img␣src=x␣onerror=alert(1)>" in page.inner_text("#ref-words")      # spaces shown as ␣
    assert page.evaluate("() => document.querySelectorAll('#ref-words img').length") == 0


def test_the_training_words_come_from_the_writers_aggregate(served, page):
    srv, _ = served
    _open(page, srv, f"run=refrun&step={STEP}&sample=0")
    page.click("#ref-words-of input[value=training]")
    page.wait_for_function("() => document.querySelector('#ref-words-caption').innerText.includes('training tokens')",
                           timeout=30_000)
    caption = page.inner_text("#ref-words-caption")
    assert "'base' = steps 1–10" in caption and f"'now' = steps 1–{STEP}" in caption
    page.wait_for_function("() => document.querySelectorAll('#ref-words td').length > 0", timeout=30_000)
    shown = page.evaluate("() => Array.from(document.querySelectorAll('#ref-words tbody tr'), "
                          "r => Array.from(r.querySelectorAll('td'), c => c.innerText)).filter(r => r.length)")
    words = {repr(w["token"])[1:-1].replace(" ", "␣"): w for w in api(srv, "refrun/words", start=1, end=STEP, limit=500)}
    assert len(shown) > 3
    for token, count, *_ in shown[:10]:
        assert int(count) == words[token]["count"]
    assert page.errors == []
