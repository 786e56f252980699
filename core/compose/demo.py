"""`forksight demo`: the whole product in one command. Starts the collector with the dashboard
on 127.0.0.1:8050, prepares the tiny model once, then trains `all` (plain GRPO), `fork` and `ict`
side by side with one task and seed, each at the learning rate the strategy sweep found best for
it (trainer/fair_settings.json; --lr preset: the preset's one lr) — three processes streaming to
one collector — printing one status line per run until the runs end or Ctrl-C.

The default preset is `readable`: the tiny model, warm-started (cached) on addition worked in
words and digits, trained on four problems with a graded reward. As the sweep measured (3 seeds,
docs/strategies.json), held-out pass@8 falls with the lr for every strategy, so each trains at the
grid's smallest, 5.56e-5: there no run of the demo's seed collapses within 300 steps, and the cost
shows on held-out problems (plain GRPO's pass@8 0.88 -> 0.69, fork 0.75, ICT 0.41, its train
reward falling too). `--lr preset` (5e-4 for all) shows plain GRPO collapse at step 222;
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
from pathlib import Path

from forksight.base.interfaces import Reader
from forksight.compose.serve_cli import DEMO_DB, port_in_use


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Register `forksight demo`."""
    parser = subparsers.add_parser(
        "demo", help="Train all/fork/ict side by side on the tiny model, live in the dashboard.",
        description="Starts a collector with the dashboard, then three training processes.")
    parser.add_argument("--db", default=DEMO_DB, help="DuckDB file of the demo.")
    parser.add_argument("--host", default="127.0.0.1", help="Collector address (loopback).")
    parser.add_argument("--port", type=int, default=8050, help="Collector port.")
    parser.add_argument("--preset", default="readable",
                        help="Trainer preset every run starts from: readable (default; addition "
                             "worked in words and digits by the warm-started tiny model, fork tokens "
                             "on the digits it computes; with --lr preset plain GRPO collapses first) or collapse "
                             "(45 s, a random-init model: byte noise for text); see `forksight train --help`.")
    parser.add_argument("--steps", type=int, default=None,
                        help="RL steps per run (default: the preset's; readable 300, collapse 100).")
    parser.add_argument("--strategies", default="all,fork,ict",
                        help="Comma-separated strategies to train side by side.")
    parser.add_argument("--seed", type=int, default=0, help="One seed for every run.")
    parser.add_argument("--lr", choices=("fair", "preset"), default="fair",
                        help="fair (default): each strategy at the learning rate the strategy sweep chose "
                             "for it on this preset's task (bench/strategies.py, docs/strategies.json); "
                             "preset: the preset's one lr for all. A --train-arg lr=X overrides both.")
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


def _lr_of(strategy: str, args: argparse.Namespace) -> float | None:
    """The lr the strategy trains at in the demo: its fair one (None: the preset's)."""
    from forksight.trainer.fair import fair_lr

    return fair_lr(args.preset, strategy) if getattr(args, "lr", "fair") == "fair" else None


def _train_argv(strategy: str, args: argparse.Namespace, url: str) -> list[str]:
    argv = [sys.executable, "-m", "forksight", "train", "--preset", args.preset,
            "--strategy", strategy, "--seed", str(args.seed),
            "--url", url, "--run", f"demo-{strategy}", "--no-progress"]
    if args.steps is not None:
        argv += ["--steps", str(args.steps)]
    extra: dict[str, str] = {}
    lr = _lr_of(strategy, args)
    if lr is not None:
        extra["lr"] = f"{lr:g}"
    for item in args.train_arg:
        key, _, value = item.partition("=")
        extra[key.strip().lstrip("-").replace("-", "_")] = value
    for key, value in extra.items():
        argv += [f"--{key.replace('_', '-')}", value]
    return argv


