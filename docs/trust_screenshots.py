"""Regenerate the trust-region screenshots (docs/screenshots/trust-run-panel.png, trust-tokens.png)
from a readable-preset run trained four times per rollout batch.

    .venv/bin/python docs/trust_screenshots.py                 # train the run, then shoot
    .venv/bin/python docs/trust_screenshots.py --db runs.duckdb --run NAME   # shoot a stored run

The tokens page is shot in its "binary TV" mode at the stored completion with the most tokens the
ratio clip bound. Look at the images before committing: a screenshot is for a reader, not a test.
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path
from urllib.parse import quote

import httpx

from screenshots import CHROMIUM, CHROMIUM_ARGS, VIEWPORT, save, served, settle

HERE = Path(__file__).resolve().parent
RUN = "readable-4-updates"


def train(db: Path, run: str, steps: int) -> None:
    cmd = [sys.executable, "-m", "forksight", "train", "--preset", "readable", "--updates-per-batch", "4",
           "--steps", str(steps), "--token-groups", "4", "--run", run, "--db", str(db)]
    print("running:", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)


def most_clipped(url: str, run: str) -> tuple[int, int]:
    """(step, sample) of the stored completion with the most clipped tokens."""
    best = (-1, 0, 0)
    for step in httpx.get(f"{url}/api/runs/{run}/token_steps", timeout=30).json():
        rows = httpx.get(f"{url}/api/runs/{run}/tokens", params={"step": step}, timeout=30).json()
        for sample in {r["sample_id"] for r in rows}:
            n = sum(bool(r["clipped"]) for r in rows if r["sample_id"] == sample)
            best = max(best, (n, step, sample))
    return best[1], best[2]


def shoot(url: str, run: str, out: Path) -> list[Path]:
    from playwright.sync_api import sync_playwright

    step, sample = most_clipped(url, run)
    written: list[Path] = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport=VIEWPORT)
        page.goto(f"{url}/run?run={quote(run)}")
        page.wait_for_selector("#run-trust .main-svg", timeout=60_000)
        settle(page)
        save(page.locator("#run-trust-wrap"), out / "trust-run-panel.png", written)
        page.goto(f"{url}/tokens?run={quote(run)}&step={step}&sample={sample}&metric=tv")
        page.wait_for_selector("#tok-main .tok.clip", timeout=60_000)
        settle(page)
        save(page, out / "trust-tokens.png", written, clip={"x": 0, "y": 0, "width": 1400, "height": 760})
        browser.close()
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--db", type=Path, help="a stored file (default: train the run into a temporary one)")
    parser.add_argument("--run", default=RUN)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--out", type=Path, default=HERE / "screenshots")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        db = args.db or Path(tmp) / "runs.duckdb"
        if args.db is None:
            train(db, args.run, args.steps)
        with served(db) as url:
            shoot(url, args.run, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
