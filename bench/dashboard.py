"""Dashboard latency against store size, in-process: every page's work function timed on stores
of growing size, printed as JSON with each figure beside its target and its growth.

Each size is seeded by bench/seed.py (DuckDB SQL, minutes at 500k steps x 500M token rows):
one long run of S steps (21 scalar keys, an entropy histogram, samples and token rows per step)
among R runs. Steps grow with runs held at the first --runs size; runs then grow on the largest
step size (the short runs are added to that file). Figures (p95 over --repeats calls):
  run_page_first_open   draw_run with no app cache (every figure read from DuckDB)   <= 300 ms
  tokens_step_list      step_picker: the slider's span, marks and newest step         <= 50 ms
  tokens_first_render   render_step of the newest step, colour scale read cold        <= 300 ms
  runs_page_refresh     one page of the runs table + its count (both callbacks)      <= 300 ms
  ingest_to_visible     a step written -> the run page's tick (live.TICK_MS) returns it <= 1 s

--side-by-side: the run page's first open over HTTP (run_page_open: its layout as Dash serves it,
every figure drawn in it; issue 48, item 8) and the tokens page's first open over HTTP (tokens_page_open: its layout and the
callbacks a browser fires before the tokens show, then the history's, through Dash's endpoints
on a warm app, as a fresh browser tab meets a serving collector) on every --steps size at once,
the sizes' opens interleaved so load on the machine falls on all alike; the growth is the
largest size's p50 and p95 over the smallest's (issue 40, item 8: <= 1.25x).

    .venv/bin/python bench/dashboard.py --steps 10000,100000,500000 --runs 100,10000
    .venv/bin/python bench/dashboard.py --steps 10000,100000 --token-rows-per-step 1024 --side-by-side
"""
from __future__ import annotations

import argparse
import json
import math
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))   # the synthetic step

from seed import LONG_RUN, add_short_runs, seed  # noqa: E402

from forksight.dashboard.run_view import Controls, draw_run, tick_run  # noqa: E402
from forksight.monitor.collector.store import Store  # noqa: E402
from synthetic import step_records  # noqa: E402

TARGETS_MS = {"run_page_first_open": 300.0, "tokens_step_list": 50.0,
              "tokens_first_render": 300.0, "tokens_history": 300.0, "runs_page_refresh": 300.0,
              "run_page_draw_http": 300.0, "ingest_to_visible": 1000.0}


def p95_ms(fn, repeats: int) -> dict:
    """p50/p95/max in ms of fn(i) over repeats calls (the first call counted: a first open)."""
    times = []
    for i in range(repeats):
        t = time.perf_counter()
        fn(i)
        times.append((time.perf_counter() - t) * 1e3)
    return {"p50_ms": round(float(np.percentile(times, 50)), 1),
            "p95_ms": round(float(np.percentile(times, 95)), 1), "n": repeats}


def dash_http(app, run_id: str, repeats: int) -> dict:
    """The run page's draw callback through POST /_dash-update-component (Flask test client:
    JSON serialisation included)."""
    client = app.server.test_client()
    client.get("/")                                 # Dash sets its server up on first request
    deps = client.get("/_dash-dependencies").get_json()
    dep = next(d for d in deps if "run-entropy.figure" in d["output"] and "@" not in d["output"]
               and d["inputs"] and d["inputs"][0]["id"] == "run-select")
    values = {"run-select.value": run_id, "run-smoothing.value": 0.6, "run-xaxis.value": "step",
              "run-logy.value": [], "run-points.value": 1000, "run-custom-keys.value": []}
    outputs = [dict(zip(("id", "property"), o.rsplit(".", 1)))
               for o in dep["output"].strip(".").split("...")]

    def call(i: int) -> None:
        body = {"output": dep["output"], "outputs": outputs, "changedPropIds": ["run-select.value"],
                "inputs": [{**x, "value": values.get(f"{x['id']}.{x['property']}")} for x in dep["inputs"]],
                "state": [{**x, "value": values.get(f"{x['id']}.{x['property']}")} for x in dep["state"]]}
        response = client.post("/_dash-update-component", json=body)
        assert response.status_code == 200, response.data[:500]
        call.bytes = len(response.data)

    stats = p95_ms(call, repeats)
    stats["response_bytes"] = call.bytes
    return stats


