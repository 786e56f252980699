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


def _serve_page(html: str):
    """A second real HTTP server on loopback that serves one page (the attacker's site)."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Page(BaseHTTPRequestHandler):
        def do_GET(self):
            body = html.encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Page)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def test_another_site_and_dns_rebinding_cannot_write_through_the_browser(tmp_path):
    import httpx
    from playwright.sync_api import sync_playwright

    from collector_util import create_run

    chromium = require_browser()
    with InProcessCollector(tmp_path / "x.duckdb") as server, sync_playwright() as pw:
        with httpx.Client(base_url=server.url) as http:
            run = create_run(http, "target")
        batch = ('{"batch_id": "csrf", "scalars": [{"step": 0, "key": "entropy/mean", "value": 0.0}]}')
        attacker = _serve_page(f"""<script>
            fetch("{server.url}/api/runs/{run}/ingest", {{method: "POST", mode: "no-cors",
                  headers: {{"Content-Type": "text/plain"}}, body: '{batch}'}})
              .finally(() => {{ document.title = "sent"; }});
            </script>""")
        # both names resolve to this machine, as a rebinding attacker's DNS would make them
        rules = "MAP attacker.test 127.0.0.1, MAP rebind.test 127.0.0.1"
        browser = pw.chromium.launch(executable_path=chromium, args=[*CHROMIUM_ARGS, f"--host-resolver-rules={rules}"])
        page = browser.new_page()
        page.goto(f"http://attacker.test:{attacker.server_address[1]}/")
        page.wait_for_function("document.title === 'sent'", timeout=30_000)
        rebound = page.goto(f"http://rebind.test:{server.port}/api/runs")
        status = rebound.status
        browser.close()
        attacker.shutdown()
        counts = httpx.get(f"{server.url}/api/runs/{run}/counts").json()
    assert counts["scalars"] == 0
    assert status == 403
