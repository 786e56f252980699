"""The tokens page's step reads stay flat with the run's length (issue 40, item 8): on a dense run
(a token step at every step) the slider, the nearest step, the scale's first steps and the
history's spread steps come from the span alone, so no statement of the page's first open scans
more of the token_steps index on a run ten times longer; a run with gaps still gets the exact
steps, as the index rows say."""
from __future__ import annotations

import json
import random

import duckdb
import numpy as np
import pytest

from forksight.base.records import Records, tokens_table
from forksight.dashboard.pages.tokens import run_scale, render_step, step_picker
from forksight.monitor.collector.reader import Reader
from forksight.monitor.collector.store import Store

ROW_GROUP = 122_880          # DuckDB's rows per row group: a scan's smallest unit


def _reference(steps: list[int], n: int, wanted: list[int]) -> dict:
    """What the reads must answer, computed from the step list in plain Python."""
    lo, hi = min(steps), max(steps)
    width, groups = max(1, hi - lo), {}
    for s in steps:                               # the spread's groups, as the SQL forms them
        g = min(n - 1, (s - lo) * n // width)
        groups[g] = min(groups.get(g, s), s)
    nearest = [min(steps, key=lambda s: (abs(s - w), s)) for w in wanted]
    return {"first": sorted(steps)[:3], "spread": sorted(set(groups.values()) | {hi}),
            "nearest": nearest, "span": (len(steps), lo, hi)}


@pytest.mark.parametrize("dense", [True, False])
def test_step_reads_equal_the_step_list_on_dense_and_gapped_runs(tmp_path, dense):
    rng = random.Random(7 if dense else 8)
    with Store(str(tmp_path / "s.duckdb")) as store:
        for r in range(4):
            run = store.create_run(f"run{r}")
            first = rng.randrange(0, 50)
            steps = list(range(first, first + rng.randrange(1, 60)))
            if not dense:                         # drop some steps, keep the ends
                steps = [s for s in steps if s in (steps[0], steps[-1]) or rng.random() < 0.5]
            for s in steps:                       # the real ingest path fills token_steps
                store.write(run, Records(tokens=tokens_table(
                    {"sample_id": [0], "pos": [0], "token_id": [1], "entropy": [0.5]}, step=s))).result()
            wanted = [rng.randrange(-5, 120) for _ in range(6)]
            reader = store.reader
            for n in (1, 2, 5, 23, 80):
                want = _reference(steps, n, wanted)
                assert reader.spread_token_steps(run, n) == want["spread"], (steps, n)
            assert reader.first_token_steps(run, 3) == want["first"]
            assert reader.nearest_token_steps(run, wanted) == want["nearest"]
            assert reader.token_step_span(run) == want["span"]


def _long_dense_run(path: str, steps: int) -> None:
    """A dense run of `steps` steps, one token row and one sample a step. Filled in SQL (the
    writer's own per-step inserts would take minutes at 300,000 steps); the rows are those the
    writer keeps, token_steps included."""
    Store(path, verify=False).close()
    con = duckdb.connect(path)
    try:
        con.execute("INSERT INTO runs (run_id, name, project, created_at, status, config, last_step, first_step) "
                    "VALUES ('long', 'long', 'default', 0, 'finished', ?, ?, 0)",
                    [json.dumps({"vocab_size": 64}), steps - 1])
        con.execute(f"""INSERT INTO tokens (run_id, step, rank, sample_id, pos, token_id, token, entropy)
                        SELECT 'long', s, 0, 0, 0, 5, 'a', (s % 7) / 7.0 FROM range({steps}) r(s)""")
        con.execute(f"""INSERT INTO samples (run_id, step, rank, sample_id, group_id, prompt, completion, reward)
                        SELECT 'long', s, 0, 0, 0, '1+1=', '2', 1.0 FROM range({steps}) r(s)""")
        con.execute(f"INSERT INTO token_steps SELECT 'long', s FROM range({steps}) r(s)")
        con.execute("CHECKPOINT")
    finally:
        con.close()


def _statements(reader: Reader, work) -> list[tuple[str, list]]:
    """The SQL statements `work()` sends through the reader (its one door to DuckDB)."""
    seen, run = [], reader._run

    def logged(sql, params, take):
        seen.append((sql, list(params or [])))
        return run(sql, params, take)
    reader._run = logged
    try:
        work()
    finally:
        reader._run = run
    return seen


def _rows_scanned(path: str, statements: list[tuple[str, list]]) -> list[dict[str, int]]:
    """Rows each statement's table scans read, per table (DuckDB's profiler; an aggregate that
    DuckDB answers from the segments' statistics has no operator profile and counts {})."""
    con = duckdb.connect(path, read_only=True)
    con.enable_profiling()
    out = []
    try:
        for sql, params in statements:
            con.execute(sql, params).fetchall()
            profile = json.loads(con.get_profiling_information(format="json"))
            scanned: dict[str, int] = {}
            stack = list(profile.get("operator", []))
            while stack:
                node = stack.pop()
                if "rows_scanned" in node:
                    table = node.get("extra_info", {}).get("Table", "?").split(".")[-1]
                    scanned[table] = scanned.get(table, 0) + int(node["rows_scanned"])
                stack.extend(node.get("children", []))
            out.append(scanned)
    finally:
        con.close()
    return out


def test_the_tokens_page_first_open_scans_no_more_of_a_ten_times_longer_run(tmp_path):
    sizes = {"short": 30_000, "long": 300_000}     # token_steps: 1 row group vs 3
    scanned = {}
    for name, steps in sizes.items():
        path = str(tmp_path / f"{name}.duckdb")
        _long_dense_run(path, steps)
        with Store(path, verify=False) as store:
            reader = store.reader

            def first_open():
                picker = step_picker(reader, "long")          # the slider (load_steps)
                step = reader.nearest_token_steps("long", [picker["value"]])[0]   # show
                scale = run_scale(reader, "long", "entropy")
                render_step(reader, "long", step, None, "entropy", None, scale, newest=picker["max"])
                reader.spread_token_steps("long", 23)         # the history's columns
            statements = _statements(reader, first_open)
        scanned[name] = (statements, _rows_scanned(path, statements))
    short, long = scanned["short"], scanned["long"]
    assert [s for s, _ in short[0]] == [s for s, _ in long[0]]      # the same statements
    for (sql, _), few, many in zip(long[0], short[1], long[1]):
        for table in set(few) | set(many):
            assert many.get(table, 0) <= few.get(table, 0) + ROW_GROUP, \
                f"{' '.join(sql.split())[:120]} scans {table}: {few.get(table, 0):,} -> {many.get(table, 0):,} rows"
    # and no statement reads token_steps' rows at all beyond the span
    assert all(not s.get("token_steps") for s in long[1]), long[1]


def test_a_finished_runs_history_heatmap_is_read_once_per_app(tmp_path):
    from forksight.dashboard.data import AppState
    from forksight.dashboard.pages.tokens import cached_history, prompt_history

    path = str(tmp_path / "h.duckdb")
    _long_dense_run(path, 3_000)
    with Store(path, verify=False) as store:
        app_state = AppState(store.reader)
        first = _statements(store.reader, lambda: cached_history(app_state, "long", "1+1=", "entropy"))
        again = _statements(store.reader, lambda: cached_history(app_state, "long", "1+1=", "entropy"))
        rows, mine = cached_history(app_state, "long", "1+1=", "entropy")
        want, want_mine = prompt_history(store.reader, "long", "1+1=", "entropy")
        assert mine == want_mine and rows.equals(want)
    reads = [s for s, _ in first if "FROM tokens" in s]
    assert len(reads) == 1 and not [s for s, _ in again if "FROM tokens" in s or "FROM samples" in s]
