"""Keeping the lake's files and snapshots bounded (`forksight lake compact|expire`). pyiceberg 0.12 has
no data-file compaction: a partition with several files is read back through a scan and overwritten
as one (the same rows; a collector's commit to that partition meanwhile makes the overwrite fail
validation, and the partition is left for the next run). Expiry drops old snapshots (never the
current one) and deletes the data files only they referenced."""
from __future__ import annotations

import logging
from collections import defaultdict
from datetime import datetime, timezone

from forksight.monitor.lake.schema import LAKE_TABLES, identifier

log = logging.getLogger("forksight.lake")


def _partition_filter(table, spec, partition):
    """The row filter selecting exactly one partition of `spec`."""
    from pyiceberg.expressions import AlwaysTrue, And, EqualTo, GreaterThanOrEqual, IsNull, LessThan
    from pyiceberg.transforms import IdentityTransform, TruncateTransform

    where = AlwaysTrue()
    for i, field in enumerate(spec.fields):
        column = table.schema().find_column_name(field.source_id)
        value = partition[i]
        if value is None:
            part = IsNull(column)
        elif isinstance(field.transform, IdentityTransform):
            part = EqualTo(column, value)
        elif isinstance(field.transform, TruncateTransform):
            part = And(GreaterThanOrEqual(column, value), LessThan(column, value + field.transform.width))
        else:
            raise ValueError(f"cannot compact a partition by {field.transform} of {table.name()}")
        where = And(where, part)
    return where


def compact_table(table, min_files: int = 2) -> dict:
    """Rewrite every partition holding >= min_files data files as one; rows before and after per
    partition are equal (checked before the commit). Returns partitions, files_before, files_after."""
    from pyiceberg.exceptions import CommitFailedException, ValidationException

    groups: dict = defaultdict(list)
    for task in table.scan().plan_files():
        part = task.file.partition
        groups[(task.file.spec_id, tuple(part[i] for i in range(len(part))))].append(task.file)
    done = {"partitions": 0, "files_before": 0, "files_after": 0, "skipped": 0}
    for (spec_id, partition), files in groups.items():
        if len(files) < min_files:
            continue
        where = _partition_filter(table, table.specs()[spec_id], partition)
        rows = table.scan(row_filter=where).to_arrow()
        if "step" in rows.column_names:     # step order: a read of one step touches few row groups
            rows = rows.sort_by("step")
        if rows.num_rows != sum(f.record_count for f in files):     # a file with deletes: leave it
            done["skipped"] += 1
            continue
        try:
            table.overwrite(rows, overwrite_filter=where, snapshot_properties={"forksight.compaction": "true"})
        except (CommitFailedException, ValidationException) as exc:  # a collector wrote there meanwhile
            log.info("compact %s %s: skipped (%s)", table.name(), partition, exc)
            done["skipped"] += 1
            table.refresh()
            continue
        done["partitions"] += 1
        done["files_before"] += len(files)
        done["files_after"] += sum(1 for t in table.scan(row_filter=where).plan_files())
    return done


def expire_table(table, older_than: datetime) -> dict:
    """Expire the snapshots older than `older_than` (the current one stays); delete the data files
    no remaining snapshot references. Returns snapshots_expired, files_deleted."""
    old = [s.snapshot_id for s in table.metadata.snapshots
           if s.timestamp_ms < older_than.timestamp() * 1000 and s.snapshot_id != table.metadata.current_snapshot_id]
    if not old:
        return {"snapshots_expired": 0, "files_deleted": 0}
    before = set(table.inspect.all_data_files()["file_path"].to_pylist())
    lists_before, manifests_before = _metadata_files(table)
    table.maintenance.expire_snapshots().by_ids(old).commit()
    table.refresh()
    after = set(table.inspect.all_data_files()["file_path"].to_pylist())
    lists_after, manifests_after = _metadata_files(table)
    gone = sorted(before - after)
    # the expired snapshots' manifest lists, and manifests no kept snapshot lists (new commits build on the
    # current snapshot, which is kept: they never reuse these): the metadata's bytes stay bounded too
    for path in (*gone, *(lists_before - lists_after), *(manifests_before - manifests_after)):
        try:
            table.io.delete(path)
        except FileNotFoundError:
            pass
    return {"snapshots_expired": len(old), "files_deleted": len(gone)}


def _metadata_files(table) -> tuple[set[str], set[str]]:
    """(the manifest lists, the manifests) the table's snapshots reference."""
    lists, manifests = set(), set()
    for snap in table.metadata.snapshots:
        lists.add(snap.manifest_list)
        manifests.update(m.manifest_path for m in snap.manifests(table.io))
    return lists, manifests


def run_maintenance(catalog, action: str, *, tables=None, min_files: int = 2,
                    older_than: datetime | None = None) -> dict[str, dict]:
    """`compact` or `expire` over the named lake tables (default all six); what was done per table."""
    names = tables or list(LAKE_TABLES)
    unknown = sorted(set(names) - set(LAKE_TABLES))
    if unknown:
        raise ValueError(f"no lake table {unknown}: choose from {', '.join(LAKE_TABLES)}")
    out = {}
    for name in names:
        table = catalog.load_table(identifier(name))
        if action == "compact":
            out[name] = compact_table(table, min_files)
        else:
            out[name] = expire_table(table, older_than or datetime.now(timezone.utc))
    return out
