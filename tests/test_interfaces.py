"""The doors between rooms (forksight.base.interfaces) match what stands on either side: every
implementation has each member of its Protocol with the same parameters, and the dashboard and
the read routes use nothing of a reader that the Reader protocol does not declare."""
from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

from forksight.base import interfaces
from forksight.compose.local import LocalSink
from forksight.monitor.alerts.hub import AlertHub
from forksight.monitor.collector.reader import Reader
from forksight.monitor.sinks.client import HttpSink, NullSink, open_sink

ROOT = Path(__file__).resolve().parents[1]


def _members(protocol) -> list[str]:
    return [n for n, v in vars(protocol).items()
            if not n.startswith("_") and (callable(v) or isinstance(v, property))] + \
        [n for n in getattr(protocol, "__annotations__", {}) if not n.startswith("_")]


def _params(fn) -> list[inspect.Parameter]:
    return [p for p in inspect.signature(fn).parameters.values() if p.name != "self"]


def _accepts(impl_fn, declared_fn) -> bool:
    """Every declared parameter, in order, with the same name and kind (a default may differ);
    anything more has a default, so a call written against the Protocol works."""
    impl, declared = _params(impl_fn), _params(declared_fn)
    same = [(p.name, p.kind) for p in impl[:len(declared)]] == [(p.name, p.kind) for p in declared]
    return same and all(p.default is not inspect.Parameter.empty for p in impl[len(declared):])


@pytest.mark.parametrize("protocol, impl", [
    (interfaces.Sink, HttpSink), (interfaces.Sink, NullSink), (interfaces.Sink, LocalSink),
    (interfaces.Reader, Reader), (interfaces.AlertHub, AlertHub),
])
def test_each_implementation_has_its_protocols_members_with_the_same_parameters(protocol, impl):
    for name in _members(protocol):
        declared = vars(protocol).get(name)
        if declared is None:            # a data attribute: set on instances (run_id, alerts)
            continue
        assert hasattr(impl, name), f"{impl.__name__} lacks {protocol.__name__}.{name}"
        if isinstance(declared, property):
            assert isinstance(inspect.getattr_static(impl, name), property), f"{impl.__name__}.{name}"
        else:
            assert _accepts(getattr(impl, name), declared), f"{impl.__name__}.{name}"


def test_a_null_sink_is_a_sink_and_open_sink_says_it_returns_one():
    sink = NullSink()
    assert isinstance(sink, interfaces.Sink) and sink.run_id == "null" and sink.alerts == []
    assert inspect.signature(open_sink).return_annotation in ("Sink", interfaces.Sink)
    assert not isinstance(object(), interfaces.Sink)     # the check can fail


def _reader_uses(path: Path) -> set[str]:
    """Attributes read off a name `reader` (or `...reader`) anywhere in the file."""
    used = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Attribute):
            owner = node.value
            name = owner.id if isinstance(owner, ast.Name) else owner.attr if isinstance(owner, ast.Attribute) else ""
            if name == "reader":
                used.add(node.attr)
    return used


def test_the_dashboard_and_the_read_routes_use_only_what_the_reader_protocol_declares():
    files = [*(ROOT / "dashboard").rglob("*.py"), ROOT / "monitor/collector/routes_read.py"]
    used = set().union(*(_reader_uses(f) for f in files))
    assert {"list_runs", "read_scalars"} <= used       # the scan sees the real uses
    assert used <= set(_members(interfaces.Reader)), sorted(used - set(_members(interfaces.Reader)))
