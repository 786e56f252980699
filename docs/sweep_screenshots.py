"""Regenerate the two screenshots of the strategy sweep (docs/screenshots/, on docs/explanation/strategies.md) from its JSON.

    .venv/bin/python docs/sweep_screenshots.py [--json docs/strategies.json] [--work runs/strategies] \\
        [--task readable] [--out docs/screenshots]

It copies the task's chosen-lr cells of the sweep (their DuckDB files in --work, as
bench/strategies.py left them) into one temporary DuckDB file with bench/strategies_view.py,
serves it with `forksight serve` on a free loopback port, opens two pages in headless Debian
Chromium and writes:

  sweep-compare-seeds.png  the compare page's grouped view: every run of the task (each strategy
                           x 3 seeds), grouped by strategy, mean with a min–max band over seeds;
                           the held-out eval/pass@1 and eval/pass@8 panels added to the default ones
  sweep-run-heldout.png    plain GRPO's (`all`, seed 0) run page: held-out pass@k beside train
                           reward, under the base model's step-0 line

Look at them before committing: a screenshot is for a reader, not a test.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from urllib.parse import quote, urlencode

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

from screenshots import CHROMIUM, CHROMIUM_ARGS, VIEWPORT, list_runs, save, served, settle  # noqa: E402

MAX_GROUPED_RUNS = 36               # dashboard/pages/compare.py: what the grouped view draws at most
HELDOUT_PANELS = ("eval/pass@1", "eval/pass@8")   # added to the compare page's default panels


def build_view(json_path: Path, work: Path, task: str, db: Path) -> None:
    """bench/strategies_view.py: the task's chosen-lr cells, copied into `db`."""
    cmd = [sys.executable, str(ROOT / "bench" / "strategies_view.py"), str(json_path),
           "--task", task, "--work", str(work), "--out", str(db)]
    print("running:", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)


def seed_of(run: dict) -> int | None:
    """The run's seed: its config's, else the `-s<seed>` its name ends with."""
    seed = (run.get("config") or {}).get("seed") if isinstance(run.get("config"), dict) else None
    if seed is None and "-s" in (run.get("name") or ""):
        tail = run["name"].rsplit("-s", 1)[1]
        seed = int(tail) if tail.isdigit() else None
    return seed


def compare_path(run_ids: list[str]) -> str:
    query = urlencode({"runs": ",".join(run_ids), "view": "grouped", "group": "strategy",
                       "band": "minmax"}, safe=",")
    return f"/compare?{query}"


def add_panel(page, key: str) -> None:
    """Pick `key` in the compare page's metrics dropdown and wait until it is drawn."""
    page.click("#cmp-panels")
    page.locator("[role=option]", has=page.locator(f"input[value='{key}']")).click()
    page.keyboard.press("Escape")
    page.wait_for_function("""key => { const gd = document.querySelector('#cmp-figure .js-plotly-plot');
        return gd && gd.data.some(t => t.meta && t.meta.key === key && t.meta.role === 'group-mean'); }""",
                           arg=key, timeout=60_000)


def shoot(url: str, out: Path) -> list[Path]:
    from playwright.sync_api import sync_playwright

    runs = list_runs(url, timeout=30)
    ids = [r["run_id"] for r in sorted(runs, key=lambda r: (r.get("strategy") or "", r.get("name") or ""))]
    if len(ids) > MAX_GROUPED_RUNS:
        raise SystemExit(f"{len(ids)} runs: the grouped view draws at most {MAX_GROUPED_RUNS}")
    strategies = sorted({r.get("strategy") or "–" for r in runs})
    grpo = [r for r in runs if r.get("strategy") == "all" and seed_of(r) == 0]
    if not grpo:
        raise SystemExit("no run of strategy `all` with seed 0 in the view")
    compare = compare_path(ids)
    run = f"/run?run={quote(grpo[0]['run_id'])}"
    written = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport=VIEWPORT)

        print("opening", url + compare, flush=True)
        page.goto(url + compare, timeout=120_000)
        page.wait_for_function("""n => { const gd = document.querySelector('#cmp-figure .js-plotly-plot');
            return gd && new Set(gd.data.filter(t => t.meta && t.meta.role === 'group-mean')
                                        .map(t => t.meta.group)).size >= n; }""",
                               arg=len(strategies), timeout=120_000)
        for key in HELDOUT_PANELS:
            add_panel(page, key)
        page.mouse.move(0, 0)                          # no hover label, no plotly modebar
        settle(page)
        save(page.locator("#cmp-figure"), out / "sweep-compare-seeds.png", written)

        print("opening", url + run, flush=True)
        page.goto(url + run, timeout=120_000)
        page.wait_for_function("""() => { const gd = document.querySelector('#run-heldout .js-plotly-plot');
            return gd && gd.data && gd.data.some(t => (t.name || '').startsWith('held-out')); }""",
                               timeout=120_000)
        page.mouse.move(0, 0)                          # no hover label, no plotly modebar
        settle(page)
        save(page.locator("#run-heldout-wrap"), out / "sweep-run-heldout.png", written)
        browser.close()
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path, default=HERE / "strategies.json",
                        help="bench/strategies.py's report (default: docs/strategies.json)")
    parser.add_argument("--work", type=Path, default=ROOT / "runs" / "strategies",
                        help="the sweep's --work folder, its cells' DuckDB files (default: runs/strategies)")
    parser.add_argument("--task", default="readable", help="the task whose runs are shown (default: readable)")
    parser.add_argument("--out", type=Path, default=HERE / "screenshots", help="output folder")
    args = parser.parse_args(argv)
    tasks = json.loads(args.json.read_text())["summary"]
    if args.task not in tasks:
        parser.error(f"--task {args.task!r}: {args.json} has {', '.join(tasks)}")
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="forksight-sweep-shots-") as tmp:
        db = Path(tmp) / "sweep-view.duckdb"
        build_view(args.json, args.work, args.task, db)
        with served(db) as url:
            shoot(url, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
