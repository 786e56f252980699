"""Tokens by what they are (issue 48 item 4): the writer's words aggregate equals a pandas group-by of the
stored token rows over any step window (two batches of one step add up); it stays bounded (at most the
top N strings by count and the top N by forks per step); GET /words reads it, and over the reference
set with reference_step; bad parameters are refused by name."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from collector_util import InProcessCollector
from forksight.compose.local import LocalSink
from forksight.monitor.collector.store import Store

WORDS = [" the", " 7", " +", "=", " so", " carry", "\n", " 1"]


def _step(rng, n: int):
    ids = rng.integers(0, len(WORDS), n)
    entropy = rng.gamma(1.0, 0.4, n).astype(np.float32)
    return {"sample_id": (np.arange(n) // 10).tolist(), "pos": (np.arange(n) % 10).tolist(),
            "token_id": ids.tolist(), "token": [WORDS[i] for i in ids], "entropy": entropy.tolist(),
            "fork": (entropy >= 0.672).tolist()}


def _stored(db: str, run: str) -> pd.DataFrame:
    with Store(db, verify=False) as store:
        return pd.concat([store.reader.read_tokens(run, s) for s in store.reader.token_steps(run)])


def test_words_equal_a_group_by_of_the_stored_rows_over_any_window(tmp_path):
    db = str(tmp_path / "w.duckdb")
    rng = np.random.default_rng(0)
    sink = LocalSink(db, "words")
    for step in range(1, 7):
        sink.log_tokens(step, _step(rng, 60))
    more = _step(rng, 30)                       # a second batch of step 3 (another rank's rows)
    sink.log_tokens(3, {**more, "sample_id": [100 + s for s in more["sample_id"]]})
    sink.finish()
    tokens = _stored(db, "words")
    with Store(db, verify=False) as store:
        for start, end in ((None, None), (2, 4), (3, 3)):
            got = store.reader.read_words("words", start, end).set_index("token")
            window = tokens[(tokens.step >= (start or 0)) & (tokens.step <= (end or 10**9))]
            want = window.groupby("token").agg(count=("entropy", "size"), forks=("fork", "sum"),
                                               entropy_mean=("entropy", "mean"))
            assert sorted(got.index) == sorted(want.index)
            for token, row in want.iterrows():
                assert got.loc[token, "count"] == row["count"] and got.loc[token, "forks"] == row["forks"]
                assert got.loc[token, "fork_share"] == pytest.approx(row["forks"] / row["count"])
                assert got.loc[token, "entropy_mean"] == pytest.approx(row["entropy_mean"], rel=1e-5)
        by_share = store.reader.read_words("words", order="fork_share", min_count=20)
        assert by_share.fork_share.is_monotonic_decreasing and (by_share["count"] >= 20).all()


def test_the_aggregate_keeps_the_top_strings_by_count_and_by_forks_only(tmp_path):
    db = str(tmp_path / "w.duckdb")
    n = 50
    counts = {f"w{i}": n - i for i in range(n)}                     # w0 most frequent ... w49 once
    tokens = [t for t, c in counts.items() for _ in range(c)]
    forks = [t == "w40" for t in tokens]                            # a rare string that always forks
    sink = LocalSink(db, "bounded")
    sink.log_tokens(1, {"sample_id": [0] * len(tokens), "pos": list(range(len(tokens))), "token_id": [0] * len(tokens),
                        "token": tokens, "entropy": [1.0 if f else 0.1 for f in forks], "fork": forks})
    sink.finish()
    with Store(db, verify=False) as store:
        kept = store.reader.read_words("bounded", limit=1000)
    assert len(kept) == len(counts)                                 # the default keeps 100 a ranking: all
    small = str(tmp_path / "s.duckdb")
    with Store(small, words_per_step=3) as store:
        store.create_run("bounded")
        from forksight.base.records import Records, tokens_table

        store.write("bounded", Records(tokens=tokens_table({"sample_id": [0] * len(tokens),
                                                              "pos": list(range(len(tokens))), "token": tokens,
                                                              "token_id": [0] * len(tokens), "fork": forks},
                                                             step=1))).result()
        kept = store.reader.read_words("bounded")
    assert set(kept.token) == {"w0", "w1", "w2", "w40"}             # top 3 by count, and the forking one


def test_the_words_route_and_the_reference_sets_words(tmp_path, http_srv):
    srv, http = http_srv
    from forksight.monitor.sinks.http import HttpSink

    s = HttpSink(srv.url, "routed")
    s.log_tokens(5, {"sample_id": [0, 0, 0], "pos": [0, 1, 2], "token_id": [1, 2, 1], "token": [" a", " b", " a"],
                     "entropy": [0.9, 0.1, 0.7], "fork": [True, False, True]})
    s.log_reference(0, [{"sample_id": 0, "pos": -1, "token_id": 9, "token": "Q"},
                        {"sample_id": 0, "pos": 0, "token_id": 1, "token": " a", "entropy": 0.8, "fork": True},
                        {"sample_id": 0, "pos": 1, "token_id": 1, "token": " a", "entropy": 0.2, "fork": False}])
    assert s.finish() == {}
    rows = http.get(f"/api/runs/{s.run_id}/words", params={"start": 5, "end": 5}).json()
    assert rows[0] == {"token": " a", "count": 2, "forks": 2, "fork_share": 1.0, "entropy_mean": pytest.approx(0.8),
                       "steps": 1}
    ref = http.get(f"/api/runs/{s.run_id}/words", params={"reference_step": 0}).json()
    assert ref == [{"token": " a", "count": 2, "forks": 1, "fork_share": 0.5, "entropy_mean": pytest.approx(0.5),
                    "steps": 1}]                                     # the prompt's token is not counted
    bad = http.get(f"/api/runs/{s.run_id}/words", params={"order": "loudness"})
    assert bad.status_code == 422 and "order" in bad.text


@pytest.fixture()
def http_srv(tmp_path):
    import httpx

    with InProcessCollector(tmp_path / "r.duckdb") as srv, httpx.Client(base_url=srv.url, timeout=30) as http:
        yield srv, http


def test_serve_refuses_a_words_bound_below_one(tmp_path, capsys):
    from forksight.compose.cli import main

    assert main(["serve", "--db", str(tmp_path / "w.duckdb"), "--words-per-step", "0"]) == 2
    assert "--words-per-step must be >= 1, got 0" in capsys.readouterr().err and not (tmp_path / "w.duckdb").exists()
