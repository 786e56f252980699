"""docker-compose.yml and the Dockerfile, checked by what runs here (no Docker engine):
every command they run parses with forksight's own CLI; ports, volumes and health checks agree;
the collectors write one lake catalogued in the PostgreSQL service. tests/test_compose_lake.py
runs each service's command by hand."""
from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import yaml

from forksight.compose.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]


def _compose() -> dict:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def _parse(argv: list[str]):
    assert argv[0] == "forksight", f"service runs {argv[0]!r}, not the forksight CLI"
    return build_parser().parse_args(argv[1:])


COLLECTORS = ("collector-a", "collector-b", "dashboard")       # every `forksight serve` service
TRAINERS = {"trainer-a": "collector-a", "trainer-b": "collector-b"}


def _volume(service: dict, target: str) -> str:
    """The named volume `service` mounts at `target`."""
    return next(v.split(":")[0] for v in service["volumes"] if v.split(":")[1] == target)


def test_every_compose_command_is_a_valid_forksight_invocation():
    services = _compose()["services"]
    assert set(services) == {"catalog", *COLLECTORS, *TRAINERS}
    for name in COLLECTORS:
        serve = _parse(services[name]["command"])
        assert serve.command == "serve", name
    for name, collector in TRAINERS.items():
        train = _parse(services[name]["command"])
        serve = _parse(services[collector]["command"])
        assert train.command == "train" and train.url == f"http://{collector}:{serve.port}", name
        assert services[name]["depends_on"][collector]["condition"] == "service_healthy"


def test_collectors_ports_volumes_and_healthchecks_agree():
    services = _compose()["services"]
    ports, dbs = set(), set()
    for name in COLLECTORS:
        collector = services[name]
        serve = _parse(collector["command"])
        host_port, container_port = collector["ports"][0].rsplit(":", 2)[-2:]
        assert int(container_port) == serve.port and int(host_port) == serve.port, name
        assert collector["ports"][0].startswith("127.0.0.1:"), "publish on loopback only"
        ports.add(serve.port)
        data = _volume(collector, str(Path(serve.db).parent))     # its DuckDB file on a volume of its own
        dbs.add(data)
        probe = " ".join(collector["healthcheck"]["test"])
        assert f"127.0.0.1:{serve.port}/api/health" in probe, name
        # binding 0.0.0.0 needs a token: the compose file must pass one
        assert serve.host == "0.0.0.0" and "FORKSIGHT_TOKEN" in collector["environment"], name
        assert collector["image"] == "forksight:latest"
    assert len(ports) == len(dbs) == len(COLLECTORS)
    assert _parse(services["dashboard"]["command"]).port == 8050          # the dashboard keeps the usual port
    for name in TRAINERS:
        assert "FORKSIGHT_TOKEN" in services[name]["environment"]


def test_the_collectors_write_one_lake_catalogued_in_the_postgres_service():
    make_url = pytest.importorskip("sqlalchemy.engine").make_url       # with the lake extra
    services = _compose()["services"]
    catalog = services["catalog"]
    assert catalog["image"].startswith("postgres:15")
    assert _volume(catalog, "/var/lib/postgresql/data")                 # the catalog survives a restart
    assert "pg_isready" in catalog["healthcheck"]["test"]
    env = catalog["environment"]
    ids = set()
    for name in COLLECTORS:
        serve = _parse(services[name]["command"])
        url = make_url(serve.lake_catalog.replace("${FORKSIGHT_LAKE_PASSWORD}", "pw"))
        assert url.drivername == "postgresql+psycopg2" and url.host == "catalog" and url.port == 5432, name
        assert url.database == env["POSTGRES_DB"] and url.username == env["POSTGRES_USER"], name
        assert "FORKSIGHT_LAKE_PASSWORD" in serve.lake_catalog and "FORKSIGHT_LAKE_PASSWORD" in env["POSTGRES_PASSWORD"]
        assert _volume(services[name], serve.lake_warehouse) == "forksight-lake", name     # one shared warehouse
        assert services[name]["depends_on"]["catalog"]["condition"] == "service_healthy"
        ids.add(serve.collector_id)
    assert len(ids) == len(COLLECTORS)          # unique per collector writing one lake (docs/lake.md)


def test_dockerfile_default_command_and_extras():
    text = (ROOT / "Dockerfile").read_text()
    cmd = re.search(r"^CMD\s+(\[.*\])$", text, re.M).group(1)
    argv = yaml.safe_load(cmd)
    serve = _parse(argv)
    assert serve.command == "serve" and serve.lake_catalog is None      # alone, a plain collector
    # the compose services run --lake-catalog postgresql+psycopg2://: the image has the lake extra
    assert re.search(r'^RUN pip install "\.\[[^]]*\blake\b[^]]*\]"', text, re.M), "Dockerfile must install .[...,lake]"
    # every folder that packaging maps into `forksight` must be in the image
    import tomllib

    folders = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"].values())
    assert folders == {"core", "monitor", "hooks", "trainer", "dashboard"}
    for folder in folders:
        assert re.search(rf"^COPY {folder} ", text, re.M), f"Dockerfile does not copy {folder}/"
    assert "torch" in text.split("COPY pyproject.toml")[0], "torch must be installed before the project"
