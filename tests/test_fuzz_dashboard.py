"""Property-based fuzzing of the dashboard's own routes (the callbacks a browser calls): every
page opened with any path and query string, and every callback fired with any value its
component can hold or a URL can put there (unknown and hostile run ids, out-of-range slider
indices, stale stores, free text for a sample), over a real DuckDB file with real runs.

What a browser can send must be answered (200, or 204 for "nothing to update"): a 400 here
means a callback raised on a value the page itself can produce. Crafted bodies no browser
sends are tests/test_guard.py's part (4xx, never 5xx).

Budget: fixed, derandomized examples in CI; FORKSIGHT_FUZZ_SCALE=20 runs 20x with fresh seeds."""
from __future__ import annotations

import logging
from urllib.parse import urlencode

import pytest
from hypothesis import given
from hypothesis import strategies as st
from starlette.testclient import TestClient

from forksight.compose.app import create_app
from forksight.dashboard.token_figures import METRICS
from forksight.monitor.collector.ingest import Ingest
from forksight.monitor.collector.store import Store
from fuzz_util import budget, dash_call
from synthetic import seed_run

BASE = "http://127.0.0.1:8050"
ROUTE = "/_dash-update-component"
PAGES = ("/", "/run", "/tokens", "/compare", "/alerts")
EMPTY = "empty-run"                     # a run with no steps yet


class Dashboard:
    """The collector app with its dashboard, in process, over a seeded file."""

    def __init__(self, path):
        self.store = Store(str(path))
        self.collapse = seed_run(self.store, "collapsing", 40, strategy="all", collapse=True, seed=1,
                                 steps_total=60, writer=Ingest(self.store))     # with alerts
        self.healthy = seed_run(self.store, "healthy", 12, strategy="fork", collapse=False, seed=2)
        self.store.create_run(EMPTY)
        self.client = TestClient(create_app(self.store, dashboard=True), base_url=BASE,
                                 raise_server_exceptions=True)
        assert self.client.get("/").status_code == 200         # Dash adds its page router here
        self.deps = {d["output"]: d for d in self.client.get("/_dash-dependencies").json()}
        reader = self.store.reader
        self.runs = [self.collapse, self.healthy, EMPTY]
        self.steps = {run: reader.token_steps(run) for run in self.runs}
        self.keys = sorted({k for run in self.runs for k in reader.scalar_keys(run)})

    def dep(self, *, output_has: str = "", input_is: str = "") -> dict:
        """The one callback whose output names `output_has` and (optionally) first input is `input_is`."""
        found = [d for out, d in self.deps.items() if output_has in out and
                 (not input_is or f"{d['inputs'][0]['id']}.{d['inputs'][0]['property']}" == input_is)]
        assert len(found) == 1, [d["output"][:80] for d in found]
        return found[0]

    def fire(self, dep: dict, values: dict, changed: str | None = None):
        """Call `dep` as Dash's renderer does, each input/state taking values['id.property']."""
        body = dash_call(dep, values.get, changed)
        return self.client.post(ROUTE, json=body)


@pytest.fixture(scope="module")
def dash(tmp_path_factory):
    board = Dashboard(tmp_path_factory.mktemp("dashfuzz") / "d.duckdb")
    yield board
    board.store.close()


def answered(resp, what) -> dict | None:
    """Assert the browser's call was answered; the decoded response (None for 204)."""
    assert resp.status_code in (200, 204), f"{what}: {resp.status_code} {resp.text[:400]}"
    return resp.json()["response"] if resp.status_code == 200 else None


# ---------------------------------------------------------------------------- value strategies
def run_ids(dash) -> st.SearchStrategy:
    return st.one_of(st.none(), st.sampled_from(dash.runs),
                     st.sampled_from(["", "nope", "../../etc/passwd", "<script>x</script>", "a" * 300]))


def maybe_int(lo=-5, hi=10**9) -> st.SearchStrategy:
    return st.one_of(st.none(), st.integers(lo, hi))


URL_TEXT = st.one_of(st.text(max_size=20), st.sampled_from(["", "0", "-1", "1e3", "999999999999999999999",
                                                              "nan", "1,2", "%00", "<b>"]))


def query_strings(dash) -> st.SearchStrategy:
    """?run=&step=&sample=&runs=&metric=... with known, unknown and hostile values (a user's link)."""
    values = st.one_of(URL_TEXT, st.sampled_from(dash.runs),
                       st.lists(st.sampled_from([*dash.runs, "nope"]), max_size=4).map(",".join))
    params = st.dictionaries(st.sampled_from(["run", "step", "sample", "runs", "metric", "x", "token"]),
                             values, max_size=5)
    return st.one_of(st.just(""), params.map(lambda q: "?" + urlencode(q)),
                     st.text(max_size=40).map(lambda t: "?" + t))


