"""The house rules of the code layout, checked on the source: no import cycle among forksight's
modules (counting imports inside functions too), no source file over 400 lines, and the
collector's room never reaches up into the dashboard's."""
from __future__ import annotations

import ast
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ROOMS = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]


def _modules() -> dict[str, Path]:
    out = {}
    for package, folder in ROOMS.items():
        for path in (ROOT / folder).rglob("*.py"):
            parts = [p for p in path.relative_to(ROOT / folder).with_suffix("").parts if p != "__init__"]
            out[".".join([package, *parts])] = path
    return out


def _imports(name: str, path: Path, known: dict) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
    return {m for m in found if m in known and m != name}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}        # 1 = on the current path, 2 = done
    path: list[str] = []

    def visit(v: str) -> list[str] | None:
        state[v] = 1
        path.append(v)
        for w in sorted(graph[v]):
            if state.get(w) == 1:
                return path[path.index(w):] + [w]
            if w not in state and (found := visit(w)):
                return found
        state[v] = 2
        path.pop()
        return None

    for v in sorted(graph):
        if v not in state and (found := visit(v)):
            return found
    return None


def test_the_checker_finds_a_cycle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_no_import_cycle_among_forksight_modules():
    modules = _modules()
    assert "forksight.monitor.collector.store" in modules and "forksight.hooks.metrics" in modules
    graph = {name: _imports(name, path, modules) for name, path in modules.items()}
    assert _cycle(graph) is None, " -> ".join(_cycle(graph))


def test_no_source_file_over_400_lines():
    long = {str(p.relative_to(ROOT)): n for p in _modules().values()
            if (n := len(p.read_text().splitlines())) > 400}
    assert not long, long


def test_the_collector_room_never_imports_the_dashboard():
    modules = _modules()
    for name, path in modules.items():
        if name.startswith("forksight.monitor"):
            assert not any(m.startswith("forksight.dashboard") for m in _imports(name, path, modules)), name
