"""Lake benchmark (issue 35, item 5): what the Iceberg lake costs and gives, measured side by side.

Prints one JSON object (progress on stderr). Every ratio compares two things measured in this run:
  ingest            the same steps (scalars, histogram, samples, --tokens token rows each) written by
                    Store.write into a plain DuckDB file, into one with only the outbox attached (filled
                    in the write's transaction, no committer) and into one with the lake (outbox and the
                    committer committing beside it), interleaved --repeats times: rows/s of each, the
                    ratios lake/plain, outbox/plain and committer running/not (target: never slowed)
  commit            token rows/s into the lake: all token rows over the time from the first write until
                    the committer's last commit (the backlog at 0), beside DuckDB's own rate; the lake's
                  token rows (from its file list) must equal those written
  files/snapshots   per 1,000 steps, before and after `forksight lake compact` (and after `expire`)
  pages             the run page's first open (draw_run) and the tokens page's first render
                    (render_step) of the same run read from its DuckDB file and, as a lake-only run,
                    from another collector's serving TieredReader (its index of lake runs loaded, the
                    run not opened yet: its plan and views are built inside the timing);
                    lake_over_duckdb (target <= 2); also on a fresh reader (nothing loaded)

The issue's scale is 1,000 runs x 1,000 steps x 1,000 token rows (1e9 rows); the default here is
--runs 4 --steps 500 --tokens 1000 (2M token rows, minutes on two cores). The JSON says what ran.

    .venv/bin/python bench/lake.py [--runs 4] [--steps 500] [--tokens 1000] [--repeats 2]
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))   # the synthetic step

from bench_steps import step_with_tokens  # noqa: E402
from forksight.monitor.collector.store import Store  # noqa: E402

COLLECTOR = "bench-writer"


def say(msg: str) -> None:
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


def make_steps(runs: int, steps: int, tokens: int) -> list[list]:
    """Per run, per step: the step's Records (synthetic scalars/histogram/samples, `tokens` token rows)."""
    out = []
    for r in range(runs):
        rng = np.random.default_rng(r)
        run = []
        for s in range(steps):
            run.append(step_with_tokens(rng, s, tokens, steps))
        out.append(run)
    return out


def ingest(store: Store, data: list[list]) -> tuple[list[str], float]:
    """Write every run's steps (runs interleaved step by step, as concurrent trainers); seconds until
    the last write is acknowledged."""
    ids = [store.create_run(f"run{r}") for r in range(len(data))]
    start = time.perf_counter()
    futures = []
    for s in range(len(data[0])):
        for r, run in enumerate(data):
            futures.append(store.write(ids[r], run[s], f"{r}-{s}"))
        if len(futures) > 64:                 # a bounded queue, as HTTP clients waiting for their ack
            for f in futures[:-16]:
                f.result()
            futures = futures[-16:]
    for f in futures:
        f.result()
    return ids, time.perf_counter() - start


def lake_counts(catalog, steps_total: int) -> dict:
    """Data files and snapshots per table, and per 1,000 steps (of all runs together)."""
    from forksight.monitor.lake.schema import LAKE_TABLES, identifier

    out, files, snaps = {}, 0, 0
    for name in LAKE_TABLES:
        table = catalog.load_table(identifier(name))
        listed = table.inspect.files()
        n_files, n_snaps = listed.num_rows, len(table.metadata.snapshots)
        out[name] = {"files": n_files, "snapshots": n_snaps, "rows": sum(listed["record_count"].to_pylist())}
        files, snaps = files + n_files, snaps + n_snaps
    per = 1000 / steps_total
    out["all"] = {"files": files, "snapshots": snaps, "files_per_1000_steps": round(files * per, 2),
                  "snapshots_per_1000_steps": round(snaps * per, 2)}
    return out


def timed_ms(fn) -> float:
    t = time.perf_counter()
    fn()
    return (time.perf_counter() - t) * 1e3


