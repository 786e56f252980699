"""Every dashboard page in a real headless Chromium, first open until its data is drawn, against
the framework's own floor measured in the same run: a minimal Dash page holding one Plotly graph
of 1,000 points, Dash's defaults, served the same way (uvicorn on 127.0.0.1, Flask behind a2wsgi).

Seeds (bench/seed.py) a small file (1,000 steps, 100 runs) and a big one (500,000 steps, 10,000
runs), serves each with `forksight serve`, and opens every page `--rounds` times, each in a fresh
browser context (a cold cache: a first open), the floor page interleaved, from navigation start
until:
  run      every chart holds data up to the run's last step (the heatmap is drawn)
  tokens   the step label names the run's newest token step and the token spans render
  runs     the table shows rows
  alerts   the alert rows (or the empty note) and their count show
  compare  the overlay holds the big run's data up to its last step
Prints JSON: p95 and median per page per size, the ratio of each p95 to the floor's p95 in the
same size's rounds (target <= 1.5x), and where the time goes (medians over rounds): the collector
wait (union of the page's requests to Dash's data endpoints, from Resource Timing), callback
round trips, script and other bytes (on the wire and decoded), the time spent only in the
browser, and Chrome's main-thread task, script and layout time (DevTools Performance domain).

    .venv/bin/python bench/browser.py [--rounds 7] [--sizes small,big] [--db-small F] [--db-big F]
"""
from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import quote, urlparse

import httpx
import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))      # ServeProcess, the browser's flags
sys.path.insert(0, str(HERE))                       # seed.py

CHROMIUM = "/usr/bin/chromium"
TARGET_RATIO = 1.5
FLOOR_POINTS = 1000
SIZES = {"small": {"steps": 1_000, "runs": 100}, "big": {"steps": 500_000, "runs": 10_000}}
PAGES = ("floor", "floor_lean", "run", "tokens", "runs", "alerts", "compare")
DATA_PATHS = ("/_dash-layout", "/_dash-dependencies", "/_dash-update-component")
LOAD_TIMEOUT_MS = 60_000
POLL_MS = 20                    # how often a page is asked whether its data shows

# Each predicate returns performance.now() once the page shows its data, else false (polled
# every POLL_MS). reach(): the largest x any drawn trace of a graph holds.
JS_HELPERS = """
const graph = (id) => document.querySelector('#' + id + ' .js-plotly-plot');
const drawn = (gd) => !!(gd && gd._fullLayout && gd._fullData);
const traced = (gd) => drawn(gd) && gd._fullData.some(t => (t.x && t.x.length) || (t.z && t.z.length));
const reach = (gd) => { let m = -Infinity;
  for (const t of gd._fullData) { const x = t.x; if (!x) continue;
    for (let i = 0; i < x.length; i++) { const v = +x[i]; if (v > m) m = v; } } return m; };
"""
READY = {
    "floor": "const gd = graph('floor-graph'); if (!traced(gd) || gd._fullData[0].x.length !== a.points) return false;",
    "floor_lean": "const gd = graph('floor-graph'); if (!traced(gd) || gd._fullData[0].x.length !== a.points) return false;",
    "run": """const main = graph('run-entropy'); if (!traced(main) || reach(main) < a.last) return false;
      for (const id of ['run-passk', 'run-signals']) { const gd = graph(id);
        if (!drawn(gd) || (traced(gd) && reach(gd) < a.last)) return false; }
      if (!traced(graph('run-heatmap'))) return false;""",
    "tokens": """const label = document.getElementById('tok-step-label');
      if (!label || label.textContent !== 'step ' + a.last_token_step) return false;
      if (!document.querySelector('#tok-main .tok')) return false;""",
    "runs": "if (document.querySelectorAll('#runs-table td[data-dash-column=\"name\"]').length < a.rows) return false;",
    "alerts": """const count = document.getElementById('alerts-count');
      if (!count || !count.textContent) return false;
      if (!document.querySelector('#alerts-table .alert-row, #alerts-table .empty-note')) return false;""",
    "compare": "const gd = graph('cmp-figure'); if (!traced(gd) || reach(gd) < a.last) return false;",
}
RESOURCES_JS = """() => [...performance.getEntriesByType('navigation'), ...performance.getEntriesByType('resource')]
  .map(e => ({name: e.name, start: e.startTime, end: e.responseEnd, wire: e.transferSize,
              body: e.encodedBodySize, decoded: e.decodedBodySize}))"""