TOKENS_GROWTH_TARGET = 1.25     # the tokens page's open, largest size over smallest (side by side)


def tokens_page_open(app, run_id: str):
    """A function timing one first open of the tokens page on `app` over Dash's endpoints: the
    layout (Referer: the page's URL, as a browser asks), load_steps, show and history, each fed
    the answers before it. Returns (ms, what the page showed)."""
    client = app.server.test_client()
    client.get("/")
    deps = client.get("/_dash-dependencies").get_json()

    def dep(first_output: str) -> dict:
        return next(d for d in deps if d["output"].lstrip(".").startswith(first_output)
                    and "@" not in d["output"])
    load, show, history = dep("tok-span.data"), dep("tok-sample.options"), dep("tok-history.figure")

    def call(d: dict, values: dict) -> dict:
        outputs = [dict(zip(("id", "property"), o.rsplit(".", 1))) for o in d["output"].strip(".").split("...")]
        if not d["output"].startswith(".."):      # one output: Dash sends it bare, not in a list
            outputs = outputs[0]

        def fill(xs):
            return [{**x, "value": values.get(f"{x['id']}.{x['property']}")} for x in xs]
        body = {"output": d["output"], "outputs": outputs, "inputs": fill(d["inputs"]),
                "state": fill(d["state"]), "changedPropIds": [f"{d['inputs'][0]['id']}.{d['inputs'][0]['property']}"]}
        response = client.post("/_dash-update-component", json=body)
        assert response.status_code == 200, response.data[:500]
        return response.get_json()["response"]

    def once() -> tuple[float, dict]:
        t = time.perf_counter()
        layout = client.get("/_dash-layout", headers={"Referer": f"http://localhost/tokens?run={run_id}"})
        assert layout.status_code == 200, layout.data[:300]
        picked = call(load, {"tok-run.value": run_id})
        span, value = picked["tok-span"]["data"], picked["tok-step"]["value"]
        shown = call(show, {"tok-step.value": value, "tok-metric.value": "entropy", "tok-span.data": span,
                            "tok-run.value": run_id})
        prompt = shown["tok-prompt"]["children"]
        call(history, {"tok-prompt.children": prompt, "tok-metric.value": "entropy", "tok-span.data": span,
                       "tok-run.value": run_id})
        return (time.perf_counter() - t) * 1e3, {"step": shown["tok-step-label"]["children"], "prompt": prompt}
    return once


def run_page_open(app, run_id: str):
    """A function timing one first open of the run page on `app`: its layout as Dash serves it
    (Referer: the page's URL), every figure drawn in it. Returns (ms, {"step": bytes sent})."""
    client = app.server.test_client()
    client.get("/")

    def once() -> tuple[float, dict]:
        t = time.perf_counter()
        layout = client.get("/_dash-layout", headers={"Referer": f"http://localhost/run?run={run_id}"})
        assert layout.status_code == 200, layout.data[:300]
        return (time.perf_counter() - t) * 1e3, {"step": f"{len(layout.data):,} bytes"}
    return once


PAGES = {"tokens_page_open": tokens_page_open, "run_page_open": run_page_open}


def side_by_side(dbs: dict[int, str], repeats: int) -> dict:
    """Each page's first open (PAGES) on every store at once (one app each, all warm), the sizes
    interleaved in rotating order each round: p50/p95 per size and the growth largest / smallest."""
    from forksight.dashboard.app import create_dash

    stores = {n: Store(db, verify=False, memory_limit="2GB") for n, db in dbs.items()}
    out = {}
    try:
        apps = {n: create_dash(st.reader) for n, st in stores.items()}
        for page, make in PAGES.items():
            opens = {n: make(app, LONG_RUN) for n, app in apps.items()}
            shown = {n: o()[1] for n, o in opens.items()}          # warm: the app's caches, as served
            for o in opens.values():
                o()
            times: dict[int, list[float]] = {n: [] for n in opens}
            order = list(opens)
            for i in range(repeats):
                for n in order[i % len(order):] + order[:i % len(order)]:
                    times[n].append(opens[n]()[0])
            per = {f"{n:,}": {"p50_ms": round(float(np.percentile(t, 50)), 1),
                              "p95_ms": round(float(np.percentile(t, 95)), 1), "n": len(t),
                              "shows": shown[n]["step"]} for n, t in times.items()}
            lo, hi = f"{min(times):,}", f"{max(times):,}"
            growth = {q: round(per[hi][f"{q}_ms"] / per[lo][f"{q}_ms"], 2) for q in ("p50", "p95")}
            out[page] = {"sizes": per, "growth_largest_over_smallest": growth, "target": TOKENS_GROWTH_TARGET,
                         "met": max(growth.values()) <= TOKENS_GROWTH_TARGET}
    finally:
        for st in stores.values():
            st.close()
    return out


