"""GET /api/runs/{id}/tokens is paged: a step of any size answers at most `limit` rows (default
10,000, at most 100,000), X-Total-Count gives the step's rows, X-Next-Cursor the next page; the
pages together are exactly the step's rows in (rank, sample, position) order, duplicates kept."""
from __future__ import annotations

import httpx
import numpy as np
import pytest

from collector_util import InProcessCollector
from forksight.base.records import Records, tokens_table
from forksight.monitor.collector.token_pages import TOKEN_PAGE_DEFAULT, TOKEN_PAGE_MAX

N = 25_003     # rows of step 3: more than two default pages


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    with InProcessCollector(tmp_path_factory.mktemp("pages") / "p.duckdb") as srv:
        store = srv.collector.store
        run = store.create_run("pages")
        rng = np.random.default_rng(0)
        for rank in (1, 0):
            n = N // 2 + rank
            entropy = [None if i % 97 == 0 else float(v) for i, v in enumerate(rng.random(n))]   # nulls too
            store.write(run, Records(tokens=tokens_table(
                {"sample_id": rng.integers(0, 40, n), "pos": rng.integers(0, 50, n),    # keys repeat
                 "entropy": entropy}, step=3, rank=rank))).result()
        store.write(run, Records(tokens=tokens_table({"sample_id": [0], "pos": [0]}, step=4))).result()
        yield srv, run


def _reference(store, run: str, sample_id: int | None = None) -> list[tuple]:
    extra = "" if sample_id is None else f" AND sample_id = {int(sample_id)}"
    return store.call(lambda cur: cur.execute(
        f"SELECT rank, sample_id, pos, entropy FROM tokens WHERE run_id = ? AND step = 3{extra}", [run]).fetchall())


def _key(row: dict) -> tuple:
    value = row["entropy"]
    return row["rank"], row["sample_id"], row["pos"], value


def _all_pages(http, run: str, **params) -> tuple[list[dict], list[int]]:
    rows, sizes, cursor = [], [], None
    while True:
        resp = http.get(f"/api/runs/{run}/tokens", params={**params, **({"cursor": cursor} if cursor else {})})
        assert resp.status_code == 200, resp.text
        page = resp.json()
        rows += page
        sizes.append(len(page))
        assert int(resp.headers["X-Total-Count"]) == params.get("total", -1) or "total" not in params
        cursor = resp.headers.get("X-Next-Cursor")
        if cursor is None:
            return rows, sizes


def test_a_large_step_comes_in_bounded_pages_that_add_up_to_exactly_its_rows(served):
    srv, run = served
    with httpx.Client(base_url=srv.url, timeout=60) as http:
        first = http.get(f"/api/runs/{run}/tokens", params={"step": 3})
        assert len(first.json()) == TOKEN_PAGE_DEFAULT            # was every row of the step at once
        assert int(first.headers["X-Total-Count"]) == N and first.headers["X-Next-Cursor"]
        rows, sizes = _all_pages(http, run, step=3)
        assert sizes == [TOKEN_PAGE_DEFAULT, TOKEN_PAGE_DEFAULT, N - 2 * TOKEN_PAGE_DEFAULT]
        keys = [(r["rank"], r["sample_id"], r["pos"]) for r in rows]
        assert keys == sorted(keys)                               # rank, sample, position order
        reference = _reference(srv.collector.store, run)
        null_low = lambda t: (t[0], t[1], t[2], -1.0 if t[3] is None else t[3])  # noqa: E731
        assert sorted(map(null_low, map(_key, rows))) == sorted(map(null_low, reference))
        assert sum(r["entropy"] is None for r in rows) == sum(v[3] is None for v in reference) > 0
        small, sizes = _all_pages(http, run, step=3, sample_id=7, limit=13)
        assert max(sizes) <= 13 and len(small) == len(_reference(srv.collector.store, run, 7))
        assert http.get(f"/api/runs/{run}/tokens", params={"step": 4}).headers.get("X-Next-Cursor") is None


@pytest.mark.parametrize("params, word", [({"limit": TOKEN_PAGE_MAX + 1}, "limit"), ({"limit": 0}, "limit"),
                                          ({"cursor": "1.2.3"}, "cursor"), ({"cursor": "x" * 101}, "cursor"),
                                          ({"cursor": "1.2.3.99999999999999999999"}, "cursor")])
def test_a_page_size_past_the_max_or_a_forged_cursor_is_a_422_saying_which(served, params, word):
    srv, run = served
    resp = httpx.get(f"{srv.url}/api/runs/{run}/tokens", params={"step": 3, **params})
    assert resp.status_code == 422 and word in resp.json()["detail"], resp.text
