"""The `forksight` command: subcommands registered by import, and `--help` stays light
(no torch, no Dash: the parser is built from modules that import those only when they run)."""
from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

from forksight.compose.cli import SUBCOMMANDS, build_parser

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "transformers", "trl", "dash", "duckdb", "fastapi", "uvicorn")


def test_building_the_parser_imports_neither_torch_nor_dash():
    code = ("import sys, json; from forksight.compose.cli import build_parser; build_parser().format_help(); "
            f"print(json.dumps(sorted(m for m in {HEAVY!r} if m in sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == []


def test_help_lists_every_subcommand_and_each_comes_from_an_imported_module():
    out = subprocess.run([sys.executable, "-m", "forksight", "--help"], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    for command in ("serve", "export", "compact", "lake", "train", "alerts", "probe", "rescore", "demo", "doctor",
                    "import", "report"):
        assert command in out.stdout
    modules = {add_parser.__module__ for add_parser in SUBCOMMANDS}
    assert modules == {"forksight.compose.serve_cli", "forksight.compose.compact_cli", "forksight.trainer.cli",
                       "forksight.compose.lake_cli", "forksight.compose.probe_cli",
                       "forksight.compose.alerts_cli", "forksight.compose.demo", "forksight.compose.doctor",
                       "forksight.compose.report_cli", "forksight.compose.rescore_cli"}
    assert build_parser().parse_args(["serve", "--port", "9"]).func.__module__ == "forksight.compose.serve_cli"


def _imports(folder: str) -> set[str]:
    names: set[str] = set()
    for path in (ROOT / folder).rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                names.add(node.module)
            elif isinstance(node, ast.Import):
                names.update(alias.name for alias in node.names)
    return names


def test_the_collector_room_never_imports_the_dashboard_and_the_dashboard_never_the_server():
    assert not {m for m in _imports("monitor") if m.startswith("forksight.dashboard")}
    assert not {m for m in _imports("dashboard") if m in ("forksight.compose.app", "forksight.monitor.collector.server")}
