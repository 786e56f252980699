"""The performance page (docs/explanation/performance.md), generated from the benchmarks' committed JSON
in docs/bench/ — every figure on it is read from one of those files, none is typed.

    .venv/bin/python bench/alerts.py > docs/bench/alerts.json      # record a benchmark (any in BENCHES)
    .venv/bin/python docs/gen_reference.py                         # then regenerate (`make docs-ref`)

A benchmark without a committed JSON is listed as not recorded, with the command that records it.
"""
from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any, Callable

DOCS = Path(__file__).resolve().parent
BENCH_JSON = DOCS / "bench"

# bench script -> what it measures (the order of the page)
BENCHES = {
    "alerts": "collapse warning lead time and false alarms, synthetic and real runs, beside rlwatch, rlprobe and rldoctor; detector cost per step",
    "alerts_breadth": "the failure classes beyond collapse, each on a real run made to show it: which detectors fire first",
    "storage": "bytes on disk per token row, sample and step, and what `forksight compact` gives back",
    "metrics": "`token_stats` against the fastest log-prob floor, float32 and bfloat16, and its error against float64",
    "ingest": "the store's writer against DuckDB's own Arrow insert, HTTP on loopback, 8 clients, TensorBoard",
    "trainer": "the bundled trainer's step with hooks and streaming against without",
    "trl_overhead": "a TRL GRPO step with the callback against without",
    "verl_overhead": "verl's old-log-prob pass and driver with forksight against bare",
    "mismatch": "a bfloat16 sampler against float32; the mismatch alert's lag on an injected mismatch; capture cost",
    "mismatch_shape": "mismatch capture at Qwen2.5-0.5B's shape against its training step",
    "dashboard": "dashboard pages' latency against store size, up to hundreds of thousands of steps and thousands of runs",
    "browser": "each dashboard page's first open in headless Chromium against a bare Dash page",
    "lake": "what the Iceberg lake costs at ingest, its commit rate, files and snapshots, lake-only pages",
}


def _n(x: Any, digits: int = 3) -> str:
    if x is None:
        return "—"
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, float):
        return f"{x:,.0f}" if abs(x) >= 100 else f"{x:.{digits}g}"
    return f"{x:,}" if isinstance(x, int) else str(x)