def pages(db_store: Store, viewer: Store, catalog, run_id: str, repeats: int) -> dict:
    """Median ms of the run page's first open and the tokens page's first render, DuckDB vs lake-only.
    The lake side twice: on a serving reader (the collector's, long-lived: its index of lake runs
    loaded, as when the runs page listed the run; the run itself not opened yet, its tables planned
    inside the timing) and on a fresh reader (nothing loaded: a process's very first page)."""
    from forksight.compose.lake_reads import open_reader
    from forksight.dashboard.pages.tokens import render_step
    from forksight.dashboard.run_view import Controls, draw_run
    from forksight.monitor.lake.reader import TieredReader

    shown = f"{run_id}@{COLLECTOR}"

    def fresh():
        return TieredReader(viewer.reader, viewer, catalog, "bench-viewer", open_reader)

    newest = db_store.reader.token_step_span(run_id)[2]
    got = fresh().token_step_span(shown)
    assert got[2] == newest, f"the lake-only run {shown} does not hold the same steps: {got} vs {newest}; {fresh().lake_runs()}"
    draw_run(db_store.reader, run_id, Controls())               # imports and first-use costs, not counted
    render_step(db_store.reader, run_id, newest, None, "entropy", None, None, newest=newest)
    serving = fresh()
    opens = {"run_page_first_open": lambda r, rid: draw_run(r, rid, Controls()),
             "tokens_first_render": lambda r, rid: render_step(r, rid, newest, None, "entropy", None, None,
                                                              newest=newest)}
    times = {name: {"duckdb": [], "serving": [], "fresh": [], "again": []} for name in opens}
    for i in range(repeats):                                    # interleaved: the machine is shared
        for name, page in opens.items():
            got = times[name]
            got["duckdb"].append(timed_ms(lambda: page(db_store.reader, run_id)))
            serving.lake_runs()                                 # the runs page listed it (index loaded)
            serving.close_runs()                                # ... but this run was not opened yet
            got["serving"].append(timed_ms(lambda: page(serving, shown)))
            got["again"].append(timed_ms(lambda: page(serving, shown)))
            lake = fresh()
            got["fresh"].append(timed_ms(lambda: page(lake, shown)))
    out = {}
    for name, got in times.items():
        d, s_, f = (float(np.median(got[k])) for k in ("duckdb", "serving", "fresh"))
        out[name] = {"duckdb_ms": round(d, 1), "lake_only_ms": round(s_, 1), "lake_over_duckdb": round(s_ / d, 2),
                     "target_ratio": 2.0, "n": repeats,
                     # a fresh reader: the lake's index of runs and its tables loaded inside the timing too
                     "fresh_reader_lake_ms": round(f, 1), "fresh_reader_over_duckdb": round(f / d, 2),
                     # the same page again on the serving reader: the run's plan and views are built once
                     "lake_only_again_ms": round(float(np.median(got["again"])), 1)}
    return out


