"""`forksight alerts replay`: re-run the detectors over a stored run with other settings, to tune
thresholds on your own history; nothing is written unless --write (which replaces the run's alerts).
"""
from __future__ import annotations

from forksight.base.runconfig import vocab_size_of
from forksight.base.interfaces import Reader
import argparse
import json
import sys

ALL_STEPS = 2**62  # read_scalars' downsample bound: large enough to keep every step


def add_parser(subparsers) -> None:
    """Register `alerts replay` (light: heavy imports happen when it runs)."""
    alerts = subparsers.add_parser("alerts", help="alert tools: replay the detectors on a stored run")
    sub = alerts.add_subparsers(dest="alerts_command", metavar="ACTION")
    replay = sub.add_parser("replay", help="re-run the detectors over a stored run and print the alerts",
                            description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    replay.add_argument("--db", required=True, help="DuckDB file written by forksight (not held by a running collector)")
    replay.add_argument("--run", required=True, help="run id to replay")
    replay.add_argument("--config", help="alert config file (YAML or JSON): {collapse: {floor: 0.1}, ...}")
    replay.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.FIELD=VALUE",
                        help="override one setting, e.g. --set collapse.floor=0.1 (repeatable)")
    replay.add_argument("--vocab-size", type=int, help="vocabulary size for the log|V| ceiling (default: from the run's config)")
    replay.add_argument("--format", choices=("table", "json"), default="table", help="output format")
    replay.add_argument("--write", action="store_true", help="replace the run's stored alerts with the replayed ones")
    replay.set_defaults(func=run_replay)
    alerts.set_defaults(func=lambda args: alerts.print_help() or 2)


def replay_rows(reader: Reader, run_id: str, config, vocab_size: int | None = None) -> tuple[list[dict], int]:
    """Feed every stored step of `run_id` (ranks merged) through a fresh AlertMonitor.

    Returns (alert rows stamped with each step's wall time, number of steps replayed)."""
    from tqdm import tqdm

    from forksight.monitor.alerts.hub import AlertMonitor, alert_row

    frame = reader.read_scalars(run_id, downsample=ALL_STEPS)
    frame = frame.dropna(subset=["value"]).sort_values(["step", "key"])
    monitor = AlertMonitor(config, vocab_size)
    rows: list[dict] = []
    groups = frame.groupby("step", sort=True)
    for step, group in tqdm(groups, total=groups.ngroups, desc=f"replay {run_id}", unit="step",
                            file=sys.stderr, disable=None):
        scalars = dict(zip(group["key"], group["value"].astype(float)))
        wall = float(group["wall_time"].max())
        rows += [alert_row(run_id, alert, wall) for alert in monitor.observe(int(step), scalars)]
    return rows, groups.ngroups


def write_rows(store, run_id: str, rows: list[dict]) -> int:
    """Replace the run's stored alerts with `rows` in one transaction; returns how many were removed."""
    from forksight.base.records import alerts_table
    from forksight.monitor.collector.inserts import insert_arrow

    table = alerts_table(rows)

    def replace(cur) -> int:
        cur.begin()
        try:
            removed = cur.execute("DELETE FROM alerts WHERE run_id = ? RETURNING 1", [run_id]).fetchall()
            if table.num_rows:
                insert_arrow(cur, "alerts", table)
            cur.commit()
        except Exception:
            cur.rollback()
            raise
        return len(removed)

    return store.call(replace)


def _number(value) -> str:
    return f"{value:10.4g}" if isinstance(value, (int, float)) else " " * 10


def format_table(rows: list[dict]) -> str:
    """One header line per alert, then its message and action, indented."""
    if not rows:
        return "no alerts"
    out = [f"{'step':>7}  {'severity':8}  {'detector':17}  {'signal':20}  {'value':>10}  {'threshold':>10}  forecast"]
    for r in rows:
        fc = str(r["forecast"]) if r.get("forecast") is not None else "-"
        signal = r.get("signal") or "-"
        out.append(f"{r['step']:>7}  {r['severity']:8}  {r['detector']:17}  {signal:20}  {_number(r.get('value'))}  "
                   f"{_number(r.get('threshold'))}  {fc}")
        out.append(f"         {r['message']}")
        out.append(f"         action: {r['action']}")
    return "\n".join(out)


def run_replay(args: argparse.Namespace) -> int:
    """Entry of `forksight alerts replay`."""
    from pathlib import Path

    from forksight.monitor.alerts.hub import load_alert_config
    from forksight.monitor.collector.store import Store

    try:
        config = load_alert_config(args.config, args.overrides)
    except (ValueError, FileNotFoundError) as exc:
        print(f"forksight alerts replay: {exc}", file=sys.stderr)
        return 2
    if not Path(args.db).exists():
        print(f"forksight alerts replay: no DuckDB file at {args.db}", file=sys.stderr)
        return 2
    try:
        store = Store(args.db)   # the store alone: opening it runs no alert hub
    except RuntimeError as exc:
        print(f"forksight alerts replay: {exc}", file=sys.stderr)
        return 2
    try:
        if not store.reader.has_run(args.run):
            runs = store.reader.list_runs()["run_id"].tolist()
            print(f"forksight alerts replay: no run {args.run!r} in {args.db}; runs there: "
                  f"{', '.join(runs[:20]) or '(none)'}", file=sys.stderr)
            return 2
        vocab = args.vocab_size or vocab_size_of((store.reader.run(args.run) or {}).get("config"))
        rows, steps = replay_rows(store.reader, args.run, config, vocab)
        if args.format == "json":
            from forksight.monitor.alerts.hub import evidence_of

            print(json.dumps([{**r, "evidence": evidence_of(r)} for r in rows], indent=1))
        else:
            print(format_table(rows))
        critical = sum(r["severity"] == "critical" for r in rows)
        print(f"{len(rows)} alert(s) ({critical} critical) over {steps} step(s) of run {args.run}",
              file=sys.stderr)
        if args.write:
            removed = write_rows(store, args.run, rows)
            print(f"replaced {removed} stored alert(s) of run {args.run} with {len(rows)}", file=sys.stderr)
    finally:
        store.close()
    return 0
