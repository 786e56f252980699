"""Regenerate the README's screenshots (docs/screenshots/) from a fresh demo.

    .venv/bin/python docs/screenshots.py                 # fresh `forksight demo`, then shoot
    .venv/bin/python docs/screenshots.py --db forksight-demo.duckdb   # shoot an existing file

It runs `forksight demo --exit-when-done` into a temporary file (unless --db is given), serves
that file with `forksight serve` on a free loopback port, opens each page in headless Debian
Chromium and writes runs.png, run.png, tokens.png, compare.png and alerts.png. Look at them
before committing: a screenshot is for a reader, not a test.
"""
from __future__ import annotations

import argparse
import contextlib
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import quote

import httpx

HERE = Path(__file__).resolve().parent
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu"]
VIEWPORT = {"width": 1400, "height": 1000}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def fresh_demo(db: Path, steps: int | None) -> None:
    """`forksight demo` to the end of its runs, into `db`."""
    cmd = [sys.executable, "-m", "forksight", "demo", "--db", str(db), "--port",
           str(free_port()), "--exit-when-done"] + (["--steps", str(steps)] if steps else [])
    print("running:", " ".join(cmd), flush=True)
    started = time.monotonic()
    subprocess.run(cmd, check=True)
    print(f"demo done in {time.monotonic() - started:.0f} s", flush=True)


def serve(db: Path) -> tuple[subprocess.Popen, str]:
    """`forksight serve` over db on a free port, once /api/health answers."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "forksight", "serve", "--db", str(db),
                             "--port", str(port)])
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/api/health", timeout=2).status_code < 500:
                return proc, url
        except httpx.HTTPError:
            pass
        if proc.poll() is not None:
            raise SystemExit(f"forksight serve exited with {proc.returncode}")
        time.sleep(0.5)
    proc.terminate()
    raise SystemExit("forksight serve did not answer within 120 s")


@contextlib.contextmanager
def served(db: Path):
    """`serve(db)`'s URL for the block; the server stopped after it, whatever happens."""
    proc, url = serve(db)
    try:
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def list_runs(url: str, timeout: float = 10) -> list[dict]:
    """GET /api/runs: the served file's runs, newest first."""
    runs = httpx.get(url + "/api/runs", timeout=timeout).json()
    return runs.get("runs", runs) if isinstance(runs, dict) else runs


def settle(page) -> None:
    """Until the page is idle and plotly's transitions have settled."""
    page.wait_for_load_state("networkidle")
    page.wait_for_timeout(1500)


def save(shot, target: Path, written: list[Path], **kwargs) -> None:
    """shot.screenshot (a page or a locator) to `target`, listed in `written` and said."""
    shot.screenshot(path=str(target), **kwargs)
    written.append(target)
    print("wrote", target, flush=True)


def pick_runs(url: str) -> dict[str, str]:
    """strategy -> run id of the newest run per strategy."""
    out: dict[str, str] = {}
    for run in list_runs(url):                         # newest first
        out.setdefault(run.get("strategy") or "?", run["run_id"])
    return out


def first_forecast_step(url: str, run_id: str) -> int | None:
    """The step of the run's first alert with a forecast (None: no forecast)."""
    rows = httpx.get(url + "/api/alerts", params={"run_id": run_id}, timeout=10).json()
    rows = rows.get("alerts", rows) if isinstance(rows, dict) else rows
    steps = [int(r["step"]) for r in rows if r.get("forecast") is not None]
    return min(steps) if steps else None


def shoot(url: str, out: Path) -> list[Path]:
    from playwright.sync_api import sync_playwright

    runs = pick_runs(url)
    main = runs.get("all") or next(iter(runs.values()))
    compare = ",".join(runs[s] for s in ("all", "fork", "ict") if s in runs) or main
    step = first_forecast_step(url, main)
    at = f"&step={step}" if step is not None else ""
    shots = [("runs.png", "/", "#runs-table td", False),
             ("run.png", f"/run?run={quote(main)}", "#run-heatmap .main-svg", True),
             # the tokens where the collapse was forecast: still diverse, the alert's point
             ("tokens.png", f"/tokens?run={quote(main)}{at}", "#tok-main .tok", False),
             ("compare.png", f"/compare?runs={quote(compare)}", "#cmp-verdicts .chip", True),
             ("alerts.png", "/alerts", ".alerts-table, .empty-note", False)]
    written = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport=VIEWPORT)
        for name, path, ready, full in shots:
            page.goto(url + path)
            page.wait_for_selector(ready, timeout=60_000)
            settle(page)
            save(page, out / name, written, full_page=full)
        browser.close()
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", type=Path, help="shoot this DuckDB file instead of a fresh demo")
    parser.add_argument("--steps", type=int, default=None, help="demo steps per run (default: the preset's)")
    parser.add_argument("--out", type=Path, default=HERE / "screenshots", help="output folder")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="forksight-shots-") as tmp:
        db = args.db
        if db is None:
            db = Path(tmp) / "demo.duckdb"
            fresh_demo(db, args.steps)
        with served(db) as url:
            shoot(url, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