# ---------------------------------------------------------------------------- pages
@budget(80)
@given(data=st.data())
def test_every_page_opens_with_any_query_string(dash, data):
    path = data.draw(st.one_of(st.sampled_from(PAGES), st.text(max_size=20).map(lambda t: "/" + t)))
    search = data.draw(query_strings(dash))
    dep = dash.dep(output_has="_pages_content.children")
    answered(dash.fire(dep, {"_pages_location.pathname": path, "_pages_location.search": search}),
             f"page {path}{search}")


# ---------------------------------------------------------------------------- run page
@budget(60)
@given(data=st.data())
def test_run_page_draws_and_ticks_for_anything_its_controls_or_url_hold(dash, data):
    controls = {
        "run-select.value": data.draw(run_ids(dash)),
        "run-smoothing.value": data.draw(st.one_of(st.none(), st.floats(0, 0.99))),
        "run-xaxis.value": data.draw(st.sampled_from(["step", "wall"])),
        "run-logy.value": data.draw(st.one_of(st.none(), st.sampled_from([[], ["log"]]))),
        "run-points.value": data.draw(st.sampled_from([None, 500, 1000, 5000, 20000, "all"])),
        "run-custom-keys.value": data.draw(st.one_of(st.none(), st.lists(
            st.sampled_from([*dash.keys, "no/such/key"]), max_size=3))),
    }
    drawn = answered(dash.fire(dash.dep(output_has="run-entropy.figure...", input_is="run-select.value"),
                               controls), f"draw {controls}")
    state = drawn["run-state"]["data"] if drawn else None
    # the tick: with the state just drawn, a state of another run, or none
    other = data.draw(st.sampled_from([state, None, {"run_id": "nope"}]))
    tick = dash.dep(output_has="run-entropy.figure@", input_is="run-tick.n_intervals")
    for held in (state, other):
        answered(dash.fire(tick, {**controls, "run-tick.n_intervals": data.draw(maybe_int(0)),
                                  "run-state.data": held}), f"tick {controls} state={str(held)[:200]}")
    answered(dash.fire(dash.dep(output_has="run-pause.children"),
                       {"run-pause.n_clicks": data.draw(maybe_int(0))}), "pause")


