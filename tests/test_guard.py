"""The collector under hostile HTTP on loopback (real uvicorn, real DuckDB file): no way in on the
tokenless default from other sites or names, bounded bodies on every route, 4xx for malformed
input, and the token kept out of the address bar."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import httpx
import pytest

from collector_util import REPO, InProcessCollector, create_run, free_port
from forksight.base.limits import MAX_BODY_BYTES
from forksight.monitor.collector.guard import is_loopback
from fuzz_util import dash_call

JSON = {"Content-Type": "application/json"}


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    with InProcessCollector(tmp_path_factory.mktemp("guard") / "g.duckdb") as server:
        yield server



def _run_names(http) -> list[str]:
    return sorted(r["name"] for r in http.get("/api/runs").json())


def _over_limit_chunks():
    """Valid JSON whitespace, one MiB a chunk, past the limit, with no Content-Length."""
    for _ in range(MAX_BODY_BYTES // (1 << 20) + 2):
        yield b" " * (1 << 20)


# ---------------------------------------------------------------------------- binding
def test_empty_host_means_every_interface_and_needs_a_token(tmp_path):
    assert not is_loopback("") and not is_loopback("0.0.0.0") and not is_loopback("::")
    assert is_loopback("127.0.0.1") and is_loopback("localhost") and is_loopback("::1")
    from forksight.compose.app import Collector

    with pytest.raises(ValueError, match="--token"):
        Collector(str(tmp_path / "c.duckdb"), host="", port=free_port())
    db = tmp_path / "s.duckdb"
    out = subprocess.run([sys.executable, "-m", "forksight", "serve", "--db", str(db), "--host", "",
                          "--port", str(free_port()), "--no-dashboard"], cwd=REPO, capture_output=True,
                         text=True, timeout=60, env={k: v for k, v in os.environ.items() if k != "FORKSIGHT_TOKEN"})
    assert out.returncode == 2 and "every interface" in out.stderr and "--token" in out.stderr
    assert not db.exists()


# ---------------------------------------------------------------------------- body limit
@pytest.mark.parametrize("method, path", [("POST", "/api/runs"), ("PATCH", "/api/runs/{run}")])
def test_chunked_bodies_past_the_limit_get_413_on_every_route(http, method, path):
    run = create_run(http, f"chunked-{method.lower()}")
    before = _run_names(http)
    resp = http.request(method, path.format(run=run), content=_over_limit_chunks(), headers=JSON)
    assert resp.status_code == 413 and str(MAX_BODY_BYTES) in resp.json()["detail"]
    assert http.get("/api/health").status_code == 200
    assert _run_names(http) == before
    assert http.get(f"/api/runs/{run}").json()["status"] == "live"


# ---------------------------------------------------------------------------- other sites, other names
def test_cross_site_writes_need_json_and_store_nothing(http):
    run = create_run(http, "cors-target")
    before = _run_names(http)
    batch = {"batch_id": "x1", "scalars": [{"step": 0, "key": "entropy/mean", "value": 0.0}]}
    plain = http.post("/api/runs", content=json.dumps({"name": "evil"}), headers={"Content-Type": "text/plain"})
    assert plain.status_code == 415 and "application/json" in plain.json()["detail"]
    form = http.post(f"/api/runs/{run}/ingest", content=json.dumps(batch),
                     headers={"Content-Type": "application/x-www-form-urlencoded"})
    assert form.status_code == 415
    bare = http.post(f"/api/runs/{run}/ingest", content=json.dumps(batch).encode())   # no Content-Type
    assert bare.status_code == 400 and "Content-Type" in bare.json()["detail"]
    wrong_kind = http.post(f"/api/runs/{run}/tokens", params={"batch_id": "t1"}, content=b"{}", headers=JSON)
    assert wrong_kind.status_code == 415 and "arrow" in wrong_kind.json()["detail"]
    assert _run_names(http) == before
    assert http.get(f"/api/runs/{run}/counts").json()["scalars"] == 0


def test_foreign_host_or_origin_is_refused_without_a_token(srv, http):
    port = srv.port
    for host in ("evil.example", f"evil.example:{port}", f"127.0.0.1.nip.io:{port}", f"0.0.0.0:{port}",
                 f"evil@127.0.0.1:{port}", f"evil.localhost:{port}", f"127.0.0.2:{port}", f"127.1.2.3:{port}",
                 "localhost", "127.0.0.1", f"localhost:{port + 1}", f"localhost.:{port}"):   # exactly the allowlist
        resp = http.get("/api/runs", headers={"Host": host})
        assert resp.status_code == 403 and "Host" in resp.json()["detail"], host
    for host in (f"127.0.0.1:{port}", f"localhost:{port}", f"LOCALHOST:{port}"):
        assert http.get("/api/runs", headers={"Host": host}).status_code == 200, host
    before = _run_names(http)
    for origin in ("http://evil.example", f"http://evil.example:{port}", "null", f"http://localhost:{port + 1}"):
        resp = http.post("/api/runs", json={"name": "rebound"}, headers={"Origin": origin})
        assert resp.status_code == 403 and "cross-origin" in resp.json()["detail"], origin
    assert _run_names(http) == before
    same = http.post("/api/runs", json={"name": "same-origin"}, headers={"Origin": f"http://127.0.0.1:{port}"})
    assert same.status_code == 201


# ---------------------------------------------------------------------------- malformed reads
def _int_queries(value: int) -> list[tuple[str, str, dict]]:
    return [("scalars", "since_step", {"since_step": value}), ("histograms", "since_step", {"since_step": value}),
            ("tokens", "step", {"step": value}), ("tokens", "sample_id", {"step": 0, "sample_id": value}),
            ("samples", "step", {"step": value}), ("samples", "group_id", {"group_id": value})]


def test_query_integers_beyond_int64_are_422_not_500(http):
    run = create_run(http, "bigints")
    for value in (2**63, 2**130, -(2**63) - 1):
        for route, param, params in _int_queries(value):
            resp = http.get(f"/api/runs/{run}/{route}", params=params)
            assert resp.status_code == 422 and param in resp.json()["detail"], (route, param, resp.text)
        resp = http.get("/api/alerts", params={"since_step": value})
        assert resp.status_code == 422 and "since_step" in resp.json()["detail"]
    for route, _, params in _int_queries(2**63 - 1):
        assert http.get(f"/api/runs/{run}/{route}", params=params).json() == [], route
    assert http.get("/api/alerts", params={"since_step": 2**63 - 1}).json() == []


def test_unknown_runs_are_404_on_every_read_sub_route(http):
    run = create_run(http, "known")
    for route in ("", "/scalar_keys", "/scalars", "/histograms", "/token_steps", "/tokens?step=0",
                  "/samples", "/counts"):
        ghost = http.get(f"/api/runs/ghost-run{route}")
        assert ghost.status_code == 404 and "ghost-run" in ghost.json()["detail"], route
        assert http.get(f"/api/runs/{run}{route}").status_code == 200, route


def test_a_malformed_cookie_header_breaks_nothing_when_a_token_is_set(tmp_path):
    with InProcessCollector(tmp_path / "c.duckdb", token="tok-1") as server:
        url = f"{server.url}/api/runs"
        for cookie in ('a="b; ]]]; ===', "forksight_token", "\x7f\x01=\x02; ;;"):
            refused = httpx.get(url, headers={"Cookie": cookie})
            assert refused.status_code == 401 and refused.headers["www-authenticate"].startswith("Bearer"), cookie
            assert httpx.get(url, headers={"Cookie": cookie, **server.headers}).status_code == 200, cookie
        mixed = httpx.get(url, headers={"Cookie": 'x="; ]]]; forksight_token=tok-1; y'})
        assert mixed.status_code == 200


# ---------------------------------------------------------------------------- the token in the URL
def test_a_browser_opening_token_url_is_redirected_without_it(tmp_path):
    with InProcessCollector(tmp_path / "r.duckdb", token="tok-2") as server:
        with httpx.Client(base_url=server.url) as browser:
            nav = {"Accept": "text/html,application/xhtml+xml", "Sec-Fetch-Mode": "navigate"}
            resp = browser.get("/api/runs", params={"x": "1", "token": "tok-2", "y": "a b"}, headers=nav)
            assert resp.status_code == 303 and resp.headers["location"] == "/api/runs?x=1&y=a+b"
            assert "HttpOnly" in resp.headers["set-cookie"] and "tok-2" not in resp.headers["location"]
            assert browser.get(resp.headers["location"], headers=nav).status_code == 200   # the cookie
            sneaky = browser.get("//evil.example/", params={"token": "tok-2"}, headers=nav)
            assert sneaky.status_code == 303 and not sneaky.headers["location"].startswith("//")
        api = httpx.get(f"{server.url}/api/runs", params={"token": "tok-2"})      # not a browser page
        assert api.status_code == 200
        wrong = httpx.get(f"{server.url}/api/runs", params={"token": "nope"}, headers={"Accept": "text/html"})
        assert wrong.status_code == 401 and "location" not in wrong.headers


# ---------------------------------------------------------------------------- docs and dashboard
def test_docs_load_every_asset_from_the_collector_itself(http):
    page = http.get("/docs")
    assert page.status_code == 200
    assets = re.findall(r"""(?:src|href)=["']([^"']+)["']""", page.text) + \
        re.findall(r"""url:\s*["']([^"']+)["']""", page.text)
    assert assets and all(a.startswith("/") and not a.startswith("//") for a in assets), assets
    for asset in assets:
        resp = http.get(asset)
        assert resp.status_code == 200, asset
    js = next(a for a in assets if a.endswith(".js"))
    assert b"SwaggerUIBundle" in http.get(js).content
    spec = http.get(next(a for a in assets if a.endswith("openapi.json"))).json()
    assert spec["openapi"].startswith("3.")
    # the docs name what each write accepts (the guard refuses any other media type)
    assert set(spec["paths"]["/api/runs/{run_id}/tokens"]["post"]["requestBody"]["content"]) == \
        {"application/vnd.apache.arrow.stream"}
    assert set(spec["paths"]["/api/runs/{run_id}/ingest"]["post"]["requestBody"]["content"]) == {"application/json"}


def test_crafted_dash_callback_payloads_get_4xx_and_a_real_one_still_works(tmp_path):
    with InProcessCollector(tmp_path / "d.duckdb", dashboard=True) as server:
        with httpx.Client(base_url=server.url, timeout=30) as client:
            deps = client.get("/_dash-dependencies").json()
            table = next(d for d in deps if d["output"] == "runs-table.data")
            good = {"output": "runs-table.data", "outputs": {"id": "runs-table", "property": "data"},
                    "inputs": [{"id": i["id"], "property": i["property"], "value": 1} for i in table["inputs"]],
                    "changedPropIds": [], "state": []}
            crafted = [b"{not json", b"[" * 50_000 + b"]" * 50_000, b"null", b"[]", b'"x"', b"{}",
                       json.dumps({"output": 1}).encode(),
                       json.dumps({**good, "output": "nope.children"}).encode(),
                       json.dumps({**good, "inputs": "a"}).encode(),
                       json.dumps({**good, "inputs": [1, 2, 3]}).encode(),
                       json.dumps({**good, "inputs": []}).encode(),
                       json.dumps({**good, "inputs": [{"id": 1}]}).encode(),
                       json.dumps({**good, "outputs": []}).encode(),
                       json.dumps({**good, "outputs": {"id": "other", "property": "data"}}).encode(),
                       json.dumps({**good, "state": "s"}).encode(),
                       json.dumps({**good, "changedPropIds": [1]}).encode()]
            for body in crafted:
                resp = client.post("/_dash-update-component", content=body, headers=JSON)
                assert 400 <= resp.status_code < 500, (body[:80], resp.status_code, resp.text[:200])
            ok = client.post("/_dash-update-component", json=good)
            assert ok.status_code in (200, 204), ok.text[:300]
            for dep in deps:            # well-formed calls with values no browser sends: 4xx, never 5xx
                for value in ("x", {"a": 1}, 2**70, [1, "b"]):
                    resp = client.post("/_dash-update-component", json=dash_call(dep, lambda _: value))
                    assert resp.status_code < 500, (dep["output"][:60], value, resp.text[:200])


def _peak_rss_mb(pid: int) -> float:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmHWM in /proc status")


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads peak RSS from /proc")
def test_a_640_mb_chunked_body_does_not_grow_the_server(tmp_path):
    from collector_util import ServeProcess

    with ServeProcess(tmp_path / "m.duckdb") as server, httpx.Client(base_url=server.url, timeout=60) as http:
        run = create_run(http, "memory")
        before = _peak_rss_mb(server.proc.pid)

        def chunks():
            for _ in range(640):
                yield b" " * (1 << 20)
        for method, path in (("POST", "/api/runs"), ("PATCH", f"/api/runs/{run}")):
            try:
                resp = http.request(method, path, content=chunks(), headers=JSON)
                assert resp.status_code == 413, resp.text
            except httpx.TransportError:
                pass                  # the server answered 413 and closed while we were still sending
        assert http.get("/api/health").status_code == 200
        grown = _peak_rss_mb(server.proc.pid) - before
        assert grown < 3 * MAX_BODY_BYTES / 2**20, f"peak RSS grew {grown:.0f} MB"


def test_websocket_upgrades_are_closed_before_reaching_the_app():
    import asyncio

    from forksight.monitor.collector.guard import GuardMiddleware

    reached, sent = [], []

    async def app(scope, receive, send):
        reached.append(scope)

    async def receive():
        return {"type": "websocket.connect"}

    async def send(message):
        sent.append(message)

    scope = {"type": "websocket", "path": "/", "headers": [(b"host", b"evil.example")]}
    asyncio.run(GuardMiddleware(app, token=None)(scope, receive, send))
    assert reached == [] and sent == [{"type": "websocket.close", "code": 1008}]


def test_a_token_with_cookie_separators_survives_the_cookie_and_an_unusable_one_is_refused(tmp_path):
    from forksight.monitor.collector.guard import check_bind

    token = 'a;b,c="d"\\e%'
    with InProcessCollector(tmp_path / "q.duckdb", token=token) as server:
        with httpx.Client(base_url=server.url) as browser:
            nav = {"Accept": "text/html"}
            resp = browser.get("/api/runs", params={"token": token}, headers=nav)
            assert resp.status_code == 303
            assert browser.get("/api/runs", headers=nav).status_code == 200          # by the cookie alone
    for bad in ("two words", "tab\there", "é-token", "line\nbreak"):
        with pytest.raises(ValueError, match="printable ASCII"):
            check_bind("127.0.0.1", bad)


def test_no_page_of_the_collector_can_be_framed_by_another_site(tmp_path):
    with InProcessCollector(tmp_path / "f.duckdb", dashboard=True) as server:
        for path in ("/", "/api/health", "/docs"):
            headers = httpx.get(server.url + path).headers
            assert headers["x-frame-options"] == "DENY" and "frame-ancestors 'none'" in \
                headers["content-security-policy"], path
            assert headers["x-content-type-options"] == "nosniff", path
