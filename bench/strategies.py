"""A fair comparison of the bundled trainer's token-selection strategies (issue 36): every
strategy × a small lr grid × seeds on two tasks, each cell one `forksight train` subprocess into
its own DuckDB file; each strategy reported at its own best lr, chosen by one rule for all
(strategies_stats.RULE), with means and 95% bootstrap intervals over seeds. Writes JSON
(`cells`, `summary`, `meta`); `bench/strategies_table.py` turns it into the docs' tables.

    python bench/strategies.py [--quick] [--jobs N] [--out docs/strategies.json]

Tasks: `readable` (the demo's preset: worked addition, RL on 4 problems, graded reward; held-out
eval on problems outside the pool) and `arith` (the `healthy` preset: a fresh problem every step).
The default lr grid is each task's preset lr × (1/9, 1/3, 1, 3); --lrs sets one grid for all. A cell
whose result file exists in --work is not rerun (resumable). Its `command` reruns it alone.
A benchmark, not a user feature: hours on 2 cores, and it answers the project's own claim.
"""
from __future__ import annotations

import argparse
import concurrent.futures as futures
import datetime as dt
import json
import os
import platform
import shlex
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from strategies_figures import figures  # noqa: E402
from strategies_stats import RESAMPLES, RULE, summarise  # noqa: E402
from forksight.trainer.config import DISTILL_STRATEGIES, PRESETS, STRATEGIES  # noqa: E402


@dataclass(frozen=True)
class TaskSpec:
    """One task of the sweep: the preset it starts from and what the sweep sets on top."""

    preset: str
    steps: int
    eval_every: int
    about: str
    flags: tuple[str, ...] = ()


TASKS: dict[str, TaskSpec] = {
    "readable": TaskSpec("readable", PRESETS["readable"]["steps"], 25,
                         "the demo's preset: worked addition, RL on 4 problems (graded reward), held-out eval "
                         "on problems outside the pool"),
    "arith": TaskSpec("healthy", PRESETS["healthy"]["steps"], 25,
                      "the healthy preset: two-digit addition, a fresh problem every step",
                      # the preset's 180 s warm-up budget ran out at pass@1 0.0 on 2 busy cores (measured):
                      # the warm start would depend on the machine's load; 900 s as readable has
                      ("--warmup-max-seconds", "900")),
}
LR_FACTORS = (1 / 9, 1 / 3, 1.0, 3.0)
SEEDS = (0, 1, 2)
# --quick: the plumbing in minutes (no warm-up, a small batch, a few steps); not a measurement
QUICK_FLAGS = ("--no-warmup", "--prompts-per-step", "2", "--group-size", "4", "--eval-problems", "4")
QUICK_STEPS, QUICK_EVAL_EVERY = 4, 2
QUICK_STRATEGIES = tuple(s for s in STRATEGIES if s not in DISTILL_STRATEGIES)  # no teacher warm-up


@dataclass(frozen=True)
class Cell:
    task: str
    strategy: str
    lr: float
    seed: int

    @property
    def name(self) -> str:
        return f"{self.task}-{self.strategy}-lr{self.lr:g}-s{self.seed}"


def default_lrs(task: str) -> list[float]:
    """The task preset's lr × LR_FACTORS, to 3 significant digits."""
    base = PRESETS[TASKS[task].preset]["lr"]
    return [float(f"{base * f:.3g}") for f in LR_FACTORS]


def command(cell: Cell, work: Path, steps: int, eval_every: int, threads: int, quick: bool) -> list[str]:
    """The exact command line that trains this cell alone (env prefix included)."""
    spec = TASKS[cell.task]
    db = work / f"{cell.name}.duckdb"
    return [f"OMP_NUM_THREADS={threads}", "forksight", "train", "--preset", spec.preset,
            "--strategy", cell.strategy, "--lr", f"{cell.lr:g}", "--seed", str(cell.seed),
            "--steps", str(steps), "--eval-every", str(eval_every), *spec.flags, *(QUICK_FLAGS if quick else ()),
            "--db", str(db), "--run", cell.name, "--out-dir", str(work / "runs"), "--no-progress"]


