"""`forksight compact` on a real DuckDB file: which token rows stay (computed another way here),
everything else untouched, and the file smaller and still a valid store afterwards."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest

from forksight.base.records import Records, tokens_table
from forksight.compose.cli import main
from forksight.monitor.collector.compact import kept_steps
from forksight.monitor.collector.store import Store
from synthetic import bulk_tokens, seed_run

OTHER_TABLES = ("scalars", "histograms", "samples", "runs")


def _rows(db: str, sql: str) -> list[tuple]:
    import duckdb

    conn = duckdb.connect(db, read_only=True)
    try:
        return sorted(conn.execute(sql).fetchall(), key=repr)
    finally:
        conn.close()


def _snapshot(db: str) -> dict:
    return {t: _rows(db, f"SELECT * FROM {t}") for t in OTHER_TABLES}


def test_kept_steps_are_evenly_spaced_plus_the_newest():
    # hand-worked: 23 steps, keep 4 -> indices 0, 23//4 = 5, 46//4 = 11, 69//4 = 17, and the newest 22
    steps = list(range(100, 123))
    assert kept_steps(steps, 4) == [100, 105, 111, 117, 122]
    for n, keep in [(23, 4), (500, 7), (10, 9), (10, 10), (3, 1), (1000, 64)]:
        grid = np.floor(np.linspace(0, n, keep, endpoint=False) + 1e-9).astype(int)
        expected = sorted(set(grid.tolist()) | {n - 1}) if n > keep + 1 else list(range(n))
        assert kept_steps(list(range(n)), keep) == expected, (n, keep)
    with pytest.raises(ValueError, match="keep-token-steps"):
        kept_steps([1, 2], 0)


def test_compact_keeps_histograms_scalars_and_other_runs_and_shrinks_the_file(tmp_path, capsys):
    db = str(tmp_path / "long.duckdb")
    with Store(db) as store:
        long_run = seed_run(store, "long", 23, token_samples=4, seed=1)
        other = seed_run(store, "other", 5, seed=2)
        # the bulk of a long run's file: many token rows per step
        store.write(long_run, Records(tokens=tokens_table(bulk_tokens(23, 8_000, seed=3)))).result()
    before = _snapshot(db)
    tokens_before = _rows(db, "SELECT * FROM tokens")
    size_before = os.path.getsize(db)

    assert main(["compact", "--db", db, "--run", long_run, "--keep-token-steps", "4"]) == 0
    report = json.loads(capsys.readouterr().out)

    kept = {0, 5, 11, 17, 22}  # by hand: see the test above
    expected = [r for r in tokens_before if r[0] != long_run or r[1] in kept]
    assert _rows(db, "SELECT * FROM tokens") == expected
    assert {r[1] for r in expected if r[0] == other} == set(range(5))  # the other run is untouched
    assert _snapshot(db) == before
    assert report["token_steps_before"] == 23 and report["token_steps_kept"] == 5
    assert report["token_rows_after"] == sum(r[0] == long_run for r in expected)
    assert report["bytes_before"] == size_before and report["bytes_after"] == os.path.getsize(db)
    assert os.path.getsize(db) < 0.5 * size_before, (size_before, os.path.getsize(db))
    assert not os.path.exists(db + ".compact-tmp")
    with Store(db) as store:  # reopens with the integrity check; the run reads back
        runs = store.reader.list_runs()
        assert store.reader.token_steps(long_run) == sorted(kept)  # the step index follows
    assert set(runs["run_id"]) == {long_run, other}
    assert _rows(db, "SELECT count(*) FROM batches")[0][0] > 0  # the ingest ledger came along


def test_compact_refuses_unknown_runs_and_missing_files_clearly(tmp_path, capsys):
    db = str(tmp_path / "a.duckdb")
    with Store(db) as store:
        seed_run(store, "only", 2)
    assert main(["compact", "--db", db, "--run", "nope", "--keep-token-steps", "3"]) == 1
    assert "no run 'nope'" in capsys.readouterr().err
    assert main(["compact", "--db", db, "--run", "only", "--keep-token-steps", "0"]) == 1
    assert ">= 1" in capsys.readouterr().err
    assert main(["compact", "--db", str(tmp_path / "missing.duckdb"), "--run", "only", "--keep-token-steps", "3"]) == 1
    assert "no DuckDB file" in capsys.readouterr().err
