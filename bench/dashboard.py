"""Dashboard latency on a big run: run-page and tokens-page callbacks, the live tick, and
ingest-to-visible, printed as JSON with the targets and anchors beside them.

Seeds a DuckDB file through the store's write API with bulk Arrow tables (10,000 steps,
~10M token rows by default: seconds, not minutes), then times the page callbacks' work
functions directly and through Dash's HTTP endpoint (/_dash-update-component, via Flask's
test client, so JSON serialisation is included).

    .venv/bin/python bench/dashboard.py [--steps 10000] [--token-rows-per-step 1024]
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))   # the synthetic run

from forksight.dashboard.run_view import Controls, draw_run, tick_run  # noqa: E402
from forksight.base.constants import ENTROPY_EDGES  # noqa: E402
from forksight.base.records import Records, scalars_table, tokens_table
from forksight.monitor.collector.store import Store
from synthetic import bulk_tokens, step_records  # noqa: E402

TARGET_CALLBACK_MS = 300.0
TARGET_VISIBLE_S = 2.0
ANCHORS_S = {"tensorboard_reload": 30.0, "aim": 10.0, "mlflow": 30.0}
KEYS = ("entropy/mean", "entropy/p20", "entropy/p50", "entropy/p80", "entropy/p95",
        "renyi2/mean", "js/mean", "top1/mean", "fork/frac", "selected/frac", "cov/logp_adv",
        "reward/mean", "pass@1", "pass@2", "pass@4", "pass@8", "loss", "kl", "grad_norm",
        "length/mean", "lr")


def bulk_scalars(steps: int, rng: np.random.Generator) -> pa.Table:
    """Every run-page key for `steps` steps of a collapsing run, vectorised."""
    s = np.arange(steps, dtype=np.float64)
    h = 1.4 * np.exp(-4 * s / steps) + 0.01
    shape = {"entropy/mean": h, "entropy/p20": 0.05 * h, "entropy/p50": 0.4 * h,
             "entropy/p80": 1.6 * h, "entropy/p95": 2.5 * h, "renyi2/mean": 0.72 * h,
             "js/mean": 0.08 * h, "top1/mean": np.exp(-h), "fork/frac": 0.3 * h / 1.4,
             "selected/frac": np.full(steps, 0.2), "cov/logp_adv": 0.02 * np.exp(-3 * s / steps),
             "reward/mean": 0.3 + 0.5 * (1 - np.exp(-5 * s / steps)), "loss": np.zeros(steps),
             "kl": 0.01 * s / steps, "grad_norm": 1 + h, "length/mean": 14 - 2 * s / steps,
             "lr": np.full(steps, 3e-4)}
    for k in (1, 2, 4, 8):
        shape[f"pass@{k}"] = np.minimum(1.0, shape["reward/mean"] * (1 + 0.3 * math.log2(k) * h))
    parts = []
    for key in KEYS:
        noisy = shape[key] + rng.normal(0, 0.01, steps) * (np.abs(shape[key]).mean() + 1e-3)
        parts.append(pa.table({"step": np.arange(steps, dtype=np.int64),
                               "key": pa.array([key] * steps), "value": noisy,
                               "wall_time": 1.7e9 + 0.5 * s, "rank": np.zeros(steps, np.int32),
                               "weight": np.ones(steps)}))
    return pa.concat_tables(parts)


def bulk_histograms(steps: int, rng: np.random.Generator, draws: int = 400) -> pa.Table:
    """One entropy histogram per step over ENTROPY_EDGES, from draws per step (vectorised)."""
    nb = len(ENTROPY_EDGES) - 1
    scale = np.repeat(1.4 * np.exp(-4 * np.arange(steps) / steps) + 0.01, draws)
    values = np.where(rng.random(steps * draws) < 0.5, np.exp(rng.normal(-5.8, 1, scale.size)),
                      rng.gamma(1.5, scale / 1.5))
    bins = np.clip(np.searchsorted(ENTROPY_EDGES, values, side="right") - 1, 0, nb - 1)
    counts = np.bincount(np.repeat(np.arange(steps), draws) * nb + bins,
                         minlength=steps * nb).astype(np.float64)
    return pa.table({"step": np.repeat(np.arange(steps, dtype=np.int64), nb),
                     "rank": np.zeros(steps * nb, np.int32),
                     "key": pa.array(["entropy"] * (steps * nb)),
                     "bin_lo": np.tile(ENTROPY_EDGES[:-1], steps),
                     "bin_hi": np.tile(ENTROPY_EDGES[1:], steps), "count": counts})


def bulk_samples(steps: int, per_step: int, rng: np.random.Generator) -> pa.Table:
    """per_step samples per step (groups of 4), prompts from a small pool so they recur."""
    n = steps * per_step
    sid = np.tile(np.arange(per_step, dtype=np.int64), steps)
    prompts = pa.array([f"{a}+{b}=" for a, b in ((12, 35), (47, 26), (38, 19), (21, 44))])
    reward = (rng.random(n) < 0.6).astype(np.float64)
    return pa.table({"step": np.repeat(np.arange(steps, dtype=np.int64), per_step),
                     "rank": np.zeros(n, np.int32), "sample_id": sid, "group_id": sid // 4,
                     "prompt": prompts.take(pa.array((sid // 4) % 4)),
                     "completion": pa.array(["7+5=12 ans 21"] * n), "reward": reward,
                     "correct": reward > 0, "length": np.full(n, 13, np.int32),
                     "source": pa.array(["bench"] * n)})


def seed(store: Store, steps: int, rows_per_step: int) -> tuple[str, dict]:
    """The big run, written in bulk; returns its id and how long each part took."""
    rng = np.random.default_rng(0)
    run_id = store.create_run("bench", strategy="fork", model="tiny-qwen2",
                              config={"vocab_size": 311})
    took = {}
    t = time.perf_counter()
    store.write(run_id, Records(scalars=bulk_scalars(steps, rng),
                                histograms=bulk_histograms(steps, rng),
                                samples=bulk_samples(steps, rows_per_step // 64, rng))).result()
    took["scalars_histograms_samples_s"] = time.perf_counter() - t
    t = time.perf_counter()
    chunk_steps = max(1, 1_000_000 // rows_per_step)
    futures = []
    for first in tqdm(range(0, steps, chunk_steps), desc="token rows", unit="chunk"):
        n = min(chunk_steps, steps - first)
        table = bulk_tokens(n, rows_per_step, seed=first, first_step=first)
        futures.append(store.write(run_id, Records(tokens=tokens_table(table))))
    for fut in futures:
        fut.result()
    took["tokens_s"] = time.perf_counter() - t
    return run_id, took


def p95_ms(fn, repeats: int) -> dict:
    """p50/p95/max in ms of fn(i) over repeats calls (the first call warms caches: counted)."""
    times = []
    for i in range(repeats):
        t = time.perf_counter()
        fn(i)
        times.append((time.perf_counter() - t) * 1e3)
    return {"p50_ms": round(float(np.percentile(times, 50)), 1),
            "p95_ms": round(float(np.percentile(times, 95)), 1),
            "max_ms": round(max(times), 1), "n": repeats}


def dash_http(app, run_id: str, repeats: int) -> dict:
    """The run page's draw callback through POST /_dash-update-component (Flask test client)."""
    client = app.server.test_client()
    client.get("/")                                 # Dash sets its server up on first request
    graphs = ("entropy", "heatmap", "passk", "signals", "custom")
    outputs = [{"id": f"run-{g}", "property": "figure"} for g in graphs] + [
        {"id": "run-state", "property": "data"}, {"id": "run-banner", "property": "children"},
        {"id": "run-status", "property": "children"},
        {"id": "run-custom-keys", "property": "options"}]

    def call(i: int) -> None:
        body = {"output": ".." + "...".join(f"{o['id']}.{o['property']}" for o in outputs) + "..",
                "outputs": outputs, "changedPropIds": ["run-smoothing.value"], "state": [],
                "inputs": [{"id": "run-select", "property": "value", "value": run_id},
                           {"id": "run-smoothing", "property": "value", "value": 0.5 + i % 4 / 10},
                           {"id": "run-xaxis", "property": "value", "value": "step"},
                           {"id": "run-logy", "property": "value", "value": []},
                           {"id": "run-points", "property": "value", "value": 1000},
                           {"id": "run-custom-keys", "property": "value", "value": []}]}
        response = client.post("/_dash-update-component", json=body)
        assert response.status_code == 200, response.data[:500]
        call.bytes = len(response.data)

    stats = p95_ms(call, repeats)
    stats["response_bytes"] = call.bytes
    return stats


