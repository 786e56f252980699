"""`forksight demo`: the whole product in one command. Starts the collector with the dashboard
on 127.0.0.1:8050, prepares the tiny model once, then trains several runs side by side, one task
and seed, one process each streaming to one collector, one status line per run until they end or
Ctrl-C; at the end it prints a summary per run and writes it as JSON (--summary).

The default preset is `readable`: the tiny model, warm-started (cached) on addition worked in
words and digits, trained on four problems with a graded reward. The default runs (--lr contrast):
plain GRPO (`all`) twice — at the preset's lr (5e-4, a common one: the lr the preset ships with,
chosen by no sweep), where it collapses and forksight warns ahead, and at the lr the strategy sweep
chose for it (trainer/fair_settings.json from docs/strategies.json), where it stays healthy — and
`fork` and `ict` at the sweep's lr. Each run's name says its lr and why (`all-lr5e-4-common`).
Every run evaluates held-out pass@k at step 0 and every 25 steps: the cost of collapse on the run
page. `--lr fair`: every strategy once at the sweep's lr; `--lr preset`: all at the preset's;
`--preset collapse` is the 45-second version on a random-init model.
"""
from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from forksight.base.interfaces import Reader
from forksight.compose.serve_cli import DEMO_DB, port_in_use


# held-out evaluation every this many steps per preset (the strategy sweep's interval): the run
# page's held-out panel, with the base model's score at step 0 as its reference line
EVAL_EVERY = {"readable": 25}


@dataclass(frozen=True)
class DemoRun:
    """One run of the demo: a strategy at an lr, and why that lr (common, sweep's best, preset's, given)."""

    strategy: str
    lr: float
    why: str

    @property
    def name(self) -> str:
        """The run's name, saying the same (a valid run id): all-lr5e-4-common."""
        return f"{self.strategy}-lr{lr_text(self.lr)}-{WHY_SLUG[self.why]}"

    @property
    def label(self) -> str:
        """How the summary and the status lines name it: all · lr 5e-4 (common)."""
        return f"{self.strategy} · lr {lr_text(self.lr)} ({self.why})"


WHY_SLUG = {"common": "common", "sweep's best": "sweep-best", "preset's": "preset", "given": "given"}
WHY_TEXT = {"common": "the preset's lr, as plain GRPO is usually run: a common Adam lr for a model this "
                      "small (1e-4 to 1e-3), chosen by no sweep",
            "sweep's best": "the lr the strategy sweep chose for it (best held-out pass@8, docs/strategies.json)",
            "preset's": "the preset's lr", "given": "the lr given with --train-arg"}


