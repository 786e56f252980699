"""The lake's writes, each one Iceberg commit: a range of outbox rows appended with its watermark, or
one collector's runs/alerts rows overwritten. The committer calls them here (LakeWriter, in its own
thread) or through a child process (writer_process.ProcessWriter), the same code either way."""
from __future__ import annotations

import logging
import random
import time
import warnings

import pyarrow as pa

from forksight.monitor.lake.errors import LakeError
from forksight.monitor.lake.schema import COLLECTOR, conform, identifier

log = logging.getLogger("forksight.lake")
# an overwrite of runs that are new to the lake deletes nothing: expected, not worth a warning
warnings.filterwarnings("ignore", message="Delete operation did not match any records")

PROP_COLLECTOR = "forksight.collector"
PROP_LO, PROP_HI = "forksight.seq-lo", "forksight.seq-hi"
CONFLICT_TRIES = 8       # commit conflicts with other collectors, on top of pyiceberg's own retries


def watermark_key(collector: str) -> str:
    return f"forksight.committed-seq.{collector}"


def committed_seq(table, collector: str) -> int:
    """The highest outbox sequence number of `collector` the table holds (its property survives
    `lake expire`; the snapshot summaries are the record of each commit)."""
    top = int(table.properties.get(watermark_key(collector), 0))
    for snap in table.metadata.snapshots:
        props = snap.summary.additional_properties if snap.summary is not None else {}
        if props.get(PROP_COLLECTOR) == collector and PROP_HI in props:
            top = max(top, int(props[PROP_HI]))
    return top


class LakeWriter:
    """One collector's commits into `catalog`."""

    def __init__(self, catalog, collector: str):
        self.catalog, self.collector = catalog, collector

    def committed(self, name: str) -> int:
        """The table's watermark for this collector."""
        return committed_seq(self.catalog.load_table(identifier(name)), self.collector)

    def append(self, name: str, rows: pa.Table, lo: int, hi: int, table=None) -> int:
        """Append outbox rows lo..hi and set the watermark to hi, in one commit; rows appended.
        table: the loaded table to commit against (default: loaded now)."""
        table = table if table is not None else self.catalog.load_table(identifier(name))
        done = committed_seq(table, self.collector)
        if done >= hi:                   # landed already (a commit whose delete was not seen): not twice
            log.info("lake: %s %d-%d is in the lake already (watermark %d); not appended again", name, lo, hi, done)
            return 0
        if done >= lo:
            raise LakeError(f"{name}: rows {lo}-{hi} of collector {self.collector!r} overlap what the lake holds "
                            f"(up to {done}): another collector writes under the same --collector-id; give each "
                            "its own")
        data = conform(rows, self.collector, table)
        props = {PROP_COLLECTOR: self.collector, PROP_LO: str(lo), PROP_HI: str(hi)}

        def append(t) -> None:
            with t.transaction() as tx:
                tx.append(data, snapshot_properties=props)
                tx.set_properties({watermark_key(self.collector): str(hi)})
        self._with_retries(name, table, append, lambda t: committed_seq(t, self.collector) >= hi)
        return data.num_rows

    def overwrite(self, name: str, rows: pa.Table, run_ids: list[str]) -> None:
        """Replace this collector's rows of `run_ids` in `name` (runs, alerts) by `rows`."""
        from pyiceberg.expressions import And, EqualTo, In

        table = self.catalog.load_table(identifier(name))
        data = conform(rows, self.collector, table)
        where = And(EqualTo(COLLECTOR, self.collector), In("run_id", sorted(run_ids)))
        self._with_retries(name, table, lambda t: t.overwrite(
            data, overwrite_filter=where, snapshot_properties={PROP_COLLECTOR: self.collector}),
            lambda t: False)

    def expire(self, name: str) -> int:
        """Expire `name`'s snapshots older than its history.expire.max-snapshot-age-ms (the current one
        stays; the watermark lives in a property, so no commit is forgotten); snapshots expired."""
        from datetime import datetime, timezone

        from forksight.monitor.lake.maintenance import expire_table
        from forksight.monitor.lake.schema import RETENTION

        table = self.catalog.load_table(identifier(name))
        key = "history.expire.max-snapshot-age-ms"
        age_ms = int(table.properties.get(key, RETENTION[key]))
        older = datetime.fromtimestamp(time.time() - age_ms / 1000, timezone.utc)
        return expire_table(table, older)["snapshots_expired"]

    def close(self) -> None:
        pass

    def _with_retries(self, name: str, table, commit, landed) -> None:
        """commit(table), retried with backoff on a conflict with another writer; landed(table): the
        commit is in the lake already (its answer was lost), so it is not made again."""
        from pyiceberg.exceptions import CommitFailedException

        for attempt in range(CONFLICT_TRIES):
            try:
                commit(table)
                return
            except CommitFailedException as exc:
                if attempt == CONFLICT_TRIES - 1:
                    raise
                log.info("lake: %s commit conflicted with another writer (%s); retry %d", name, exc, attempt + 1)
                time.sleep(min(0.05 * 2 ** attempt, 2.0) * random.uniform(0.5, 1.5))
                table = self.catalog.load_table(identifier(name))
                if landed(table):
                    return
