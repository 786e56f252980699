"""What every browser test module shares: one Chromium context per module (its cache keeps Dash's
bundles between tests) and pages that record console errors and uncaught exceptions."""
from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import pytest

CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                 "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]


@contextmanager
def browser_context(chromium: str, width: int = 1400, height: int = 1000) -> Iterator:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
        ctx = browser.new_context(viewport={"width": width, "height": height})
        try:
            yield ctx
        finally:
            ctx.close()
            browser.close()


@contextmanager
def watched_page(context) -> Iterator:
    """A fresh page; `page.errors` collects console errors and uncaught exceptions."""
    pg = context.new_page()
    pg.errors = []
    pg.on("console", lambda m: pg.errors.append(m.text) if m.type == "error" else None)
    pg.on("pageerror", lambda e: pg.errors.append(str(e)))
    try:
        yield pg
    finally:
        pg.close()


def shots_dir(tmp_path: Path) -> Path:
    """Where a browser test saves its screenshots: $FORKSIGHT_SCREENSHOTS (docs/screenshots to refresh
    the README's), else the test's own temp dir."""
    out = Path(os.environ.get("FORKSIGHT_SCREENSHOTS") or tmp_path)
    out.mkdir(parents=True, exist_ok=True)
    return out


# the fixtures a browser test module gets by importing them; `served` is the module's own fixture:
# (its collector, the chromium path)
@pytest.fixture(scope="module")
def context(served):
    """One browser context per module, over the module's served collector."""
    with browser_context(served[1]) as ctx:
        yield ctx


@pytest.fixture()
def page(context):
    """A fresh page per test, whose console and page errors are watched."""
    with watched_page(context) as pg:
        yield pg