def ingest_to_visible(store: Store, run_id: str, state: dict, tries: int, tick_s: float = 1.0
                      ) -> dict:
    """A page ticking every tick_s (as dcc.Interval does) and steps written at random
    moments: seconds from the write's commit to the tick that returns it."""
    from forksight.dashboard.pages.run import TICK_MS

    assert abs(TICK_MS / 1000 - tick_s) < 1e-9, "bench must tick like the page"
    rng = np.random.default_rng(1)
    seen: dict[int, float] = {}
    stop = threading.Event()
    box = {"state": state}

    def page_loop():
        while not stop.is_set():
            t0 = time.perf_counter()
            out = tick_run(store.reader, box["state"], Controls())
            box["state"] = out["state"]
            patch = out["figures"]["entropy"]
            if patch is not None:
                seen.setdefault(out["state"]["last_step"], time.perf_counter())
            stop.wait(max(0.0, tick_s - (time.perf_counter() - t0)))

    thread = threading.Thread(target=page_loop, daemon=True)
    thread.start()
    latencies, step = [], state["last_step"]
    for _ in tqdm(range(tries), desc="ingest→visible", unit="step"):
        time.sleep(float(rng.uniform(0.2, 1.2)))
        step += 1
        store.write(run_id, step_records(rng, step, step + 100)).result()
        committed = time.perf_counter()
        deadline = committed + 10
        while step not in seen and time.perf_counter() < deadline:
            time.sleep(0.005)
        latencies.append(seen.get(step, math.inf) - committed)
    stop.set()
    thread.join()
    p95 = float(np.percentile(latencies, 95))
    return {"p50_s": round(float(np.percentile(latencies, 50)), 3), "p95_s": round(p95, 3),
            "max_s": round(max(latencies), 3), "n": tries, "tick_s": tick_s,
            "target_s": TARGET_VISIBLE_S,
            "speedup_vs_anchor_p95": {k: round(v / p95, 1) for k, v in ANCHORS_S.items()}}