# ---------------------------------------------------------------------------- tokens page
@budget(60)
@given(data=st.data())
def test_tokens_page_follows_any_run_step_sample_and_metric(dash, data):
    run = data.draw(run_ids(dash))
    values = {"tok-run.value": run, "tok-want-step.data": data.draw(st.one_of(st.none(), URL_TEXT)),
              "tok-want-sample.data": data.draw(st.one_of(st.none(), URL_TEXT)),
              "tok-metric.value": data.draw(st.sampled_from(list(METRICS)))}
    loaded = answered(dash.fire(dash.dep(output_has="tok-span.data...", input_is="tok-run.value"), values),
                      f"load steps {values}")
    span = loaded["tok-span"]["data"] if loaded else None
    known = dash.steps.get(run, [])
    # the span as the app filled it, an older one (new steps arrived since), another run's, or junk
    older = {"run": run, "count": len(known) // 2, "first": known[0], "last": known[len(known) // 2]} \
        if known else None
    values["tok-span.data"] = data.draw(st.sampled_from([span, older, {"run": "other", "last": 3}, {},
                                                         None, [1, 2]]))
    values["tok-step.value"] = data.draw(maybe_int(-3, 10**6))
    follow = dash.dep(output_has="tok-span.data@", input_is="tok-tick.n_intervals")
    answered(dash.fire(follow, {**values, "tok-tick.n_intervals": data.draw(maybe_int(0))}),
             f"follow {values}")
    values["tok-sample.value"] = data.draw(st.one_of(maybe_int(-2), URL_TEXT))
    values["tok-shown.data"] = data.draw(st.one_of(st.none(), st.tuples(run_ids(dash), maybe_int()).map(list)))
    changed = data.draw(st.sampled_from(["tok-step.value", "tok-sample.value", "tok-metric.value",
                                         "tok-span.data"]))
    shown = answered(dash.fire(dash.dep(output_has="tok-sample.options"), values, changed), f"show {values}")
    values["tok-prompt.children"] = shown["tok-prompt"]["children"] if shown and "tok-prompt" in shown \
        else data.draw(st.one_of(st.none(), st.text(max_size=30)))
    answered(dash.fire(dash.dep(output_has="tok-history.figure"), values), f"history {values}")


# ---------------------------------------------------------------------------- runs and compare pages
@budget(40)
@given(data=st.data())
def test_runs_table_and_compare_answer_any_selection(dash, data):
    table = answered(dash.fire(dash.dep(output_has="runs-table.data"),
                               {"runs-tick.n_intervals": data.draw(maybe_int(0))}), "runs table")
    rows = table["runs-table"]["data"] if table else []
    shown = data.draw(st.one_of(st.none(), st.just(rows), st.lists(st.sampled_from(rows or [{}]), max_size=4)))
    click = dash.dep(output_has="nav-location.href", input_is="runs-table.active_cell")
    cell = data.draw(st.one_of(st.none(), st.fixed_dictionaries(
        {"row": st.integers(-2, 8), "column": st.integers(0, 9),
         "column_id": st.sampled_from(["name", "status", "entropy", "alerts", "x"])})))
    answered(dash.fire(click, {"runs-table.active_cell": cell, "runs-table.derived_viewport_data": shown}),
             f"open {cell} of {shown}")
    compare = dash.dep(output_has="nav-location.href", input_is="runs-compare.n_clicks")
    answered(dash.fire(compare, {"runs-compare.n_clicks": data.draw(maybe_int(0)),
                                 "runs-table.derived_virtual_data": shown,
                                 "runs-table.derived_virtual_selected_rows":
                                     data.draw(st.one_of(st.none(), st.lists(st.integers(-2, 8), max_size=4)))}),
             "compare selected")
    answered(dash.fire(dash.dep(output_has="cmp-figure.figure"), {
        "cmp-runs.value": data.draw(st.one_of(st.none(), run_ids(dash),
                                              st.lists(run_ids(dash), max_size=4))),
        "cmp-smoothing.value": data.draw(st.one_of(st.none(), st.floats(0, 0.99))),
        "cmp-panels.value": data.draw(st.one_of(st.none(), st.lists(
            st.sampled_from([*dash.keys, "gap", "no/such/key"]), max_size=5))),
        "cmp-logy.value": data.draw(st.one_of(st.none(), st.sampled_from([[], ["log"]]))),
        "cmp-xaxis.value": data.draw(st.sampled_from([None, "step", "wall"])),
        "cmp-view.value": data.draw(st.sampled_from([None, "runs", "grouped", "x"])),
        "cmp-group.value": data.draw(st.one_of(st.none(), st.sampled_from(["strategy", "seed", "lr"]),
                                               URL_TEXT)),
        "cmp-band.value": data.draw(st.sampled_from([None, "minmax", "ci95", "sd"])),
        "cmp-tick.n_intervals": data.draw(maybe_int(0))}), "compare figure")


# ---------------------------------------------------------------------------- alerts view
@budget(30)
@given(data=st.data())
def test_alerts_view_answers_any_filter_and_page(dash, data):
    values = {
        "alerts-run.value": data.draw(st.one_of(st.none(), st.lists(run_ids(dash), max_size=3))),
        "alerts-severity.value": data.draw(st.one_of(st.none(), st.lists(
            st.sampled_from(["critical", "warning", "bogus"]), max_size=3))),
        "alerts-detector.value": data.draw(st.one_of(st.none(), st.lists(
            st.sampled_from(["entropy_collapse", "covariance", "nope"]), max_size=3))),
        "alerts-prev.n_clicks": data.draw(maybe_int(0)),
        "alerts-next.n_clicks": data.draw(maybe_int(0)),
        "alerts-tick.n_intervals": data.draw(maybe_int(0)),
        "alerts-offset.data": data.draw(st.one_of(st.none(), maybe_int(-5, 10**6))),
    }
    changed = data.draw(st.sampled_from(["alerts-run.value", "alerts-next.n_clicks",
                                         "alerts-prev.n_clicks", "alerts-tick.n_intervals"]))
    answered(dash.fire(dash.dep(output_has="alerts-table.children"), values, changed),
             f"alerts {values}")


def test_a_callback_that_raises_is_logged_and_answered_400(dash, caplog):
    # the oracle above relies on this: a callback failure is a 400 (not a silent 200) and is logged
    with caplog.at_level(logging.WARNING, logger="forksight.dashboard"):
        resp = dash.fire(dash.dep(output_has="run-entropy.figure...", input_is="run-select.value"),
                         {"run-select.value": dash.healthy, "run-smoothing.value": 5.0, "run-xaxis.value": "step"})
    assert resp.status_code == 400 and "could not answer" in resp.text
    assert "a dashboard callback failed" in caplog.text
