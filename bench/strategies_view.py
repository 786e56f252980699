"""The sweep in the dashboard: copy the cells of bench/strategies.py's JSON (each strategy at its
chosen lr, or every cell) from their own DuckDB files into one, so `forksight serve` shows them
side by side: the compare page grouped by strategy draws each as a mean with a band over seeds,
each run page its held-out pass@k against the base model's.

    python bench/strategies_view.py docs/strategies.json [--task readable] [--all-lrs] \\
        [--work runs/strategies] [--out runs/strategies-view.duckdb]
    forksight serve --db runs/strategies-view.duckdb
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from forksight.base.tables import TABLES  # noqa: E402

# what a run's pages read; the rollups are copied as the writer kept them (per run)
COPIED = ("runs", "scalars", "histograms", "samples", "tokens", "alerts", "token_steps", "scalar_keys",
          "scalar_rollups", "histogram_rollups")


def chosen_cells(report: dict, task: str | None, all_lrs: bool) -> list[dict]:
    """The report's cells of `task` (every task: None) at each strategy's chosen lr (or all)."""
    summary = report["summary"]
    return [c for c in report["cells"] if (task is None or c["task"] == task)
            and (all_lrs or float(c["lr"]) == float(summary[c["task"]][c["strategy"]]["lr"]))]


def cell_name(cell: dict) -> str:
    return f"{cell['task']}-{cell['strategy']}-lr{cell['lr']:g}-s{cell['seed']}"


def merge(cells: list[dict], work: Path, out: Path) -> dict[str, int]:
    """Copy each cell's file (work/<cell>.duckdb) into `out` (made anew); rows copied per table."""
    import duckdb

    from forksight.monitor.collector.store import Store

    missing = [str(work / f"{cell_name(c)}.duckdb") for c in cells if not (work / f"{cell_name(c)}.duckdb").exists()]
    if missing:
        raise SystemExit(f"bench/strategies_view: no DuckDB file for {len(missing)} cell(s), e.g. {missing[0]}: "
                         "pass the sweep's --work folder, or rerun bench/strategies.py there")
    out.unlink(missing_ok=True)
    Store(str(out)).close()                        # the schema, as a collector makes it
    counts = dict.fromkeys(COPIED, 0)
    conn = duckdb.connect(str(out))
    try:
        for i, cell in enumerate(cells):
            src = str(work / f"{cell_name(cell)}.duckdb").replace("'", "''")
            conn.execute(f"ATTACH '{src}' AS cell (READ_ONLY)")
            try:
                conn.begin()
                for name in COPIED:
                    cols = ", ".join(TABLES[name].names)
                    n = conn.execute(f"INSERT INTO {name} ({cols}) SELECT {cols} FROM cell.{name}").fetchall()[0][0]
                    counts[name] += int(n)
                conn.commit()
            finally:
                conn.execute("DETACH cell")
            print(f"[{i + 1}/{len(cells)}] {cell_name(cell)}", file=sys.stderr, flush=True)
    finally:
        conn.close()
    return counts


def main(argv: list[str] | None = None) -> dict[str, int]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("json", help="bench/strategies.py's output (docs/strategies.json)")
    parser.add_argument("--task", help="only this task's cells (default: every task's)")
    parser.add_argument("--all-lrs", action="store_true", help="every lr, not only each strategy's chosen one")
    parser.add_argument("--work", default="runs/strategies", help="the sweep's --work folder (its DuckDB files)")
    parser.add_argument("--out", default="runs/strategies-view.duckdb", help="the DuckDB file written")
    args = parser.parse_args(argv)
    report = json.loads(Path(args.json).read_text())
    if args.task is not None and args.task not in report["summary"]:
        parser.error(f"--task {args.task!r}: the report has {', '.join(report['summary'])}")
    cells = chosen_cells(report, args.task, args.all_lrs)
    counts = merge(cells, Path(args.work), Path(args.out))
    print(f"bench/strategies_view: {len(cells)} runs in {args.out}; `forksight serve --db {args.out}`",
          file=sys.stderr)
    return counts


if __name__ == "__main__":
    main()
