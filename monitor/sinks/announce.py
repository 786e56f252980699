"""The one line forksight adds to a training script's output: where to see the run. Printed by
open_sink on rank 0, once per run id in a process (a TRL trainer re-bound, a resumed run)."""
from __future__ import annotations

import sys
from urllib.parse import quote

from forksight.base.interfaces import Sink

_told: set[str] = set()
SERVE_URL = "http://127.0.0.1:8050"       # where `forksight serve` listens by default


def dashboard_line(sink: Sink) -> str | None:
    """'forksight: run R → URL' for a collector; how to open it for an in-process file; else None."""
    run_id = getattr(sink, "run_id", None)
    if not run_id:
        return None
    url = getattr(sink, "url", None)
    if url:
        return f"forksight: run {run_id} → {url}/run?run={quote(run_id)}"
    store = getattr(sink, "store", None)
    db = getattr(store, "path", None)
    if db:
        return (f"forksight: run {run_id} is stored in {db}; to see it: forksight serve --db {db}, "
                f"then {SERVE_URL}/run?run={quote(run_id)}")
    return None


def announce(sink: Sink) -> None:
    """Print dashboard_line once per run id (stderr: stdout stays the script's own)."""
    line = dashboard_line(sink)
    if line is None or sink.run_id in _told:
        return
    _told.add(sink.run_id)
    print(line, file=sys.stderr, flush=True)
