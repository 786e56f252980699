"""docs/screenshots/doctor.png: `forksight doctor --format html` on TRL's real collapsing run
(tests/data/trl_logs/collapse, written by bench/doctor_fixtures.py), shot in headless Chromium.

    .venv/bin/python docs/doctor_screenshot.py
"""
from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
SOURCE = HERE.parent / "tests" / "data" / "trl_logs" / "collapse" / "trainer_state.json"


def main() -> int:
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.html"
        subprocess.run([sys.executable, "-m", "forksight", "doctor", str(SOURCE), "--format", "html",
                        "-o", str(report)], check=True)
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path="/usr/bin/chromium",
                                         args=["--headless", "--no-sandbox", "--disable-gpu"])
            page = browser.new_page(viewport={"width": 1200, "height": 1600})
            page.goto(report.as_uri())
            page.wait_for_selector("#chart-0 .main-svg")
            page.screenshot(path=str(HERE / "screenshots" / "doctor.png"), full_page=False)
            browser.close()
    print(HERE / "screenshots" / "doctor.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
