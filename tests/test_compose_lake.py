"""docker-compose.yml's services run by hand (no container engine here): a PostgreSQL cluster started
in a temp dir stands in for the `catalog` service, a temp dir for the `forksight-lake` volume; each
collector service's command runs as written except for the host names, paths and ports a container
would give it (catalog:5432 -> the cluster, /data and /lake -> temp dirs, its port -> a free one,
0.0.0.0 -> 127.0.0.1); each trainer service's command runs with `--preset tiny-test --steps 2`
appended (the preset's small batches; 200 steps of training is not a test). Afterwards each
collector's rows are in the lake exactly once, and the dashboard service lists both collectors' runs
in a real headless Chromium (screenshot compose-lake-runs.png)."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import yaml

pytest.importorskip("pyiceberg", reason="the lake needs the `lake` extra: pip install -e '.[lake]'")

from collector_util import REPO, free_port, wait_for_health  # noqa: E402
from lake_util import STEP_TABLES, duck_rows, lake_rows  # noqa: E402
from pg_util import PostgresCluster, postgres_or_skip  # noqa: E402

from forksight.monitor.lake.catalog import open_catalog  # noqa: E402

pytestmark = pytest.mark.slow
TOKEN = "compose-by-hand"
COLLECTORS = ("collector-a", "collector-b", "dashboard")
TRAINERS = {"trainer-a": "collector-a", "trainer-b": "collector-b"}


def _services() -> dict:
    return yaml.safe_load((REPO / "docker-compose.yml").read_text())["services"]


def _by_hand(argv: list[str], subst: dict[str, str]) -> list[str]:
    """The compose command as this machine runs it: `python -m forksight`, each substitution applied."""
    assert argv[0] == "forksight"
    out = []
    for arg in argv[1:]:
        for old, new in subst.items():
            arg = arg.replace(old, new)
        out.append(arg)
    return [sys.executable, "-m", "forksight", *out]


def _arg(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def _wait_drained(url: str, timeout: float = 120.0) -> dict:
    deadline, last = time.monotonic() + timeout, None
    while time.monotonic() < deadline:
        r = httpx.get(url + "/api/health/lake", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=10)
        last = r.json()
        if r.status_code == 200 and last["backlog_total"] == 0:
            return last
        time.sleep(0.3)
    raise AssertionError(f"the lake backlog of {url} did not drain within {timeout} s: {last}")


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    """The three collector services running, the two trainer services run to the end; then the
    collectors are still up (stopped at the module's end)."""
    tmp = tmp_path_factory.mktemp("compose-lake")
    services = _services()
    with PostgresCluster(postgres_or_skip()) as pg:
        pg.database("lake")
        lake = tmp / "lake"
        procs, urls = {}, {}
        env = {**os.environ, "FORKSIGHT_TOKEN": TOKEN}
        try:
            for name in COLLECTORS:
                argv = services[name]["command"]
                port = free_port()
                data = tmp / name
                data.mkdir()
                cmd = _by_hand(argv, {"${FORKSIGHT_LAKE_PASSWORD}": "unused-with-trust-auth",
                                      "@catalog:5432/": f"@127.0.0.1:{pg.port}/", "/data/": f"{data}/",
                                      "0.0.0.0": "127.0.0.1"})
                cmd[cmd.index("--lake-warehouse") + 1] = str(lake)
                cmd[cmd.index("--port") + 1] = str(port)
                log = open(data / "serve.log", "ab")
                procs[name] = (subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT), log)
                urls[name] = f"http://127.0.0.1:{port}"
                wait_for_health(urls[name], TOKEN, timeout=90, proc=procs[name][0])
            trainers = {}
            for name, collector in TRAINERS.items():
                argv = services[name]["command"]
                cmd = _by_hand(argv, {_arg(argv, "--url"): urls[collector]}) + ["--preset", "tiny-test", "--steps", "2"]
                home = tmp / name
                trainers[name] = subprocess.Popen(cmd, cwd=tmp, env={**env, "FORKSIGHT_HOME": str(home / "cache")},
                                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            for name, proc in trainers.items():       # both at once: two collectors committing to one lake
                out, _ = proc.communicate(timeout=600)
                assert proc.returncode == 0, f"{name}:\n{out[-3000:]}"
            for name in ("collector-a", "collector-b"):
                _wait_drained(urls[name])
            yield {"urls": urls, "procs": procs, "tmp": tmp, "pg": pg, "lake": lake, "services": services}
        finally:
            for proc, log in procs.values():
                if proc.poll() is None:
                    proc.terminate()
                    try:
                        proc.wait(30)
                    except subprocess.TimeoutExpired:
                        proc.kill()
                log.close()


def _stop(fleet, name: str) -> str:
    """SIGTERM one collector (its file closed, the last drain done); its DuckDB path."""
    proc, _ = fleet["procs"][name]
    proc.terminate()
    assert proc.wait(60) == 0
    argv = fleet["services"][name]["command"]
    return str(fleet["tmp"] / name / Path(_arg(argv, "--db")).name)


def test_dashboard_service_lists_the_runs_of_both_collectors(fleet, tmp_path):
    from browser_util import browser_context, watched_page
    from conftest import require_browser

    pytest.importorskip("playwright")
    chromium = require_browser()
    services = fleet["services"]
    want = sorted(f"{_arg(services[t]['command'], '--run')}@{services[c]['command'][services[c]['command'].index('--collector-id') + 1]}"
                  for t, c in TRAINERS.items())
    with browser_context(chromium) as ctx, watched_page(ctx) as page:
        page.goto(fleet["urls"]["dashboard"] + f"/?token={TOKEN}")
        page.wait_for_function("w => { const t = document.querySelector('#runs-table');"
                               " return t && w.every(x => t.innerText.includes(x)); }", arg=want, timeout=60_000)
        names = page.eval_on_selector_all("#runs-table td[data-dash-column=name]", "els => els.map(e => e.innerText)")
        assert sorted(n.strip() for n in names) == want      # the dashboard's own file holds no run
        page.wait_for_load_state("networkidle")
        out = Path(os.environ.get("FORKSIGHT_SCREENSHOTS") or tmp_path)
        out.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(out / "compose-lake-runs.png"))
        assert page.errors == []


def test_each_collectors_rows_are_in_the_lake_once(fleet):
    services = fleet["services"]
    dbs = {c: _stop(fleet, c) for c in ("collector-a", "collector-b")}
    catalog = open_catalog(fleet["pg"].url("lake"), str(fleet["lake"]), check=False)
    for collector, db in dbs.items():
        cid = _arg(services[collector]["command"], "--collector-id")
        for name in (*STEP_TABLES, "runs"):
            lake, duck = lake_rows(catalog, name, cid), duck_rows(db, name)
            assert lake == duck, (collector, name)            # no duplicate, no loss, same values
        assert lake_rows(catalog, "tokens", cid), collector   # the trainer's token rows reached the lake
        run = next(t for t, c in TRAINERS.items() if c == collector)
        assert [r["run_id"] for r in lake_rows(catalog, "runs", cid)] == [_arg(services[run]["command"], "--run")]