def _status_line(reader: Reader, run_id: str, proc: subprocess.Popen) -> str:
    df = reader.read_scalars(run_id, ["entropy/mean", "reward/mean", "pass@1"], downsample=2)
    latest = {k: (int(g.step.iloc[-1]), float(g.value.iloc[-1])) for k, g in df.groupby("key")}
    step = max((v[0] for v in latest.values()), default=None)
    alerts = reader.read_alerts(run_id)
    state = "running" if proc.poll() is None else ("done" if proc.returncode == 0 else f"exit {proc.returncode}")

    def fmt(key: str) -> str:
        return f"{latest[key][1]:.3f}" if key in latest else "-"

    last_alert = f"  ALERT {alerts.detector.iloc[-1]} ({alerts.severity.iloc[-1]})" if len(alerts) else ""
    return (f"  {run_id:<12} {state:<8} step {step if step is not None else '-':>4}  "
            f"H {fmt('entropy/mean'):>6}  reward {fmt('reward/mean'):>6}  pass@1 {fmt('pass@1'):>6}"
            f"{last_alert}")


def _run_ids(reader: Reader, procs: dict) -> dict[str, str]:
    """Run name → the newest run id with that name (a rerun on the same file gets name-2…)."""
    runs = reader.list_runs().sort_values("created_at")
    return {name: runs.run_id[runs.name == name].iloc[-1] for name in procs if (runs.name == name).any()}


def _prepare_models(args: argparse.Namespace) -> None:
    """Warm up once here so the three trainers start from the same cached model at once."""
    from forksight.trainer.config import load_config
    from forksight.trainer.loop import resolve_models
    from forksight.trainer.tasks import make_task

    config = load_config(None, args.preset, {"seed": args.seed})
    task = make_task(config.task, level=config.level, reverse=config.reverse, path=config.task_path,
                     graded=config.graded)
    print("forksight demo: preparing the tiny model and its warm-up (cached after the first run)")
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
    try:
        _prepare_models(args)
        if stop.is_set():
            return 0
        env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONUNBUFFERED="1")
        for strategy in strategies:
            log_file = open(log_dir / f"{strategy}.log", "w")
            procs[f"demo-{strategy}"] = subprocess.Popen(
                _train_argv(strategy, args, collector.url), env=env, stdout=log_file,
                stderr=subprocess.STDOUT,
                # own session: a terminal Ctrl-C reaches only the demo, which then sends each
                # trainer exactly one SIGINT (a second one would cut its checkpoint and flush)
                start_new_session=True)
        lrs = {s: _lr_of(s, args) for s in strategies}
        fair = ", ".join(f"{s} {lr:g}" for s, lr in lrs.items() if lr is not None)
        print(f"forksight demo: training {', '.join(strategies)} "
              f"(logs in {log_dir}/); first data in the dashboard within seconds", flush=True)
        if fair:
            print(f"forksight demo: each at the lr the strategy sweep found best for it (docs/strategies.json): "
                  f"{fair}; --lr preset trains all at the preset's", flush=True)
        reader = collector.store.reader
        while not stop.wait(3):
            ids = _run_ids(reader, procs)
            lines = [_status_line(reader, ids[name], proc) if name in ids else f"  {name:<12} starting"
                     for name, proc in procs.items()]
            print(f"[{time.monotonic() - started:6.0f}s]\n" + "\n".join(lines), flush=True)
            if args.duration and time.monotonic() - started >= args.duration:
                break
            if all(p.poll() is not None for p in procs.values()):
                print("forksight demo: all runs ended.", flush=True)
                if args.exit_when_done or args.duration:
                    break
                print(f"forksight demo: the dashboard stays up at {collector.url}/ — Ctrl-C to exit.")
                stop.wait()
    finally:
        _stop(procs)
        collector.stop()
    failed = [name for name, p in procs.items() if p.returncode not in (0, -signal.SIGINT, 130)]
    if failed:
        print(f"forksight demo: {', '.join(failed)} failed; see {log_dir}/", file=sys.stderr)
    return 1 if failed else 0