def lr_text(lr: float) -> str:
    """5e-4, 5.56e-5, 3e-3: three significant digits, the exponent without padding."""
    mantissa, exponent = f"{lr:.2e}".split("e")
    return f"{mantissa.rstrip('0').rstrip('.')}e{int(exponent)}"


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Register `forksight demo`."""
    parser = subparsers.add_parser(
        "demo", help="Train plain GRPO (collapsing and healthy), fork and ict side by side on the tiny "
                     "model, live in the dashboard, then print a summary.",
        description="Starts a collector with the dashboard, then one training process per run; "
                    "prints a summary per run at the end and writes it as JSON.")
    parser.add_argument("--db", default=DEMO_DB, help="DuckDB file of the demo.")
    parser.add_argument("--host", default="127.0.0.1", help="Collector address (loopback).")
    parser.add_argument("--port", type=int, default=8050, help="Collector port.")
    parser.add_argument("--preset", default="readable",
                        help="Trainer preset every run starts from: readable (default; addition "
                             "worked in words and digits by the warm-started tiny model, fork tokens "
                             "on the digits it computes) or collapse "
                             "(45 s, a random-init model: byte noise for text); see `forksight train --help`.")
    parser.add_argument("--steps", type=int, default=None,
                        help="RL steps per run (default: the preset's; readable 300, collapse 100).")
    parser.add_argument("--strategies", default="all,fork,ict",
                        help="Comma-separated strategies to train side by side (the first one is the "
                             "one --lr contrast trains twice).")
    parser.add_argument("--seed", type=int, default=0, help="One seed for every run.")
    parser.add_argument("--lr", choices=("contrast", "fair", "preset"), default="contrast",
                        help="contrast (default): the first strategy (plain GRPO) twice, at the preset's "
                             "lr (a common one, chosen by no sweep: it collapses) and at the lr the strategy "
                             "sweep chose for it (docs/strategies.json), the others at the sweep's lr; "
                             "fair: each strategy once at the sweep's lr; preset: each once at the "
                             "preset's lr. A --train-arg lr=X overrides them all.")
    parser.add_argument("--eval-every", type=int, default=None,
                        help="Held-out pass@k every this many steps and at step 0, the run page's "
                             "held-out panel (default: 25 on readable, the preset's otherwise).")
    parser.add_argument("--summary", default=None, metavar="PATH",
                        help="Write the closing summary as JSON here (default: .forksight/demo/summary.json).")
    parser.add_argument("--duration", type=float, default=0,
                        help="Stop after this many seconds (0 = when the runs end, then keep "
                             "serving the dashboard until Ctrl-C).")
    parser.add_argument("--exit-when-done", action="store_true",
                        help="Exit when the runs end instead of serving the dashboard.")
    parser.add_argument("--train-arg", action="append", default=[], metavar="FLAG=VALUE",
                        help="Extra `forksight train` flag for every run, e.g. --train-arg "
                             "prompts-per-step=4 (repeatable).")
    parser.set_defaults(func=run)
    return parser


def _train_args(args: argparse.Namespace) -> dict[str, str]:
    """--train-arg FLAG=VALUE pairs as {field_name: value}."""
    extra: dict[str, str] = {}
    for item in args.train_arg:
        key, _, value = item.partition("=")
        extra[key.strip().lstrip("-").replace("-", "_")] = value
    return extra


def plan_runs(strategies: list[str], args: argparse.Namespace) -> list[DemoRun]:
    """The demo's runs, in order: which strategy at which lr, and why that lr."""
    from forksight.trainer.config import PRESETS, TrainConfig
    from forksight.trainer.fair import fair_lr

    given = _train_args(args).get("lr")
    if given is not None:
        return [DemoRun(s, float(given), "given") for s in strategies]
    preset_lr = float(PRESETS[args.preset].get("lr", TrainConfig.model_fields["lr"].default))
    runs: list[DemoRun] = []
    for i, strategy in enumerate(strategies):
        swept = fair_lr(args.preset, strategy) if args.lr != "preset" else None
        if swept is None:
            runs.append(DemoRun(strategy, preset_lr, "preset's"))
            continue
        if args.lr == "contrast" and i == 0 and f"{swept:.3g}" != f"{preset_lr:.3g}":
            runs.append(DemoRun(strategy, preset_lr, "common"))
        runs.append(DemoRun(strategy, swept, "sweep's best"))
    return runs


def _eval_every(args: argparse.Namespace) -> int | None:
    """Held-out evaluation interval of every run (None: the preset's own)."""
    return args.eval_every if args.eval_every is not None else EVAL_EVERY.get(args.preset)


def _train_argv(demo_run: DemoRun, args: argparse.Namespace, url: str) -> list[str]:
    argv = [sys.executable, "-m", "forksight", "train", "--preset", args.preset,
            "--strategy", demo_run.strategy, "--seed", str(args.seed),
            "--url", url, "--run", demo_run.name, "--no-progress"]
    if args.steps is not None:
        argv += ["--steps", str(args.steps)]
    extra: dict[str, str] = {"lr": f"{demo_run.lr:g}"}
    eval_every = _eval_every(args)
    if eval_every is not None:
        extra["eval_every"] = str(eval_every)
    extra.update(_train_args(args))
    for key, value in extra.items():
        argv += [f"--{key.replace('_', '-')}", value]
    return argv


