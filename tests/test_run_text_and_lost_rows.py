"""Run metadata with bidi or zero-width characters is shown escaped in the runs table, and rows
lost from the file (a truncated .wal) are reported by /api/health and on the runs page, across
restarts, until someone acknowledges them."""
from __future__ import annotations

import httpx

from collector_util import file_with_truncated_wal, InProcessCollector
from forksight.dashboard.pages.runs import _store_note, runs_rows
from forksight.dashboard.text import visible
from forksight.monitor.collector.store import Store


def test_bidi_and_zero_width_characters_are_shown_as_escapes_and_other_text_as_is():
    assert visible("ict\u202egnp.exe") == "ict\\u202egnp.exe"
    assert visible("a\u200bb\u200dc\ufeffd\u2066e\u2069") == "a\\u200bb\\u200dc\\ufeffd\\u2066e\\u2069"
    assert visible("tab\there\x1b[31m") == "tab\\u0009here\\u001b[31m"
    assert visible("模型 café Ω") == "模型 café Ω" and visible(None) == "" and visible("plain") == "plain"


def test_the_runs_table_shows_run_metadata_escaped(tmp_path):
    with Store(tmp_path / "t.duckdb") as store:
        store.create_run("bidi", strategy="ict\u202egnp.exe", model="qwen\u200b-0.5b")
        row = next(r for r in runs_rows(store.reader) if r["id"] == "bidi")
        assert (row["strategy"], row["model"]) == ("ict\\u202egnp.exe", "qwen\\u200b-0.5b")
        assert store.reader.run("bidi")["strategy"] == "ict\u202egnp.exe"     # stored and served verbatim


def test_rows_lost_with_a_truncated_wal_are_reported_until_acknowledged(tmp_path):
    db = file_with_truncated_wal(tmp_path)
    with Store(db) as store:
        lost = 200_000 - store.reader.row_counts("wal")["tokens"]
        assert lost > 0 and store.lost_rows == store.missing_rows == {"tokens": lost}
    for _ in range(2):                                   # the next starts remember it (they forgot it)
        with InProcessCollector(db, dashboard=False) as srv:
            health = httpx.get(srv.url + "/api/health").json()
            assert health["store"]["lost_rows"] == {"tokens": lost} and health["store"]["lost_since"]
            note = _store_note(srv.collector.store.reader)
            assert f"{lost} tokens row(s)" in note and "/api/lost_rows/acknowledge" in note
    with InProcessCollector(db, dashboard=False) as srv:
        ack = httpx.post(srv.url + "/api/lost_rows/acknowledge")
        assert ack.status_code == 200 and ack.json() == {"acknowledged": {"tokens": lost}}
        assert httpx.get(srv.url + "/api/health").json()["store"]["lost_rows"] == {}
        assert _store_note(srv.collector.store.reader) == ""
    with Store(db) as store:
        assert store.lost_rows == {} and store.missing_rows == {}