def floor_app(lean: bool = False):
    """The floor: a minimal Dash page, one Plotly graph of FLOOR_POINTS points, Dash's defaults.
    lean: the same page with the dashboard's own serving choices (its plotly.js bundle and
    assets, at /lean/), to show how much of a page's time the framework leaves."""
    import plotly.graph_objects as go
    from dash import Dash, dcc, html

    x = np.arange(FLOOR_POINTS)
    fig = go.Figure(go.Scatter(x=x, y=np.sin(x / 50.0), mode="lines"))
    lean_args = {"assets_folder": str(HERE.parent / "dashboard" / "assets"),
                 "routes_pathname_prefix": "/", "requests_pathname_prefix": "/lean/"} if lean else {}
    app = Dash(__name__, title="floor", **lean_args)
    app.layout = html.Div([dcc.Graph(id="floor-graph", figure=fig)])
    return app


def serve_floor(port: int) -> None:
    """Serve the floor as `forksight serve` serves the dashboard: Dash's Flask app behind a2wsgi,
    mounted in a FastAPI app, run by uvicorn on 127.0.0.1."""
    import uvicorn
    from a2wsgi import WSGIMiddleware
    from fastapi import FastAPI

    from starlette.middleware.gzip import GZipMiddleware

    from forksight.compose.app import DASH_GZIP_LEVEL, DASH_GZIP_MIN_BYTES

    api = FastAPI()
    api.mount("/lean", GZipMiddleware(WSGIMiddleware(floor_app(lean=True).server),
                                      minimum_size=DASH_GZIP_MIN_BYTES, compresslevel=DASH_GZIP_LEVEL))
    api.mount("/", WSGIMiddleware(floor_app().server))
    uvicorn.run(api, host="127.0.0.1", port=port, log_level="warning", access_log=False)


class FloorServer:
    def __init__(self):
        from collector_util import free_port

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"

    def __enter__(self):
        self.proc = subprocess.Popen([sys.executable, __file__, "--floor-server", str(self.port)])
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(self.url + "/", timeout=1.0).status_code == 200:
                    return self
            except httpx.HTTPError:
                time.sleep(0.1)
        self.__exit__()
        raise RuntimeError("the floor page did not start within 60 s")

    def __exit__(self, *exc):
        self.proc.terminate()
        self.proc.wait(timeout=20)


def targets(url: str) -> dict:
    """What each page must show on this file: the run with the most steps, its last step and
    last token step, how many rows the runs table shows, two more runs for compare."""
    runs = httpx.get(url + "/api/runs", timeout=120).json()
    runs.sort(key=lambda r: -1 if r.get("last_step") is None else r["last_step"], reverse=True)
    big = runs[0]
    steps = httpx.get(f"{url}/api/runs/{quote(big['run_id'], safe='')}/token_steps", timeout=120).json()
    if big.get("last_step") is None or not steps:
        raise RuntimeError(f"the seeded file has no run with scalars and token rows (biggest: {big})")
    others = [r["run_id"] for r in runs[1:3]]
    return {"run_id": big["run_id"], "last": int(big["last_step"]), "last_token_step": int(steps[-1]),
            "rows": min(len(runs), 10), "n_runs": len(runs), "compare": [big["run_id"], *others]}


def page_urls(base: str, t: dict) -> dict[str, str]:
    rid = quote(t["run_id"], safe="")
    return {"run": f"{base}/run?run={rid}", "tokens": f"{base}/tokens?run={rid}", "runs": f"{base}/",
            "alerts": f"{base}/alerts", "compare": f"{base}/compare?runs=" + quote(",".join(t["compare"]))}