def _status_line(reader: Reader, run_id: str, proc: subprocess.Popen, label: str) -> str:
    df = reader.read_scalars(run_id, ["entropy/mean", "reward/mean", "pass@1"], downsample=2)
    latest = {k: (int(g.step.iloc[-1]), float(g.value.iloc[-1])) for k, g in df.groupby("key")}
    step = max((v[0] for v in latest.values()), default=None)
    alerts = reader.read_alerts(run_id)
    state = "running" if proc.poll() is None else ("done" if proc.returncode == 0 else f"exit {proc.returncode}")

    def fmt(key: str) -> str:
        return f"{latest[key][1]:.3f}" if key in latest else "-"

    last_alert = f"  ALERT {alerts.detector.iloc[-1]} ({alerts.severity.iloc[-1]})" if len(alerts) else ""
    return (f"  {label:<33} {state:<8} step {step if step is not None else '-':>4}  "
            f"H {fmt('entropy/mean'):>6}  reward {fmt('reward/mean'):>6}  pass@1 {fmt('pass@1'):>6}"
            f"{last_alert}")


def _run_ids(reader: Reader, procs: dict) -> dict[str, str]:
    """Run name → the newest run id with that name (a rerun on the same file gets name-2…)."""
    runs = reader.list_runs().sort_values("created_at")
    return {name: runs.run_id[runs.name == name].iloc[-1] for name in procs if (runs.name == name).any()}


def _prepare_models(args: argparse.Namespace) -> None:
    """Warm up once here so the trainers start from the same cached model at once."""
    from forksight.trainer.config import load_config
    from forksight.trainer.loop import resolve_models
    from forksight.trainer.tasks import make_task

    config = load_config(None, args.preset, {"seed": args.seed})
    task = make_task(config.task, level=config.level, reverse=config.reverse, path=config.task_path,
                     graded=config.graded)
    print("forksight demo: preparing the tiny model and its warm-up (shipped with forksight: the same "
          "weights on every machine; copied to the cache once)")
    resolve_models(config, task, 0, 1)