def runs_page(path: str, runs: int, steps: int, repeats: int) -> dict:
    """The runs page's table on a store of many runs: the batched sparkline read it uses vs
    one read per run (what it did before, 23 s at 1,861 runs)."""
    from forksight.dashboard.pages.runs import SPARK_POINTS, runs_rows

    rng = np.random.default_rng(3)
    with Store(path) as store:
        futures = []
        for i in tqdm(range(runs), desc="runs", unit="run"):
            run_id = store.create_run(f"r{i}", strategy="fork")
            rows = [{"step": s, "key": k, "value": float(v)} for s in range(steps)
                    for k, v in (("entropy/mean", rng.random()), ("pass@1", rng.random()))]
            futures.append(store.write(run_id, Records(scalars=scalars_table(rows))))
        for fut in futures:
            fut.result()
        reader = store.reader

        def per_run(i: int) -> None:
            for rid in reader.list_runs()["run_id"]:
                reader.read_scalars(rid, keys=["entropy/mean", "pass@1"], downsample=SPARK_POINTS)
        return {"runs": runs, "steps_per_run": steps,
                "table_refresh": p95_ms(lambda i: runs_rows(reader), repeats),
                "one_read_per_run_before": p95_ms(per_run, max(1, repeats // 5))}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10_000)
    parser.add_argument("--token-rows-per-step", type=int, default=1024,
                        help="1024 x 10,000 steps = 10.24M token rows")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--db", default=None, help="DuckDB file (default: a temp dir)")
    parser.add_argument("--runs", type=int, default=1861,
                        help="runs on the runs-page store (1,861 took 23 s per refresh before)")
    args = parser.parse_args()
    tmp = tempfile.TemporaryDirectory(prefix="forksight-bench-")
    db = args.db or str(Path(tmp.name) / "bench.duckdb")
    with Store(db) as store:
        run_id, took = seed(store, args.steps, args.token_rows_per_step)
        counts = store.reader.row_counts(run_id)
        from forksight.dashboard.app import create_dash
        from forksight.dashboard.pages.tokens import prompt_history, render_step, run_scale

        from forksight.dashboard.data import AppState

        app = create_dash(store.reader)
        reader = store.reader
        app_state = AppState(reader)        # what one dashboard app keeps between callbacks

        def cold(i: int) -> None:           # first open of the run: every read from DuckDB
            draw_run(reader, run_id, Controls())
        draw_cold = p95_ms(cold, max(3, args.repeats // 5))
        smoothings = (0.0, 0.6, 0.9, 0.95)
        draw = p95_ms(lambda i: draw_run(reader, run_id, Controls(smoothing=smoothings[i % 4]),
                                         app_state.run_frames),
                      args.repeats)         # a control change: cached frames + new steps
        state = draw_run(reader, run_id, Controls())["state"]
        full = draw_run(reader, run_id, Controls())
        full_bytes = len(json.dumps(full["figures"], default=str))

        def one_tick(i: int) -> None:
            nonlocal state
            store.write(run_id, step_records(np.random.default_rng(i), state["last_step"] + 1,
                                             args.steps)).result()
            t = time.perf_counter()
            out = tick_run(reader, state, Controls())
            one_tick.ms.append((time.perf_counter() - t) * 1e3)
            state = out["state"]
            one_tick.bytes = len(json.dumps(out["figures"]["entropy"].to_plotly_json()))
        one_tick.ms = []
        for i in range(args.repeats):
            one_tick(i)
        tick = {"p50_ms": round(float(np.percentile(one_tick.ms, 50)), 1),
                "p95_ms": round(float(np.percentile(one_tick.ms, 95)), 1), "n": args.repeats,
                "entropy_patch_bytes": one_tick.bytes}
        steps = reader.token_steps(run_id)
        picks = np.random.default_rng(2).choice(len(steps), args.repeats, replace=False)
        # the page reads a run's colour scale once (its first token steps) and keeps it
        scales = {m: run_scale(reader, run_id, m, steps, app_state.token_rows)
                  for m in ("entropy", "js")}
        tokens = p95_ms(lambda i: render_step(reader, run_id, steps[picks[i]], "0",
                                              ("entropy", "js")[i % 2], app_state.token_rows,
                                              scales[("entropy", "js")[i % 2]],
                                              newest=steps[-1]), args.repeats)
        token_steps = p95_ms(lambda i: reader.token_steps(run_id), max(3, args.repeats // 5))
        token_tick = p95_ms(lambda i: reader.token_steps(run_id, since_step=steps[-1] + 1),
                            args.repeats)   # what the open tokens page asks every second
        history = p95_ms(lambda i: prompt_history(reader, run_id, "12+35=", "entropy",
                                                  cache=app_state.token_rows, all_steps=steps),
                         max(3, args.repeats // 4))
        http = dash_http(app, run_id, args.repeats)
        visible = ingest_to_visible(store, run_id, state, tries=max(5, args.repeats // 2))
    print(json.dumps({
        "run": {"steps": args.steps, "rows": counts, "seed_seconds": {k: round(v, 2)
                                                                      for k, v in took.items()}},
        "run_page_first_open": {**draw_cold, "target_ms": TARGET_CALLBACK_MS,
                                "p95_over_target": round(draw_cold["p95_ms"] /
                                                         TARGET_CALLBACK_MS, 2)},
        "run_page_draw": {**draw, "target_ms": TARGET_CALLBACK_MS,
                          "p95_over_target": round(draw["p95_ms"] / TARGET_CALLBACK_MS, 2),
                          "full_figures_bytes": full_bytes},
        "run_page_draw_http": {**http, "p95_over_target": round(http["p95_ms"] /
                                                                 TARGET_CALLBACK_MS, 2)},
        "run_page_tick": {**tick,
                          "tick_over_first_open_p50": round(tick["p50_ms"] /
                                                            draw_cold["p50_ms"], 3),
                          "patch_over_full_bytes": round(tick["entropy_patch_bytes"] /
                                                         full_bytes, 5)},
        "tokens_page": {**tokens, "target_ms": TARGET_CALLBACK_MS,
                        "p95_over_target": round(tokens["p95_ms"] / TARGET_CALLBACK_MS, 2)},
        "tokens_history_heatmap": history,
        "tokens_page_step_list": token_steps,
        "tokens_page_live_tick": token_tick,
        "ingest_to_visible": visible,
        "runs_page": runs_page(str(Path(tmp.name) / "runs.duckdb"), args.runs, 50,
                               max(3, args.repeats // 4)),
    }, indent=2))
    tmp.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
