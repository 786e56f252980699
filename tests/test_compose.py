"""docker-compose.yml and the Dockerfile, checked by what runs here (no Docker engine):
every command they run parses with forksight's own CLI, and ports, volumes and the health
check agree with the collector's defaults."""
from __future__ import annotations

import re
import shlex
from pathlib import Path

import yaml

from forksight.compose.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]


def _compose() -> dict:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def _parse(argv: list[str]):
    assert argv[0] == "forksight", f"service runs {argv[0]!r}, not the forksight CLI"
    return build_parser().parse_args(argv[1:])


def test_every_compose_command_is_a_valid_forksight_invocation():
    services = _compose()["services"]
    assert {"collector", "trainer"} <= set(services)
    serve = _parse(services["collector"]["command"])
    assert serve.command == "serve" and serve.port == 8050
    train = _parse(services["trainer"]["command"])
    assert train.command == "train"
    assert train.url == f"http://collector:{serve.port}"


def test_collector_port_volume_and_healthcheck_agree():
    collector = _compose()["services"]["collector"]
    serve = _parse(collector["command"])
    host_port, container_port = collector["ports"][0].rsplit(":", 2)[-2:]
    assert int(container_port) == serve.port
    assert collector["ports"][0].startswith("127.0.0.1:"), "publish on loopback only"
    volume_dir = collector["volumes"][0].split(":")[1]
    assert Path(serve.db).parent == Path(volume_dir)
    probe = " ".join(collector["healthcheck"]["test"])
    assert f"127.0.0.1:{serve.port}/api/health" in probe
    # binding 0.0.0.0 needs a token: the compose file must pass one
    assert serve.host == "0.0.0.0" and "FORKSIGHT_TOKEN" in collector["environment"]
    assert "FORKSIGHT_TOKEN" in _compose()["services"]["trainer"]["environment"]


def test_dockerfile_default_command_matches_the_collector_service():
    text = (ROOT / "Dockerfile").read_text()
    cmd = re.search(r"^CMD\s+(\[.*\])$", text, re.M).group(1)
    argv = yaml.safe_load(cmd)
    assert argv == _compose()["services"]["collector"]["command"]
    _parse(argv)
    # every folder that packaging maps into `forksight` must be in the image
    import tomllib

    folders = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"].values())
    assert folders == {"core", "monitor", "hooks", "trainer", "dashboard"}
    for folder in folders:
        assert re.search(rf"^COPY {folder} ", text, re.M), f"Dockerfile does not copy {folder}/"
    assert "torch" in text.split("COPY pyproject.toml")[0], "torch must be installed before the project"