def _check_strategies(strategies: list[str]) -> str | None:
    """Why --strategies cannot run (unknown or repeated names, none given), or None."""
    import difflib

    from forksight.trainer.config import STRATEGIES

    if not strategies:
        return f"--strategies is empty; give some of {', '.join(STRATEGIES)} separated by commas"
    for name in strategies:
        if name not in STRATEGIES:
            close = difflib.get_close_matches(name, STRATEGIES, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            return f"unknown strategy {name!r} in --strategies{hint}; choose from {', '.join(STRATEGIES)}"
    repeated = sorted({s for s in strategies if strategies.count(s) > 1})
    if repeated:
        return f"--strategies names {', '.join(repeated)} twice; each strategy trains once (one run each)"
    return None


def _report(reader: Reader, plan: list[DemoRun], procs: dict, args: argparse.Namespace,
            timing: dict[str, float]) -> None:
    """Print the summary of the runs and write it as JSON (--summary)."""
    from forksight.compose.demo_summary import format_summary, summarise, write_summary
    from forksight.trainer.config import PRESETS

    ids = _run_ids(reader, procs)
    rows = [{"name": r.name, "label": r.label, "strategy": r.strategy, "lr": r.lr, "why": r.why,
             "why_text": WHY_TEXT[r.why], "run_id": ids.get(r.name)} for r in plan]
    meta = {"command": " ".join(["forksight", *sys.argv[1:]]), "preset": args.preset, "seed": args.seed,
            "lr_mode": args.lr, "steps": args.steps if args.steps is not None else PRESETS[args.preset].get("steps"),
            "eval_every": _eval_every(args), "train_args": list(args.train_arg),
            **{k: round(v, 1) for k, v in timing.items()}}
    summary = summarise(reader, rows, meta)
    path = write_summary(summary, args.summary or Path(".forksight") / "demo" / "summary.json")
    print(format_summary(summary) + f"(as JSON in {path})", flush=True)


def _stop(procs: dict[str, subprocess.Popen], grace: float = 15.0) -> None:
    for proc in procs.values():
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)  # trainers flush their sinks on KeyboardInterrupt
    deadline = time.monotonic() + grace
    for proc in procs.values():
        try:
            proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def run(args: argparse.Namespace) -> int:
    """Serve, train side by side, report, and shut down cleanly."""
    from forksight.compose.app import Collector

    strategies = [s.strip() for s in args.strategies.split(",") if s.strip()]
    problem = _check_strategies(strategies)
    if not problem:
        try:
            plan = plan_runs(strategies, args)
        except ValueError:
            problem = (f"--train-arg lr={_train_args(args)['lr']} is not a number; give a learning rate "
                       "such as lr=3e-4")
    if problem:              # before the collector, the file or the warm-up
        print(f"forksight demo: {problem}", file=sys.stderr)
        return 2
    busy = port_in_use(args.host, args.port) if args.host.strip() else None
    if busy:
        print(f"forksight demo: port {args.port} on {args.host} is in use ({busy}); is another "
              f"`forksight serve` or demo running? Choose a free port with --port, e.g. --port {args.port + 1}",
              file=sys.stderr)
        return 1
    started = time.monotonic()
    # Ctrl-C / SIGTERM set a flag the loop polls: an exception raised into whatever runs at that
    # moment (a DuckDB query, a print) would skip the clean shutdown below
    stop = threading.Event()

    def on_signal(*_):
        if stop.is_set():      # a second Ctrl-C (e.g. during the warm-up): stop right away
            raise KeyboardInterrupt
        stop.set()
        print("\nforksight demo: stopping after the current step (Ctrl-C again to force)…", flush=True)

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, on_signal)
    try:
        collector = Collector(args.db, host=args.host, port=args.port).start()
    except ValueError:
        print(f"forksight demo: --host {args.host!r} is not loopback; the demo serves loopback only "
              "(e.g. 127.0.0.1). For a collector on the network run `forksight serve --token T`.",
              file=sys.stderr)
        return 2
    except RuntimeError as exc:
        print(f"forksight demo: {exc}. Is another `forksight serve`/demo running? Use --port.",
              file=sys.stderr)
        return 1
    print(f"forksight demo: dashboard at {collector.url}/  (Ctrl-C to stop; data in {args.db})",
          flush=True)
    procs: dict[str, subprocess.Popen] = {}
    log_dir = Path(".forksight") / "demo"
    log_dir.mkdir(parents=True, exist_ok=True)
    reader = collector.store.reader
    timing: dict[str, float] = {}
    reported = False
    try:
        _prepare_models(args)
        if stop.is_set():
            return 0
        timing["prepare_seconds"] = time.monotonic() - started
        env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONUNBUFFERED="1")
        for demo_run in plan:
            log_file = open(log_dir / f"{demo_run.name}.log", "w")
            procs[demo_run.name] = subprocess.Popen(
                _train_argv(demo_run, args, collector.url), env=env, stdout=log_file,
                stderr=subprocess.STDOUT,
                # own session: a terminal Ctrl-C reaches only the demo, which then sends each
                # trainer exactly one SIGINT (a second one would cut its checkpoint and flush)
                start_new_session=True)
        print(f"forksight demo: training {len(plan)} runs side by side (logs in {log_dir}/); first data "
              "in the dashboard within seconds:", flush=True)
        for demo_run in plan:
            print(f"  {demo_run.name:<26} {demo_run.label}: {WHY_TEXT[demo_run.why]}", flush=True)
        labels = {r.name: r.label for r in plan}
        while not stop.wait(3):
            ids = _run_ids(reader, procs)
            lines = [_status_line(reader, ids[name], proc, labels[name]) if name in ids
                     else f"  {labels[name]:<33} starting" for name, proc in procs.items()]
            print(f"[{time.monotonic() - started:6.0f}s]\n" + "\n".join(lines), flush=True)
            if args.duration and time.monotonic() - started >= args.duration:
                break
            if all(p.poll() is not None for p in procs.values()):
                timing["train_seconds"] = time.monotonic() - started - timing["prepare_seconds"]
                print("forksight demo: all runs ended.", flush=True)
                _report(reader, plan, procs, args, timing)
                reported = True
                if args.exit_when_done or args.duration:
                    break
                print(f"forksight demo: the dashboard stays up at {collector.url}/ — Ctrl-C to exit.")
                stop.wait()
    finally:
        _stop(procs)
        if procs and not reported:     # stopped early: the summary of what was trained
            try:
                _report(reader, plan, procs, args, timing)
            except Exception as exc:   # never let the summary keep the collector from stopping
                print(f"forksight demo: no summary ({exc})", file=sys.stderr)
        collector.stop()
    failed = [name for name, p in procs.items() if p.returncode not in (0, -signal.SIGINT, 130)]
    if failed:
        print(f"forksight demo: {', '.join(failed)} failed; see {log_dir}/", file=sys.stderr)
    return 1 if failed else 0
