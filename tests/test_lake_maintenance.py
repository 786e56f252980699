"""`forksight lake compact|expire` on a real SQLite-catalogued lake filled by the committer: compaction
leaves one file per partition with the same rows; expiry leaves the current snapshot, deletes the
files only old snapshots used, and keeps each collector's committed watermark (restart safety)."""
from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

pytest.importorskip("pyiceberg", reason="the lake needs the `lake` extra: pip install -e '.[lake]'")

from lake_util import lake_rows  # noqa: E402

from forksight.base.records import Records, scalars_table, tokens_table  # noqa: E402
from forksight.compose.cli import main  # noqa: E402
from forksight.compose.lake_cli import parse_older_than  # noqa: E402
from forksight.monitor.collector.store import Store  # noqa: E402
from forksight.monitor.lake.catalog import open_catalog  # noqa: E402
from forksight.monitor.lake.writer import committed_seq  # noqa: E402
from forksight.monitor.lake.service import start_lake  # noqa: E402

TABLES = ("scalars", "tokens", "runs")


def _files_per_partition(table) -> Counter:
    return Counter(tuple(t.file.partition[i] for i in range(len(t.file.partition))) for t in table.scan().plan_files())


def _fill(tmp_path, commits: int = 4):
    """A lake whose partitions hold `commits` small files each (one commit per batch)."""
    uri, wh = f"sqlite:///{tmp_path}/catalog.db", str(tmp_path / "wh")
    catalog = open_catalog(uri, wh)
    store = Store(str(tmp_path / "a.duckdb"))
    try:
        run = store.create_run("r")
        lake = start_lake(store, catalog, uri=uri, warehouse=wh, collector_id="c", commit_seconds=3600)
        lake.stop()
        for i in range(commits):
            steps = [i, 1000 + i]              # two step blocks: two partitions per table
            store.write(run, Records(
                scalars=scalars_table([{"step": s, "key": "k", "value": s / 3} for s in steps]),
                tokens=tokens_table({"step": [s for s in steps for _ in range(5)], "sample_id": [0] * 10,
                                     "pos": list(range(5)) * 2, "entropy": [float(i)] * 10})), f"b{i}").result()
            lake.cycle(force=True)
    finally:
        store.close()
    return uri, wh, catalog


def test_compact_then_expire_keeps_every_row_and_bounds_files_and_snapshots(tmp_path):
    uri, wh, catalog = _fill(tmp_path)
    before = {t: lake_rows(catalog, t, "c") for t in TABLES}
    mark = committed_seq(catalog.load_table("forksight.scalars"), "c")
    assert mark > 0 and set(_files_per_partition(catalog.load_table("forksight.tokens")).values()) == {4}
    assert len(before["tokens"]) == 4 * 10 and len(before["scalars"]) == 4 * 2

    assert main(["lake", "compact", "--lake-catalog", uri, "--lake-warehouse", wh]) == 0
    for name in TABLES:
        table = catalog.load_table(f"forksight.{name}")
        assert lake_rows(catalog, name, "c") == before[name], name             # the same rows, values
        assert set(_files_per_partition(table).values()) <= {1}, name         # one file per partition

    assert main(["lake", "expire", "--lake-catalog", uri, "--lake-warehouse", wh, "--older-than", "0s"]) == 0
    for name in ("scalars", "tokens"):
        table = catalog.load_table(f"forksight.{name}")
        assert len(table.metadata.snapshots) == 1, name
        on_disk = {f"file://{p}" for p in (Path(wh) / "forksight" / name / "data").rglob("*.parquet")}
        assert on_disk == {t.file.file_path for t in table.scan().plan_files()}, name   # only what is read
        assert lake_rows(catalog, name, "c") == before[name]
    # the watermark outlives the snapshots that recorded it: a restart still knows what is committed
    assert committed_seq(catalog.load_table("forksight.scalars"), "c") == mark


def test_lake_cli_refuses_bad_input_saying_how(tmp_path, capsys):
    uri, wh = f"sqlite:///{tmp_path}/catalog.db", str(tmp_path / "wh")
    assert main(["lake", "expire", "--lake-catalog", uri, "--lake-warehouse", wh, "--older-than", "soon"]) == 2
    assert "give an age such as 90s" in capsys.readouterr().err
    open_catalog(uri, wh)
    assert main(["lake", "compact", "--lake-catalog", uri, "--lake-warehouse", wh, "--table", "nope"]) == 2
    assert "no lake table ['nope']" in capsys.readouterr().err
    now = parse_older_than("2026-01-02T00:00:00+00:00")
    assert (now - parse_older_than("1d", now)).total_seconds() == 86400