def _executable() -> str:
    """This interpreter's `forksight` script (the venv's), else the one on PATH."""
    here = Path(sys.executable).parent / "forksight"
    found = str(here) if here.exists() else shutil.which("forksight")
    if not found:
        raise SystemExit("bench/strategies: no `forksight` command found: install the package (make setup)")
    return found


def execute(argv: list[str], log: Path) -> None:
    """Run a command line as `command` writes it (VAR=value prefix, then `forksight ...`)."""
    env = dict(os.environ)
    while argv and "=" in argv[0] and not argv[0].startswith("-"):
        key, value = argv[0].split("=", 1)
        env[key], argv = value, argv[1:]
    argv = [_executable(), *argv[1:]] if argv and argv[0] == "forksight" else argv
    with open(log, "w") as out:
        done = subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT, env=env)
    if done.returncode:
        tail = log.read_text()[-1500:]
        raise RuntimeError(f"`{shlex.join(argv)}` exited {done.returncode}; log {log}:\n{tail}")


def warmup_info(task: str, seed: int, base: Path | None = None) -> dict | None:
    """The cached warm-up a cell of this task and seed started from: whether it reached its
    target pass@1 within its time budget (a run that did not starts from a weaker model). One
    thread at a time: transformers' lazy imports are not thread-safe (two cells finishing together
    failed with "cannot import name 'Qwen2Config'")."""
    with _WARMUP_LOCK:
        return _warmup_info(task, seed, base)


_WARMUP_LOCK = threading.Lock()


def _warmup_info(task: str, seed: int, base: Path | None) -> dict | None:
    from forksight.trainer.config import load_config
    from forksight.trainer.model import build_tiny
    from forksight.trainer.tasks import make_task
    from forksight.trainer.warmup import warm_path

    cfg = load_config(preset=TASKS[task].preset)
    spec = make_task(cfg.task, level=cfg.level, reverse=cfg.reverse, graded=cfg.graded)
    info = warm_path(base or build_tiny(), spec, cfg.warmup_pass, cfg.warmup_loss, seed) / "warmup.json"
    if not info.exists():
        return None
    data = json.loads(info.read_text())
    return {"warmup_reached": bool(data.get("reached")), "warmup_pass1": data.get("pass@1"),
            "warmup_seconds": data.get("seconds")}


def read_cell(db: Path, run: str) -> dict:
    """Figures of the run named `run` in its DuckDB file."""
    from forksight.monitor.collector.store import Store

    with Store(str(db)) as store:
        runs = store.reader.list_runs()
        match = runs[runs.name == run]
        if match.empty:
            raise RuntimeError(f"{db} holds no run named {run!r}: the cell did not log")
        run_id = str(match.run_id.iloc[0])
        scalars = store.reader.read_scalars(run_id, downsample=1_000_000)
        alerts = store.reader.read_alerts(run_id)
    rows = {int(s): dict(zip(g.key, g.value)) for s, g in scalars.groupby("step")}
    return figures(rows, alerts.to_dict("records"))


def run_cell(cell: Cell, work: Path, steps: int, eval_every: int, threads: int, quick: bool) -> dict:
    """Train one cell (unless its result exists) and return its record."""
    result = work / f"{cell.name}.json"
    if result.exists():
        return json.loads(result.read_text())
    db = work / f"{cell.name}.duckdb"
    for stale in (db, *(db.with_suffix(f".duckdb.{x}") for x in ("wal", "rows"))):  # an interrupted attempt
        stale.unlink(missing_ok=True)
    shutil.rmtree(work / "runs" / cell.name, ignore_errors=True)
    argv = command(cell, work, steps, eval_every, threads, quick)
    started = time.perf_counter()
    execute(argv, work / f"{cell.name}.log")
    record = {"task": cell.task, "strategy": cell.strategy, "lr": cell.lr, "seed": cell.seed,
              "command": shlex.join(argv), "seconds": round(time.perf_counter() - started, 1),
              **read_cell(db, cell.name)}
    if not quick:  # --quick trains from the un-warmed model
        record.update(warmup_info(cell.task, cell.seed) or {"warmup_reached": None})
        if record["warmup_reached"] is False:
            print(f"bench/strategies: WARNING {cell.name} started from a warm-up that stopped at pass@1 "
                  f"{record['warmup_pass1']} short of its target (time budget): rerun the cell (delete its "
                  ".json; the trainer warms up again), on a less loaded machine", file=sys.stderr, flush=True)
    tmp = result.with_suffix(".tmp")
    tmp.write_text(json.dumps(record, indent=1))
    tmp.replace(result)  # written last: a result file means a finished, read cell
    return record