def ingest_to_visible(store: Store, run_id: str, tries: int, tick_s: float | None = None) -> dict:
    """A page ticking every tick_s (as its dcc.Interval does) and steps written at random
    moments: ms from the write's commit to the tick that returns it."""
    from forksight.dashboard.live import TICK_MS

    tick_s = TICK_MS / 1000 if tick_s is None else tick_s     # by default, as the pages tick
    rng = np.random.default_rng(1)
    box = {"state": draw_run(store.reader, run_id, Controls())["state"]}
    seen: dict[int, float] = {}
    stop = threading.Event()

    def page_loop():
        while not stop.is_set():
            t0 = time.perf_counter()
            out = tick_run(store.reader, box["state"], Controls())
            box["state"] = out["state"]
            if out["figures"].get("entropy") is not None:
                seen.setdefault(out["state"]["last_step"], time.perf_counter())
            stop.wait(max(0.0, tick_s - (time.perf_counter() - t0)))

    thread = threading.Thread(target=page_loop, daemon=True)
    thread.start()
    latencies, step = [], box["state"]["last_step"]
    for _ in range(tries):
        time.sleep(float(rng.uniform(0.2, 1.2)))
        step += 1
        store.write(run_id, step_records(rng, step, step + 100)).result()
        committed = time.perf_counter()
        deadline = committed + 10
        while step not in seen and time.perf_counter() < deadline:
            time.sleep(0.005)
        latencies.append((seen.get(step, math.inf) - committed) * 1e3)
    stop.set()
    thread.join()
    return {"p50_ms": round(float(np.percentile(latencies, 50)), 1),
            "p95_ms": round(float(np.percentile(latencies, 95)), 1), "n": tries, "tick_s": tick_s}


