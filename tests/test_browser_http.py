"""The guard as a real headless Chromium meets it: /docs renders offline from the collector's own
assets, and a `?token=` link lands on the dashboard without the token in the address bar."""
from __future__ import annotations

from urllib.parse import urlsplit

import pytest

pytest.importorskip("playwright")
from collector_util import InProcessCollector  # noqa: E402
from conftest import require_browser  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.browser]
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def test_docs_render_every_route_with_no_network(tmp_path):
    from playwright.sync_api import sync_playwright

    chromium = require_browser()
    with InProcessCollector(tmp_path / "docs.duckdb") as server, sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
        page = browser.new_page()
        elsewhere: list[str] = []

        def offline(route):
            if urlsplit(route.request.url).netloc == f"127.0.0.1:{server.port}":
                return route.continue_()
            elsewhere.append(route.request.url)
            return route.abort()
        page.route("**/*", offline)
        page.goto(f"{server.url}/docs")
        page.wait_for_selector(".opblock", timeout=30_000)
        paths = {el.inner_text() for el in page.query_selector_all(".opblock-summary-path")}
        browser.close()
    assert elsewhere == []
    assert {"/api/health", "/api/runs/{run_id}/ingest", "/api/runs/{run_id}/tokens"} <= \
        {p.replace("\u200b", "") for p in paths}, paths


def test_a_token_link_opens_the_dashboard_and_leaves_the_address_bar_clean(tmp_path):
    from playwright.sync_api import sync_playwright

    chromium = require_browser()
    with InProcessCollector(tmp_path / "t.duckdb", token="tok-browser", dashboard=True) as server, \
            sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
        page = browser.new_page()
        refused: list[str] = []
        page.on("response", lambda r: refused.append(r.url) if r.status in (401, 403) else None)
        page.goto(f"{server.url}/run?token=tok-browser")
        page.wait_for_selector(".topbar", timeout=30_000)
        page.wait_for_load_state("networkidle")
        url = page.url
        cookies = page.context.cookies()
        browser.close()
    assert url == f"{server.url}/run" and "tok-browser" not in url
    assert refused == []                          # every later request carried the cookie
    (cookie,) = [c for c in cookies if c["name"] == "forksight_token"]
    assert cookie["httpOnly"] and cookie["sameSite"] == "Lax"
