"""The house rules of the code layout, checked on the source: the rooms and the arrows allowed
between them (followed transitively, imports inside functions included), no import cycle, no
private name imported from another module, no source file over 400 lines."""
from __future__ import annotations

import ast
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE_DIRS = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]

# module prefix -> room (longest prefix wins); the package root and its public facades
# (`forksight`, `forksight.trl`, `forksight.verl`) are the roof, with the composition root
ROOM_OF = {
    "forksight": "compose",
    "forksight.compose": "compose",
    "forksight.base": "base",
    "forksight.monitor": "monitor",
    "forksight.monitor.sinks": "sinks",
    "forksight.monitor.collector": "collector",
    "forksight.monitor.alerts": "alerts",
    "forksight.monitor.importers": "importers",
    "forksight.monitor.lake": "lake",
    "forksight.hooks": "hooks",
    "forksight.hooks.metrics": "metrics",
    "forksight.hooks.capture": "capture",
    "forksight.hooks.integrations": "integrations",
    "forksight.trainer": "trainer",
    "forksight.dashboard": "dashboard",
}

# room -> the rooms it may import directly. Producers (metrics, capture, integrations, trainer,
# sinks) never reach the collector, alerting, the dashboard or the roof; the collector never
# reaches a producer or the dashboard; alerting reads records, not HTTP; only the roof wires.
ALLOWED = {
    "base": set(),
    "monitor": set(), "hooks": set(),          # the package folders' own __init__ modules
    "metrics": {"base"},
    "sinks": {"base"},
    "capture": {"metrics", "sinks", "base"},
    "integrations": {"capture", "metrics", "sinks", "base"},
    "trainer": {"capture", "metrics", "sinks", "base"},
    "alerts": {"base"},
    "importers": {"base"},
    "lake": {"base"},          # it gets the store from the roof, duck-typed; the collector knows it not
    "collector": {"alerts", "base"},
    "dashboard": {"alerts", "base"},
    "compose": set(ROOM_OF.values()),
}
PRODUCERS = {"metrics", "capture", "integrations", "trainer", "sinks"}


def room(module: str) -> str:
    parts = module.split(".")
    for n in range(len(parts), 0, -1):
        if ".".join(parts[:n]) in ROOM_OF:
            return ROOM_OF[".".join(parts[:n])]
    raise KeyError(module)


def _modules() -> dict[str, Path]:
    out = {}
    for package, folder in PACKAGE_DIRS.items():
        for path in (ROOT / folder).rglob("*.py"):
            parts = [p for p in path.relative_to(ROOT / folder).with_suffix("").parts if p != "__init__"]
            out[".".join([package, *parts])] = path
    return out


def _import_nodes(path: Path):
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.module, [a.name for a in node.names]
        elif isinstance(node, ast.Import):
            for a in node.names:
                yield a.name, []


def _imports(name: str, path: Path, known: dict) -> set[str]:
    found = set()
    for module, names in _import_nodes(path):
        submodules = {f"{module}.{n}" for n in names} & known.keys()
        found |= submodules     # `from pkg import mod` reaches mod; pkg only if a name is pkg's own
        if not names or len(submodules) < len(names):
            found.add(module)
    return {m for m in found if m in known and m != name}


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(name, path, modules) for name, path in modules.items()}


def _reach(graph: dict[str, set[str]], start: str) -> dict[str, str]:
    """Every module reachable from start -> the module it was reached from (to print the path)."""
    seen, todo = {start: ""}, [start]
    while todo:
        v = todo.pop()
        for w in graph[v]:
            if w not in seen:
                seen[w] = v
                todo.append(w)
    return seen


def _path(parents: dict[str, str], end: str) -> str:
    out = [end]
    while parents[out[-1]]:
        out.append(parents[out[-1]])
    return " -> ".join(reversed(out))


def _closure(rooms: set[str]) -> set[str]:
    out, todo = set(rooms), list(rooms)
    while todo:
        for r in ALLOWED[todo.pop()]:
            if r not in out:
                out.add(r)
                todo.append(r)
    return out


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


def test_the_checker_follows_arrows_through_a_third_module():
    graph = {"p": {"q"}, "q": {"r"}, "r": set()}
    parents = _reach(graph, "p")
    assert set(parents) == {"p", "q", "r"} and _path(parents, "r") == "p -> q -> r"


def test_every_module_lives_in_a_known_room():
    rooms = {name: room(name) for name in _modules()}
    assert rooms["forksight.monitor.collector.store"] == "collector"
    assert rooms["forksight.hooks.metrics.token_stats"] == "metrics"
    assert rooms["forksight"] == "compose" and rooms["forksight.base.tables"] == "base"


def test_no_import_cycle_among_forksight_modules():
    graph = _graph()
    assert "forksight.monitor.collector.store" in graph and "forksight.hooks.metrics" in graph
    assert _cycle(graph) is None, " -> ".join(_cycle(graph))


def test_every_arrow_between_rooms_is_allowed_even_through_other_modules():
    graph = _graph()
    wrong = []
    for name in graph:
        allowed = _closure({room(name)}) | {room(name)}
        parents = _reach(graph, name)
        for reached in parents:
            if room(reached) not in allowed:
                wrong.append(f"{room(name)} -> {room(reached)}: {_path(parents, reached)}")
    assert not wrong, "\n".join(sorted(wrong)[:20])


def test_the_named_rules_hold():
    # spelled out, so a loosened ALLOWED table cannot quietly lift them
    for r in PRODUCERS:
        assert not _closure({r}) & {"collector", "alerts", "dashboard", "compose", "importers"}, r
    assert not _closure({"collector"}) & (PRODUCERS | {"dashboard", "compose"})
    assert _closure({"alerts"}) == {"alerts", "base"} and _closure({"base"}) == {"base"}


def test_no_private_name_is_imported_from_another_module():
    private = [f"{name}: from {module} import {n}"
               for name, path in _modules().items() for module, names in _import_nodes(path)
               if module.startswith("forksight") for n in names if n.startswith("_")]
    assert not private, private


def test_no_source_file_over_400_lines():
    long = {str(p.relative_to(ROOT)): n for p in _modules().values()
            if (n := len(p.read_text().splitlines())) > 400}
    assert not long, long


def test_every_package_folder_is_declared_for_the_wheel():
    packages = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    folders = {name for name, path in _modules().items() if path.name == "__init__.py"}
    assert folders <= packages, sorted(folders - packages)
