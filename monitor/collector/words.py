"""Tokens by what they are (issue 48 item 4): which strings fork, and how each string's entropy moves.
The writer keeps, per run, step and decoded token string, the stored occurrences, how many were forks,
and the sum of their entropies (`add_words`, at ingest of every token batch) — only the batch's top
`per_step` strings by count and its top `per_step` by fork share (ties: the more frequent), so the table
stays bounded (≤ 2·per_step rows a step) at 100k steps (`forksight serve --words-per-step N`). A read sums a step window (`WordReads.read_words`); the reference set's
words at a step come straight from its rows (`WordReads.reference_words`: the same text at every step,
so a word's H moves only with the policy)."""
from __future__ import annotations

from typing import TYPE_CHECKING

import pyarrow as pa

if TYPE_CHECKING:
    import pandas as pd

WORDS_PER_STEP = 100          # strings kept per step and ranking (by count, by forks)
ORDERS = {"count": "count DESC", "fork_share": "fork_share DESC, count DESC", "entropy": "entropy_mean DESC",
          "token": "token"}


def add_words(cur, run_id: str, tokens: pa.Table, per_step: int = WORDS_PER_STEP) -> None:
    """Fold one batch's token rows into the run's words (a step that arrives in several batches, e.g.
    one per rank, adds up)."""
    if "token" not in tokens.column_names and "token_id" not in tokens.column_names:
        return
    cols = {name: tokens[name] for name in ("step", "token", "token_id", "fork", "entropy") if name in tokens.column_names}
    view = pa.table(cols)
    token = "coalesce(token, '#' || token_id::VARCHAR)" if {"token", "token_id"} <= set(cols) else \
        ("token" if "token" in cols else "'#' || token_id::VARCHAR")
    fork = "count(*) FILTER (WHERE fork)" if "fork" in cols else "0"
    h = ("count(entropy)", "coalesce(sum(entropy), 0)") if "entropy" in cols else ("0", "0.0")
    cur.register("_forksight_words", view)
    try:
        cur.execute(f"""
            INSERT INTO words BY NAME
            SELECT ?::VARCHAR AS run_id, step, token, count, forks, h_count, entropy_sum FROM (
                SELECT step, {token} AS token, count(*) AS count, {fork} AS forks, {h[0]} AS h_count,
                       {h[1]}::DOUBLE AS entropy_sum
                FROM _forksight_words WHERE {token} IS NOT NULL GROUP BY ALL)
            QUALIFY row_number() OVER (PARTITION BY step ORDER BY count DESC, token) <= ?
                 OR row_number() OVER (PARTITION BY step ORDER BY forks / count DESC, count DESC, token) <= ?
            ON CONFLICT DO UPDATE SET count = count + excluded.count, forks = forks + excluded.forks,
                h_count = h_count + excluded.h_count, entropy_sum = entropy_sum + excluded.entropy_sum""",
                    [run_id, per_step, per_step])
    finally:
        cur.unregister("_forksight_words")


class WordReads:
    """Reader.read_words and reference_words (mixed into the Reader)."""

    def read_words(self, run_id: str, start: int | None = None, end: int | None = None, *, order: str = "count",
                   min_count: int = 1, limit: int = 200) -> pd.DataFrame:
        """Per token string over steps start..end (inclusive; None: the run's first/last): count, forks,
        fork_share, entropy_mean, steps (in how many steps it was kept), ordered by `order`."""
        where, params = "run_id = ?", [run_id]
        if start is not None:
            where, params = where + " AND step >= ?", params + [int(start)]
        if end is not None:
            where, params = where + " AND step <= ?", params + [int(end)]
        return self._query(f"""
            SELECT token, sum(count)::BIGINT AS count, sum(forks)::BIGINT AS forks,
                   sum(forks) / sum(count) AS fork_share, sum(entropy_sum) / nullif(sum(h_count), 0) AS entropy_mean,
                   count(*)::BIGINT AS steps
            FROM words WHERE {where} GROUP BY token HAVING sum(count) >= ?
            ORDER BY {ORDERS[order]}, token LIMIT ?""", [*params, max(1, int(min_count)), max(1, int(limit))])

    def reference_words(self, run_id: str, step: int, *, order: str = "count", min_count: int = 1,
                        limit: int = 200) -> pd.DataFrame:
        """The same per-string figures over the reference set as the policy of `step` scores it."""
        return self._query(f"""
            SELECT coalesce(token, '#' || token_id::VARCHAR) AS token, count(*)::BIGINT AS count,
                   (count(*) FILTER (WHERE fork))::BIGINT AS forks,
                   (count(*) FILTER (WHERE fork)) / count(*) AS fork_share, avg(entropy) AS entropy_mean,
                   1::BIGINT AS steps
            FROM reference WHERE run_id = ? AND step = ? AND pos >= 0 GROUP BY 1 HAVING count(*) >= ?
            ORDER BY {ORDERS[order]}, token LIMIT ?""", [run_id, int(step), max(1, int(min_count)),
                                                         max(1, int(limit))])