def background(store: Store, committer, args) -> None:
    """--background-runs small runs written one after another (as finished runs are) and committed."""
    rng = np.random.default_rng(12345)
    say(f"{args.background_runs} background runs x {args.background_steps} steps x {args.background_tokens} "
        "token rows")
    for r in range(args.background_runs):
        run = store.create_run(f"bg{r}")
        for s in range(args.background_steps):
            rec = step_with_tokens(rng, s, args.background_tokens, args.background_steps)
            store.write(run, rec, f"bg{r}-{s}")
        if r % 100 == 99:
            say(f"  {r + 1} background runs written")
    store.flush()
    while committer.health()["backlog_total"]:
        time.sleep(0.2)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=4)
    parser.add_argument("--steps", type=int, default=500, help="steps per run")
    parser.add_argument("--tokens", type=int, default=1000, help="token rows per step")
    parser.add_argument("--repeats", type=int, default=2, help="plain/lake ingest pairs")
    parser.add_argument("--page-repeats", type=int, default=5)
    parser.add_argument("--commit-rows", type=int, default=None, help="--lake-commit-rows (default: serve's)")
    parser.add_argument("--commit-seconds", type=float, default=5.0,
                        help="--lake-commit-seconds (serve's default is 30; the tail waits up to this long)")
    parser.add_argument("--dir", default=None, help="where the files go (default: a temp dir, removed)")
    parser.add_argument("--background-runs", type=int, default=0,
                        help="more runs committed to the lake (after the ingest figures, before the pages), "
                             "so the pages plan a run among that many: the catalog's scale without its data")
    parser.add_argument("--background-steps", type=int, default=20, help="steps per background run")
    parser.add_argument("--background-tokens", type=int, default=100, help="token rows per background step")
    parser.add_argument("--day", action="store_true",
                        help="only the simulated day of a live run (bench/lake_day.py): snapshots and metadata bytes")
    parser.add_argument("--day-intervals", type=int, default=2880, help="30-s commit intervals (2880: a day)")
    parser.add_argument("--day-data-every", type=int, default=30, help="a step of data every this many intervals")
    args = parser.parse_args()
    if args.day:
        from lake_day import simulated_day

        root = Path(args.dir or tempfile.mkdtemp(prefix="forksight-bench-day-"))
        try:
            print(json.dumps(simulated_day(root, args.day_intervals, args.day_data_every), indent=1))
        finally:
            if not args.dir:
                shutil.rmtree(root, ignore_errors=True)
        return 0

    from forksight.monitor.lake.catalog import open_catalog
    from forksight.monitor.lake.maintenance import run_maintenance
    from forksight.monitor.lake.outbox import Outbox
    from forksight.monitor.lake.service import DEFAULT_COMMIT_ROWS, start_lake

    commit_rows = args.commit_rows or DEFAULT_COMMIT_ROWS
    commit_seconds = args.commit_seconds
    root = Path(args.dir or tempfile.mkdtemp(prefix="forksight-bench-lake-"))
    root.mkdir(parents=True, exist_ok=True)
    say(f"building {args.runs} runs x {args.steps} steps x {args.tokens} token rows")
    data = make_steps(args.runs, args.steps, args.tokens)
    token_rows = args.runs * args.steps * args.tokens
    try:
        plain_s, outbox_s, lake_s, commit_s = [], [], [], []
        for rep in range(args.repeats):
            say(f"ingest round {rep + 1}/{args.repeats}: plain")
            with Store(str(root / f"plain{rep}.duckdb")) as store:
                plain_s.append(ingest(store, data)[1])
            say(f"ingest round {rep + 1}/{args.repeats}: outbox filled, no committer")
            with Store(str(root / f"outbox{rep}.duckdb")) as store:
                store.attach_lake(Outbox(store, COLLECTOR))      # what start_lake attaches, minus the thread
                outbox_s.append(ingest(store, data)[1])
            say(f"ingest round {rep + 1}/{args.repeats}: with the lake (outbox and committer)")
            uri, wh = f"sqlite:///{root}/catalog{rep}.db", str(root / f"wh{rep}")
            catalog = open_catalog(uri, wh)
            store = Store(str(root / f"lake{rep}.duckdb"))
            committer = start_lake(store, catalog, uri=uri, warehouse=wh, collector_id=COLLECTOR,
                                   commit_rows=commit_rows, commit_seconds=commit_seconds)
            t0 = time.perf_counter()
            ids, seconds = ingest(store, data)
            lake_s.append(seconds)
            # until every row is in the lake: the commit figure times the committer, not stop()'s drain
            while committer.health()["backlog_total"]:
                time.sleep(0.05)
            commit_s.append(time.perf_counter() - t0)
            if rep == args.repeats - 1 and args.background_runs:
                background(store, committer, args)
            committer.stop(timeout=600)
            if rep < args.repeats - 1:
                store.close()
        plain, lake, outbox = float(np.median(plain_s)), float(np.median(lake_s)), float(np.median(outbox_s))
        report = {
            "scale": {"runs": args.runs, "steps_per_run": args.steps, "token_rows_per_step": args.tokens,
                      "background_runs": args.background_runs, "background_steps": args.background_steps,
                      "background_token_rows_per_step": args.background_tokens,
                      "token_rows": token_rows, "issue_scale": "1000 runs x 1000 steps x 1000 token rows",
                      "commit_rows": commit_rows, "commit_seconds": commit_seconds, "catalog": "sqlite",
                      "warehouse": "local directory"},
            "ingest": {"plain_token_rows_per_s": round(token_rows / plain, 1),
                       "with_lake_token_rows_per_s": round(token_rows / lake, 1),
                       "outbox_only_token_rows_per_s": round(token_rows / outbox, 1),
                       "lake_over_plain_rate": round(plain / lake, 3),
                       # the outbox's own cost (rows written twice) and the committer's (same outbox, its thread running)
                       "outbox_only_over_plain_rate": round(plain / outbox, 3),
                       "committer_running_over_not_rate": round(outbox / lake, 3), "repeats": args.repeats,
                       "plain_s": [round(s, 2) for s in plain_s], "outbox_only_s": [round(s, 2) for s in outbox_s],
                       "with_lake_s": [round(s, 2) for s in lake_s]},
            "commit": {"lake_token_rows_per_s": round(token_rows / float(np.median(commit_s)), 1),
                       "duckdb_token_rows_per_s": round(token_rows / plain, 1),
                       "lake_over_duckdb_rate": round(plain / float(np.median(commit_s)), 3),
                       "seconds_first_write_to_last_commit": [round(s, 2) for s in commit_s]},
        }
        steps_total = args.runs * args.steps + args.background_runs * args.background_steps
        lake_files = {"before_compact": lake_counts(catalog, steps_total)}
        lake_rows = lake_files["before_compact"]["tokens"]["rows"]
        report["commit"]["lake_token_rows"] = lake_rows
        written = token_rows + args.background_runs * args.background_steps * args.background_tokens
        if lake_rows != written:
            raise SystemExit(f"the lake holds {lake_rows} token rows, {written} were written")
        say("forksight lake compact")
        t = time.perf_counter()
        run_maintenance(catalog, "compact")
        lake_files["compact_s"] = round(time.perf_counter() - t, 2)
        lake_files["after_compact"] = lake_counts(catalog, steps_total)
        run_maintenance(catalog, "expire", older_than=datetime.now(timezone.utc))
        lake_files["after_compact_and_expire"] = lake_counts(catalog, steps_total)
        report["files_and_snapshots"] = lake_files
        say("pages: DuckDB vs lake-only")
        with Store(str(root / "viewer.duckdb")) as viewer:
            report["pages"] = pages(store, viewer, catalog, ids[0], args.page_repeats)
        store.close()
    finally:
        if not args.dir:
            shutil.rmtree(root, ignore_errors=True)
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