def _table(head: list[str], rows: list[list[Any]]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(_n(c) if not isinstance(c, str) else c for c in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def _median(xs: list) -> float | None:
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


# ---------------------------------------------------------------------------- one section per benchmark
def _ours_late(s: dict, part: dict) -> str:
    # late = warned after the collapse (lead < 0); the JSON gives the part's smallest lead and the misses overall
    return f"0 of {part['runs']}" if part["ours_lead_min"] >= 0 and s["runs_missed"] == 0 else "see the JSON"


def alerts(d: dict) -> str:
    s, c = d["synthetic"], d["cost"]
    above, below = s["runs_starting_above_1_nat"], s["runs_starting_below_1_nat"]
    out = [f"Peers: {', '.join(f'{k} {v}' for k, v in d['peers'].items())}.\n\n",
           f"**Synthetic runs** ({s['collapsing_runs']} collapsing, {s['healthy_runs']} healthy, through a real DuckDB "
           "file; lead = steps from the first collapse warning to the ground-truth collapse):\n\n",
           _table(["", "forksight", "rlwatch"], [
               ["lead, min / median (steps)", f"{s['lead_steps']['min']} / {_n(s['lead_steps']['median'])}",
                f"{s['rlwatch_lead_steps']['min']} / {_n(s['rlwatch_lead_steps']['median'])}"],
               ["runs warned ≥ 20 steps ahead", f"{s['runs_with_lead_at_least_20']} of {s['collapsing_runs']}", ""],
               ["late or missed, runs starting above 1 nat", _ours_late(s, above),
                f"{above['rlwatch_late_or_missed']} of {above['runs']}"],
               ["late or missed, runs starting below 1 nat", _ours_late(s, below),
                f"{below['rlwatch_late_or_missed']} of {below['runs']}"],
               ["first warning was a forecast", f"{s['first_warning_was_forecast']} of {s['collapsing_runs']}", ""],
               ["forecast's error at the first warning, median (steps)",
                _n(s["forecast_abs_error_at_first_warning_median"]), ""],
               ["false alarms on healthy runs", str(s["healthy_false_alarms_any_detector"]),
                str(s["healthy_false_alarms_rlwatch"])],
           ]), "\n"]
    real = d.get("real", {}).get("summary")
    if real:
        runs = d["real"].get("runs", [])
        tools = [t for t in real if t != "targets"]
        out.append(f"**Real runs of the tiny model** ({len(runs)} runs: bundled trainer and TRL, collapsing, healthy, "
                   "learning nothing, exploding; lead in steps before the collapse, — = missed):\n\n")
        rows = []
        for tool in tools:
            r = real[tool]
            leads = r["collapse_leads"]
            rows.append([f"`{tool}`", f"{r['collapse_min_lead']} / {_n(_median(leads))}",
                         f"{r['collapses_missed']} of {len(leads)}", r["false_alarms_healthy_and_no_signal"],
                         ", ".join(_n(v) for v in r["explosion_leads"].values())])
        out.append(_table(["tool", "collapse lead, min / median", "collapses missed", "false alarms (healthy, no signal)",
                           "explosion lead per run"], rows) + "\n")
    out.append(f"**Cost**: the detectors take {_n(c['ours_ms_per_step'])} ms per step over a {c['steps']:,}-step run "
               f"with {c['scalars_per_step']} scalars per step (target < {_n(c['target_ms'])} ms).\n")
    return "".join(out)


def alerts_breadth(d: dict) -> str:
    ours = d["scenarios"]["forksight"]
    rows = [[f"`{run}`", info["kind"], ", ".join(f"`{k}` {v}" for k, v in info["first"].items()) or "—"]
            for run, info in ours["runs"].items()]
    out = [_table(["run", "made to show", "forksight's first alerts (step, severity)"], rows)]
    out.append(f"\nFalse alarms across the scenarios: {len(ours['false_alarms'])}.\n")
    return "".join(out)


def storage(d: dict) -> str:
    c = d["compact"]
    rows = [["a token row", _n(d["per_token_row"]["bytes_per_record"])],
            [f"a sample ({d['per_sample']['prompt_chars']}-character prompt, "
             f"{d['per_sample']['completion_chars']}-character completion)", _n(d["per_sample"]["bytes_per_record"])],
            [f"a step's scalars ({d['per_step_scalars_and_histogram']['scalar_keys']} keys) and entropy histogram",
             _n(d["per_step_scalars_and_histogram"]["bytes_per_record"])]]
    ex = d["example_step_bytes"]
    return (_table(["record", "bytes on disk"], rows) +
            f"\nA step logging {ex['token_rows']:,} token rows and {ex['samples']} samples takes {ex['bytes'] / 1e6:.2f} MB. "
            f"`forksight compact` on a {c['steps']:,}-step run of {c['rows_per_step']:,} token rows per step, keeping "
            f"{c['token_steps_kept']} token steps: {c['bytes_before'] / 1e6:.1f} MB → {c['bytes_after'] / 1e6:.1f} MB.\n")


def metrics(d: dict) -> str:
    rows = []
    for r in d["results"]:
        ratio, target, err = r["ratio_to_floor"], r["targets"], r["max_abs_err_vs_float64"]
        met = r["targets_met"]
        rows.append([f"{'×'.join(map(str, r['shape']))}, {r['dtype']}",
                     f"{_n(ratio['token_stats'])}× (≤ {_n(target['token_stats'])}: {_n(met['token_stats'])})",
                     f"{_n(ratio['token_stats_js'])}× (≤ {_n(target['token_stats_js'])}: {_n(met['token_stats_js'])})",
                     f"{_n(ratio['token_stats_eager'])}× / {_n(ratio['token_stats_js_eager'])}×",
                     f"{max(err['fused'].values()):.1e}", ", ".join(r["kernels_run"]) or "eager"])
    return (_table(["shape [B, T, V], dtype", "token_stats / floor (target: met)", "with ICT JS / floor",
                    "eager fallback (without / with JS)", "largest error vs float64", "kernels"], rows) +
            f"\nMedian of {d['repeats']} interleaved rounds, torch {d['torch']}, {d['threads']} thread(s) on a "
            f"{d['cpus']}-CPU machine whose 1-minute load average was {d['load_avg_1min_at_end']:.1f} at the end "
            "(other work ran beside it: ratios, not times, are what carries over).\n")


def generic(d: Any, prefix: str = "") -> list[list[str]]:
    """Every number of a JSON object, flattened to `path | value` rows (for a benchmark without a section)."""
    if isinstance(d, dict):
        return [row for k, v in d.items() for row in generic(v, f"{prefix}{'.' if prefix else ''}{k}")]
    if isinstance(d, list):
        return [row for i, v in enumerate(d) for row in generic(v, f"{prefix}[{i}]")] if len(d) <= 20 else []
    if isinstance(d, (int, float)) and not isinstance(d, bool):
        return [[f"`{prefix}`", _n(d, 4)]]
    return []


SECTIONS: dict[str, Callable[[dict], str]] = {"alerts": alerts, "alerts_breadth": alerts_breadth, "storage": storage,
                                              "metrics": metrics}


def page() -> str:
    out = ["<!-- generated by docs/gen_performance.py from docs/bench/*.json: do not edit, run `make docs-ref` -->\n\n",
           "# Performance\n\n",
           "Every figure on this page is read from a benchmark's JSON output committed in `docs/bench/` "
           "(`python bench/NAME.py > docs/bench/NAME.json`, then `make docs-ref`); ratios are measured side by side "
           "in one run of the script, on the machine that ran it. The strategy comparison has its own page: "
           "[which strategy wins](strategies.md).\n"]
    missing = []
    for name, what in BENCHES.items():
        path = BENCH_JSON / f"{name}.json"
        if not path.exists():
            missing.append((name, what))
            continue
        data = json.loads(path.read_text())
        out.append(f"\n## {name}\n\n`bench/{name}.py`: {what}. Source: `docs/bench/{name}.json`.\n\n")
        section = SECTIONS.get(name)
        out.append(section(data) if section else _table(["figure", "value"], generic(data)))
    if missing:
        out.append("\n## Not recorded in this checkout\n\n"
                   "These benchmarks exist but their output is not committed, so no figure of theirs is shown here:\n\n")
        out.append("".join(f"- `bench/{n}.py`: {w}. Record: `python bench/{n}.py > docs/bench/{n}.json`.\n"
                           for n, w in missing))
    return "".join(out)
