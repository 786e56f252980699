"""The HttpSink's requests and their disk spool: one file per request, replayed in order. A spool
that cannot be written says so (False) and the sink keeps the request in memory instead."""
from __future__ import annotations

import json
import logging
import os
import shutil
import uuid
from collections import Counter
from pathlib import Path

log = logging.getLogger("forksight.client")

SPOOL_ROOT = Path(".forksight") / "spool"
DATA_KINDS = ("json", "arrow")      # requests that carry rows (the others: run, status, heartbeat)
JSON_TABLES = ("scalars", "samples", "histograms", "probes", "reference")     # a JSON batch's row lists


class Item:
    """One request to the collector; `body` is exactly what is sent (and spooled)."""

    __slots__ = ("kind", "batch_id", "body", "rows", "path", "done")

    def __init__(self, kind: str, batch_id: str, body: bytes, rows: int = 0, path: Path | None = None):
        self.kind, self.batch_id, self.body, self.rows, self.path = kind, batch_id, body, rows, path
        self.done = False            # acknowledged (or refused for good); never sent or spooled again

    def tables(self) -> Counter:
        """Rows per table this request carries (histograms count one per histogram)."""
        if self.kind == "arrow":
            return Counter(tokens=self.rows)
        if self.kind != "json":
            return Counter()
        try:
            body = json.loads(self.body)
        except ValueError:
            return Counter(unknown=self.rows)
        out = Counter({t: len(body.get(t) or []) for t in JSON_TABLES})
        out["tokens"] = sum(len(b.get("sample_id") or []) for b in body.get("tokens") or [])
        return +out


def requests_of(buf: dict[str, list], rank: int, max_rows: int) -> list[Item]:
    """Buffered rows -> requests: JSON batches (scalars, samples, histograms, probes, reference; more than one
    when a table holds more rows than one batch may), Arrow IPC for tokens."""
    items: list[Item] = []
    caps = _json_caps()
    parts = max((-(-len(buf.get(t) or []) // caps[t]) for t in JSON_TABLES), default=0)
    for part in range(parts):
        batch_id = uuid.uuid4().hex
        body: dict = {"batch_id": batch_id, "rank": rank}
        for t in JSON_TABLES:
            rows_of = (buf.get(t) or [])[part * caps[t]:(part + 1) * caps[t]]
            # probes and reference only when there are some: a collector older than them refuses the field
            if rows_of or t in ("scalars", "samples", "histograms"):
                body[t] = rows_of
        rows = sum(len(body.get(t) or []) for t in JSON_TABLES)
        items.append(Item("json", batch_id, json.dumps(body).encode(), rows))
    if buf["tokens"]:
        import pyarrow as pa

        table = pa.concat_tables(buf["tokens"])
        for start in range(0, table.num_rows, max_rows):
            part = table.slice(start, max_rows)
            sink = pa.BufferOutputStream()
            with pa.ipc.new_stream(sink, part.schema) as writer:
                writer.write_table(part)
            items.append(Item("arrow", uuid.uuid4().hex, sink.getvalue().to_pybytes(), part.num_rows))
    return items


def _json_caps() -> dict[str, int]:
    """The most rows of each JSON table one batch may carry (the collector's limits)."""
    from forksight.base.limits import MAX_HISTOGRAMS, MAX_REFERENCE_ROWS, MAX_SAMPLE_ROWS, MAX_SCALAR_ROWS

    return {"scalars": MAX_SCALAR_ROWS, "samples": MAX_SAMPLE_ROWS, "histograms": MAX_HISTOGRAMS,
            "probes": MAX_SAMPLE_ROWS, "reference": MAX_REFERENCE_ROWS}


class Spool:
    """One directory of request files, named so that sorting them gives their order."""

    def __init__(self, directory: Path):
        self.directory = Path(directory)
        self._seq = 0
        self._warned = False

    def put(self, item: Item) -> bool:
        """Write one request; False when the disk refuses (the caller keeps the request)."""
        self._seq += 1
        path = self.directory / f"{self._seq:012d}.{item.kind}.{item.batch_id}.{item.rows}.req"
        tmp = path.with_suffix(".tmp")
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            tmp.write_bytes(item.body)
            os.replace(tmp, path)        # a file is either absent or whole
        except OSError as exc:
            try:
                tmp.unlink(missing_ok=True)
            except OSError:
                pass
            if not self._warned:
                self._warned = True
                log.error("forksight: cannot spool to %s (%s); keeping undelivered batches in memory",
                          self.directory, exc)
            return False
        return True

    def paths(self) -> list[Path]:
        return sorted(self.directory.glob("*.req")) if self.directory.exists() else []

    def count(self) -> int:
        return len(self.paths())

    @staticmethod
    def read(path: Path) -> Item:
        _, kind, batch_id, rows, _ = path.name.split(".")
        return Item(kind, batch_id, path.read_bytes(), int(rows), path)

    def rows(self) -> Counter:
        """Rows per table waiting in the spool."""
        total = Counter()
        for path in self.paths():
            try:
                total.update(self.read(path).tables())
            except OSError:
                continue
        return total

    def remove(self) -> None:
        shutil.rmtree(self.directory, ignore_errors=True)

    def adopt(self, run_id: str, rank: int) -> None:
        """Take over the data requests earlier processes of this run and rank left in SPOOL_ROOT
        (they ended while the collector was down), oldest first, ahead of this process's own."""
        old = sorted((d for d in SPOOL_ROOT.glob(f"{run_id}.r{rank}.*") if d.is_dir() and d != self.directory),
                     key=lambda d: d.stat().st_mtime)
        for directory in old:
            for path in Spool(directory).paths():
                item = self.read(path)
                if item.kind in DATA_KINDS and not self.put(item):   # run/status/heartbeat: stale now
                    return                # the disk refuses: the rest stays where it is, for later
                path.unlink()
            shutil.rmtree(directory, ignore_errors=True)
            log.warning("forksight: replaying batches of run %s left undelivered in %s", run_id, directory)