def measure(db: str, repeats: int, pages: bool) -> dict:
    """Every figure on the store at `db` (pages=False: the runs page only)."""
    from forksight.dashboard.app import create_dash
    from forksight.dashboard.pages.tokens import (history_steps, prompt_history, render_step,
                                                  step_picker)
    from forksight.dashboard.runs_table import runs_table

    out = {}
    with Store(db, verify=False, memory_limit="2GB") as store:
        reader = store.reader

        def runs_refresh(i: int) -> None:       # the table's two callbacks: one page + the count
            sort = [[], [{"column_id": "last_step", "direction": "desc"}]][i % 2]
            runs_table(reader, page=i % 3, sort_by=sort, filter_query="{status} contains i" * (i % 3 == 2))
            reader.runs_page(limit=0)
        out["runs_page_refresh"] = p95_ms(runs_refresh, repeats)
        if not pages:
            return out
        out["run_page_first_open"] = p95_ms(lambda i: draw_run(reader, LONG_RUN, Controls()), repeats)
        out["tokens_step_list"] = p95_ms(lambda i: step_picker(reader, LONG_RUN), repeats)
        newest = reader.token_step_span(LONG_RUN)[2]
        metrics = ("entropy", "js")
        out["tokens_first_render"] = p95_ms(      # no app cache: the scale and the step read cold
            lambda i: render_step(reader, LONG_RUN, newest, None, metrics[i % 2], None, None,
                                  newest=newest), repeats)
        out["tokens_history"] = p95_ms(
            lambda i: prompt_history(reader, LONG_RUN, "12+35=", metrics[i % 2]),
            max(3, repeats // 4))
        out["tokens_history"]["steps_read"] = len(history_steps(reader, LONG_RUN))
        out["run_page_draw_http"] = dash_http(create_dash(reader), LONG_RUN, max(3, repeats // 2))
        out["ingest_to_visible"] = ingest_to_visible(store, LONG_RUN, max(5, repeats // 2))
    return out


def growth(rows: list[dict], figure: str, label: str) -> dict:
    """figure's p95 at each size, and the ratio largest / smallest."""
    p95 = {r[label]: r["figures"][figure]["p95_ms"] for r in rows if figure in r["figures"]}
    values = list(p95.values())
    return {"p95_ms": {f"{k:,}": v for k, v in p95.items()},
            "largest_over_smallest": round(values[-1] / values[0], 2) if len(values) > 1 and values[0] else None}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", default="10000,100000,500000", help="long-run sizes, ascending")
    parser.add_argument("--runs", default="100,10000", help="run counts, ascending")
    parser.add_argument("--token-rows-per-step", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--dir", default=None, help="where the stores go (default: a temp dir, removed)")
    parser.add_argument("--keep", action="store_true", help="keep the seeded stores")
    parser.add_argument("--side-by-side", action="store_true",
                        help="only the tokens page's open, on every --steps size at once (see the top)")
    args = parser.parse_args()
    if args.side_by_side:
        return main_side_by_side(args)
    steps = [int(s) for s in args.steps.split(",")]
    runs = [int(r) for r in args.runs.split(",")]
    root = Path(args.dir or tempfile.mkdtemp(prefix="forksight-bench-"))
    root.mkdir(parents=True, exist_ok=True)
    by_steps, by_runs = [], []
    try:
        # warm-up on a tiny store, not counted: imports and first-use costs are the process's,
        # not the store's, and would otherwise land on the smallest size only
        seed(str(root / "warm.duckdb"), steps=200, runs=3, token_rows_per_step=64, progress=False)
        measure(str(root / "warm.duckdb"), 2, True)
        for i, n in enumerate(tqdm(steps, desc="sizes", unit="size")):
            db = str(root / f"steps{n}.duckdb")
            info = seed(db, steps=n, runs=runs[0], token_rows_per_step=args.token_rows_per_step)
            by_steps.append({"steps": n, "runs": runs[0], "rows": info["rows"], "bytes": info["bytes"],
                             "seed_s": info["seconds"], "figures": measure(db, args.repeats, True)})
            if i < len(steps) - 1 and not args.keep:
                Path(db).unlink()
        by_runs.append({"runs": runs[0], "steps": steps[-1], "figures": by_steps[-1]["figures"]})
        for r in runs[1:]:
            t = time.perf_counter()
            add_short_runs(db, r - by_runs[-1]["runs"], first_index=by_runs[-1]["runs"] - 1)
            by_runs.append({"runs": r, "steps": steps[-1], "seed_s": round(time.perf_counter() - t, 2),
                            "figures": measure(db, args.repeats, True)})
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    biggest = by_runs[-1]["figures"]
    report = {
        "targets_ms": TARGETS_MS,
        "at_largest": {f: {"p95_ms": v["p95_ms"], "target_ms": TARGETS_MS[f],
                           "met": v["p95_ms"] <= TARGETS_MS[f]} for f, v in biggest.items()},
        "growth_with_steps": {f: growth(by_steps, f, "steps") for f in TARGETS_MS},
        "growth_with_runs": {f: growth(by_runs, f, "runs") for f in TARGETS_MS},
        "by_steps": by_steps, "by_runs": by_runs,
    }
    print(json.dumps(report, indent=2))
    return 0


def main_side_by_side(args) -> int:
    """Seed (or reuse, with --dir and --keep) a store per --steps size; time the tokens page's open
    on all of them interleaved; print JSON."""
    steps = [int(s) for s in args.steps.split(",")]
    root = Path(args.dir or tempfile.mkdtemp(prefix="forksight-bench-"))
    root.mkdir(parents=True, exist_ok=True)
    dbs, seeded = {}, {}
    try:
        for n in steps:
            db = root / f"steps{n}x{args.token_rows_per_step}.duckdb"
            if not db.exists():
                info = seed(str(db), steps=n, runs=int(args.runs.split(",")[0]),
                            token_rows_per_step=args.token_rows_per_step)
                seeded[f"{n:,}"] = {"seed_s": info["seconds"]["total_s"], "bytes": info["bytes"]}
            dbs[n] = str(db)
        report = {"token_rows_per_step": args.token_rows_per_step, "repeats": args.repeats,
                  "seeded": seeded, **side_by_side(dbs, args.repeats)}
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