class Progress:
    """Cells done of all, the rate and an ETA on stderr (stdout stays free)."""

    def __init__(self, total: int, jobs: int) -> None:
        self.total, self.jobs, self.done, self.ran = total, jobs, 0, []
        self.started, self.lock = time.perf_counter(), threading.Lock()

    def update(self, record: dict, reused: bool) -> None:
        with self.lock:
            self.done += 1
            if not reused:
                self.ran.append(record["seconds"])
            left = self.total - self.done
            per = sum(self.ran) / len(self.ran) if self.ran else 0.0
            eta = left * per / self.jobs
            bar = "#" * int(30 * self.done / self.total)
            took = "reused" if reused else f"{record['seconds']:.0f}s"
            print(f"[{bar:<30}] {self.done}/{self.total} {record['task']}/{record['strategy']} lr "
                  f"{record['lr']:g} s{record['seed']}: {took}; "
                  f"{per:.0f}s/cell, ETA {dt.timedelta(seconds=round(eta))}", file=sys.stderr, flush=True)


def sweep(cells: list[Cell], work: Path, steps: dict[str, int], eval_every: dict[str, int], jobs: int,
          quick: bool) -> list[dict]:
    """Every cell, up to `jobs` at a time (each with cores/jobs threads); records in cell order."""
    work.mkdir(parents=True, exist_ok=True)
    threads = max(1, (os.cpu_count() or 1) // jobs)
    progress = Progress(len(cells), jobs)
    records: dict[Cell, dict] = {}
    with futures.ThreadPoolExecutor(max_workers=jobs) as pool:
        pending = {}
        for cell in cells:
            reused = (work / f"{cell.name}.json").exists()
            pending[pool.submit(run_cell, cell, work, steps[cell.task], eval_every[cell.task], threads,
                                quick)] = (cell, reused)
        failures = []
        for future in futures.as_completed(pending):
            cell, reused = pending[future]
            try:
                records[cell] = future.result()
            except Exception as exc:  # one failed cell must not lose the others: report them all
                failures.append(f"{cell.name}: {exc}")
                continue
            progress.update(records[cell], reused)
    if failures:
        raise SystemExit("bench/strategies: cells failed (rerun to retry only these):\n" + "\n".join(failures))
    return [records[c] for c in cells]


def _csv(text: str, kind=str) -> list:
    return [kind(x) for x in text.split(",") if x.strip()]


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--strategies", type=_csv, help=f"comma-separated; default all: {','.join(STRATEGIES)} "
                        f"(--quick: {','.join(QUICK_STRATEGIES)})")
    parser.add_argument("--lrs", type=lambda t: _csv(t, float),
                        help="comma-separated lrs for every task; default each preset's lr × 1/9, 1/3, 1, 3")
    parser.add_argument("--seeds", type=lambda t: _csv(t, int), help="comma-separated; default 0,1,2")
    parser.add_argument("--steps", type=int, help="RL steps per cell; default each preset's (readable 300, arith 200)")
    parser.add_argument("--tasks", type=_csv, default=list(TASKS), help=f"comma-separated of {','.join(TASKS)}")
    parser.add_argument("--task-strategies", action="append", default=[], metavar="TASK=S1,S2",
                        help="this task's strategies instead of --strategies' (repeatable), e.g. "
                             "arith=all,fork,ict,random,stapo")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="cells run at once (default: cores)")
    parser.add_argument("--out", default="docs/strategies.json", help="JSON written here")
    parser.add_argument("--work", default="runs/strategies", help="cells' DuckDB files, logs and results (resume)")
    parser.add_argument("--quick", action="store_true",
                        help=f"smoke run: {QUICK_STEPS} steps, no warm-up, a small batch, 1 lr, seeds 0,1")
    parser.add_argument("--resamples", type=int, default=RESAMPLES, help="bootstrap resamples")
    args = parser.parse_args(argv)
    per_task = {}
    for item in args.task_strategies:
        task, sep, names = item.partition("=")
        if not sep or not _csv(names):
            parser.error(f"--task-strategies {item!r}: write TASK=S1,S2, e.g. arith=all,fork")
        per_task[task.strip()] = _csv(names)
    args.task_strategies = per_task
    bad = [t for t in [*args.tasks, *per_task] if t not in TASKS] + \
        [s for s in [*(args.strategies or ()), *(x for v in per_task.values() for x in v)] if s not in STRATEGIES]
    if bad:
        parser.error(f"unknown task/strategy {', '.join(bad)}: tasks are {', '.join(TASKS)}, "
                     f"strategies {', '.join(STRATEGIES)}")
    if args.jobs < 1 or (args.steps is not None and args.steps < 1) or any(x <= 0 for x in args.lrs or ()):
        parser.error("--jobs and --steps must be at least 1 and every lr positive")
    return args