def _union(intervals: list[tuple[float, float]]) -> float:
    total, last_end = 0.0, -np.inf
    for start, end in sorted(intervals):
        if end > last_end:
            total += end - max(start, last_end)
            last_end = end
    return total


def breakdown(done_ms: float, entries: list[dict], metrics: dict) -> dict:
    """Where one load's time went, up to the moment its data showed."""
    seen = [e for e in entries if e["start"] < done_ms]
    data = [e for e in seen if urlparse(e["name"]).path.endswith(DATA_PATHS) or e is entries[0]]
    statics = [e for e in seen if not any(e is d for d in data)]
    scripts = [e for e in statics if urlparse(e["name"]).path.endswith(".js")]
    span = [(e["start"], min(e["end"] or done_ms, done_ms)) for e in seen]
    return {
        "collector_wait_ms": _union([(e["start"], min(e["end"] or done_ms, done_ms)) for e in data]),
        "static_download_ms": _union([(e["start"], min(e["end"] or done_ms, done_ms)) for e in statics]),
        "browser_only_ms": done_ms - _union(span),
        "callback_round_trips": sum(urlparse(e["name"]).path.endswith("/_dash-update-component") for e in data),
        "data_bytes": sum(e["wire"] for e in data),
        "script_wire_bytes": sum(e["wire"] for e in scripts),
        "script_decoded_bytes": sum(e["decoded"] for e in scripts),
        "other_static_wire_bytes": sum(e["wire"] for e in statics if e not in scripts),
        "main_thread_task_ms": 1e3 * metrics.get("TaskDuration", 0.0),
        "script_ms": 1e3 * metrics.get("ScriptDuration", 0.0),
        "layout_style_ms": 1e3 * (metrics.get("LayoutDuration", 0.0) + metrics.get("RecalcStyleDuration", 0.0)),
    }


def open_once(browser, url: str, page: str, arg: dict) -> dict:
    """One first open in a fresh context: ms from navigation start to drawn data, and where it went."""
    ctx = browser.new_context(viewport={"width": 1400, "height": 1000})
    try:
        pg = ctx.new_page()
        pg.add_init_script("performance.setResourceTimingBufferSize(2000)")
        cdp = ctx.new_cdp_session(pg)
        cdp.send("Performance.enable")
        errors: list[str] = []
        pg.on("pageerror", lambda e: errors.append(str(e)))
        pg.goto(url, wait_until="commit")
        predicate = f"(a) => {{ {JS_HELPERS} {READY[page]} return performance.now(); }}"
        try:
            done = float(pg.wait_for_function(predicate, arg=arg, polling=POLL_MS, timeout=LOAD_TIMEOUT_MS).json_value())
        except Exception as exc:
            raise RuntimeError(f"{page} ({url}) did not show its data within {LOAD_TIMEOUT_MS / 1e3:.0f} s; "
                               f"page errors: {errors[:3]}") from exc
        metrics = {m["name"]: m["value"] for m in cdp.send("Performance.getMetrics")["metrics"]}
        out = {"ms": done, **breakdown(done, pg.evaluate(RESOURCES_JS), metrics)}
        if errors:
            out["page_errors"] = errors[:3]
        return out
    finally:
        ctx.close()


def summarise(loads: list[dict], floor_p95: float | None) -> dict:
    times = [x["ms"] for x in loads]
    p95 = float(np.percentile(times, 95))
    out = {"p95_ms": round(p95, 1), "median_ms": round(float(np.median(times)), 1), "n": len(times)}
    if floor_p95:
        out["ratio_to_floor_p95"] = round(p95 / floor_p95, 2)
        out["meets_target"] = p95 <= TARGET_RATIO * floor_p95
    out["where_median"] = {k: round(float(np.median([x[k] for x in loads])), 1) for k in loads[0]
                           if k not in ("ms", "page_errors")}
    errors = sorted({e for x in loads for e in x.get("page_errors", [])})
    if errors:
        out["page_errors"] = errors[:5]
    return out