def main(argv: list[str] | None = None) -> dict:
    args = parse(argv)
    started = time.perf_counter()
    strategies = args.strategies or list(QUICK_STRATEGIES if args.quick else STRATEGIES)
    seeds = args.seeds or ([0, 1] if args.quick else list(SEEDS))
    lrs = {t: args.lrs or ([PRESETS[TASKS[t].preset]["lr"]] if args.quick else default_lrs(t)) for t in args.tasks}
    steps = {t: args.steps or (QUICK_STEPS if args.quick else TASKS[t].steps) for t in args.tasks}
    every = {t: QUICK_EVAL_EVERY if args.quick else min(TASKS[t].eval_every, steps[t]) for t in args.tasks}
    of_task = {t: args.task_strategies.get(t, strategies) for t in args.tasks}
    cells = [Cell(t, s, lr, seed) for t in args.tasks for s in of_task[t] for lr in lrs[t] for seed in seeds]
    print(f"bench/strategies: {len(cells)} cells ({', '.join(f'{t}: {len(of_task[t])} strategies' for t in args.tasks)}"
          f" × lrs × {len(seeds)} seeds), {args.jobs} at a time, in {args.work}", file=sys.stderr, flush=True)
    records = sweep(cells, Path(args.work), steps, every, args.jobs, args.quick)
    report = {
        "meta": {"date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
                 "machine": {"node": platform.node(), "cpus": os.cpu_count(), "processor": platform.processor(),
                             "python": platform.python_version()},
                 "commit": _commit(), "quick": args.quick, "tasks": {t: {**vars(TASKS[t]), "flags": list(TASKS[t].flags)} for t in args.tasks},
                 "steps": steps, "eval_every": every,
                 "grid": {"strategies": strategies, "strategies_of_task": of_task, "lrs": lrs, "seeds": seeds},
                 "rule": RULE, "interval": f"95% percentile bootstrap over seeds, {args.resamples} resamples "
                 f"(numpy, seed 0); with {len(seeds)} seeds it is coarse (few distinct resample means)",
                 "windows": "train reward/entropy/fork share: mean of the first/last 10 steps, peak = best 10-step "
                 "rolling mean; eval: the first/best/last evaluation logged (each cell's eval_steps; the first is the "
                 "base model's, step 0, where the trainer evaluates before training)",
                 "collapse": "collapse_step: first critical entropy_collapse alert; collapse_warning_step: its "
                 "first warning; collapse_step_floor: first step whose raw entropy is under the detector's floor "
                 "max(0.05, 0.1 × mean of the first 10 steps); summaries average over the seeds that collapsed",
                 "jobs": args.jobs, "wall_seconds": round(time.perf_counter() - started, 1),
                 "cell_seconds_total": round(sum(r["seconds"] for r in records), 1)},
        "summary": summarise(records, args.resamples),
        "cells": records,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1) + "\n")
    print(f"bench/strategies: wrote {out}", file=sys.stderr)
    return report


def _commit() -> str | None:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                              cwd=Path(__file__).resolve().parents[1], timeout=10).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


if __name__ == "__main__":
    main()