def seeded(name: str, given: str | None, workdir: Path, token_rows_per_step: int) -> str:
    if given and Path(given).exists():
        return given
    from seed import seed

    path = given or str(workdir / f"{name}.duckdb")
    t0 = time.monotonic()
    seed(path, steps=SIZES[name]["steps"], runs=SIZES[name]["runs"], token_rows_per_step=token_rows_per_step)
    print(f"[browser] seeded {name} ({SIZES[name]}) in {time.monotonic() - t0:.0f} s", file=sys.stderr)
    return path


def measure_size(browser, floor: FloorServer, db: str, rounds: int, pages: list[str]) -> dict:
    from collector_util import ServeProcess

    with ServeProcess(db, dashboard=True, args=("--skip-verify",)) as srv:
        t = targets(srv.url)
        urls = {"floor": floor.url + "/", "floor_lean": floor.url + "/lean/", **page_urls(srv.url, t)}
        args = {**{p: t for p in PAGES}, "floor": {"points": FLOOR_POINTS}, "floor_lean": {"points": FLOOR_POINTS}}
        for page in pages:                                  # one unmeasured open each: server warm-up
            open_once(browser, urls[page], page, args[page])
        loads: dict[str, list[dict]] = {p: [] for p in pages}
        for r in range(rounds):
            for page in pages:
                loads[page].append(open_once(browser, urls[page], page, args[page]))
            print(f"[browser] round {r + 1}/{rounds}: " + ", ".join(f"{p} {loads[p][-1]['ms']:.0f}"
                                                                    for p in pages), file=sys.stderr)
    floor_p95 = float(np.percentile([x["ms"] for x in loads["floor"]], 95))
    return {"file": {k: t[k] for k in ("n_runs", "last", "last_token_step")},
            "pages": {p: summarise(loads[p], None if p == "floor" else floor_p95) for p in pages}}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--sizes", default="small,big", help="comma-separated: small, big")
    parser.add_argument("--pages", default=",".join(PAGES[1:]),
                        help="comma-separated pages to open (floor_lean: the floor page served as the dashboard is)")
    parser.add_argument("--db-small", default=None, help="an already seeded file for the small size")
    parser.add_argument("--db-big", default=None, help="an already seeded file for the big size")
    parser.add_argument("--token-rows-per-step", type=int, default=64,
                        help="token rows per step when seeding (the pages read one step at a time)")
    parser.add_argument("--floor-server", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.floor_server is not None:
        serve_floor(args.floor_server)
        return 0
    from browser_util import CHROMIUM_ARGS
    from playwright.sync_api import sync_playwright

    pages = ["floor", *[p for p in args.pages.split(",") if p in PAGES and p != "floor"]]
    workdir = Path(tempfile.mkdtemp(prefix="forksight-browser-bench-"))
    out = {"target_ratio_to_floor": TARGET_RATIO, "rounds": args.rounds, "sizes": {},
           "floor": f"one dcc.Graph of {FLOOR_POINTS} points in a bare Dash {_dash_version()} app "
                    "(defaults), FastAPI + a2wsgi + uvicorn on 127.0.0.1; fresh browser context per open; "
                    "floor_lean: the same page with the dashboard's plotly.js bundle, assets and gzip"}
    try:
        with FloorServer() as floor, sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            try:
                for name in args.sizes.split(","):
                    db = seeded(name, getattr(args, f"db_{name}"), workdir, args.token_rows_per_step)
                    out["sizes"][name] = {**SIZES[name], **measure_size(browser, floor, db, args.rounds, pages)}
            finally:
                browser.close()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    out["all_met"] = all(v.get("meets_target", True) for s in out["sizes"].values() for v in s["pages"].values())
    print(json.dumps(out, indent=1))
    return 0


def _dash_version() -> str:
    from importlib.metadata import version

    return version("dash")


if __name__ == "__main__":
    sys.exit(main())
