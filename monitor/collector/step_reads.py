"""The tokens page's step picker reads: the span of a run's token steps and the token step
nearest each wanted step, from the writer's token_steps index, so the page never reads (and
the browser never holds) the whole step list; and the run page's one-step histogram read (the
mismatch ratio histogram). A mixin of the Reader (reads via its _fetch and _query).

A dense run (a token step at every step from its first to its last, what the bundled trainer and
TRL write) needs no more than the span: its nearest, first and spread steps are arithmetic. Only a
run with gaps reads the index rows, whose number grows with the run (issue 40, item 8)."""
from __future__ import annotations

from typing import Sequence

NEAR_STEPS = 256        # steps from a run's first / last scalar step where its histogram ends sit


class TokenStepReads:
    """Reader.token_step_span, first_token_steps, nearest_token_steps, spread_token_steps and
    read_histogram_ends (mixed into the Reader)."""

    def token_step_span(self, run_id: str) -> tuple[int, int | None, int | None]:
        """(how many steps hold token rows, the first, the last); (0, None, None) when none."""
        n, first, last = self._fetch("SELECT count(*), min(step), max(step) FROM token_steps "
                                     "WHERE run_id = ?", [run_id])[0]
        return int(n), None if first is None else int(first), None if last is None else int(last)

    def _dense_span(self, run_id: str) -> tuple[int, int] | None:
        """(first, last) token step when every step between them holds token rows, else None."""
        n, first, last = self.token_step_span(run_id)
        return (first, last) if n and n == last - first + 1 else None

    def first_token_steps(self, run_id: str, n: int) -> list[int]:
        """The run's first n token steps, ascending."""
        dense = self._dense_span(run_id)
        if dense is not None:
            return list(range(dense[0], min(dense[1], dense[0] + max(0, int(n)) - 1) + 1))
        return [int(r[0]) for r in self._fetch("SELECT step FROM token_steps WHERE run_id = ? "
                                               "ORDER BY step LIMIT ?", [run_id, max(0, int(n))])]

    def read_token_history(self, run_id: str, steps: Sequence[int], metric: str | Sequence[str],
                           prompt: str | None = None, per_step: int = 20_000):
        """(step, pos, metric) token rows of several steps in one read, at most per_step rows a
        step (ordered by rank, sample, position); metric: a column, or several (the mismatch
        colour reads logp and sampler_logp); prompt: only the rollouts of that prompt (its
        samples' ids, per step). The tokens page's position × step heatmap."""
        from forksight.base.tables import TOKENS

        columns = [metric] if isinstance(metric, str) else list(metric)
        for column in columns or [None]:
            if column not in TOKENS.names or column in ("run_id", "step", "pos", "token"):
                raise ValueError(f"metric must be a token statistic column, got {column!r}")
        metric = ", ".join(columns)
        steps = [int(s) for s in steps]
        mine = "" if prompt is None else """ SEMI JOIN (
            SELECT step, sample_id FROM samples WHERE run_id = ? AND prompt = ?
              AND step IN (SELECT unnest(?::BIGINT[]))) USING (step, sample_id)"""
        return self._query(f"""
            SELECT step, pos, {metric} FROM tokens{mine}
            WHERE run_id = ? AND step IN (SELECT unnest(?::BIGINT[]))
            QUALIFY row_number() OVER (PARTITION BY step ORDER BY rank, sample_id, pos) <= ?
            ORDER BY step, rank, sample_id, pos""",
            [*([] if prompt is None else [run_id, prompt, steps]), run_id, steps, max(1, int(per_step))])

    def nearest_token_steps(self, run_id: str, wanted: Sequence[int]) -> list[int | None]:
        """For each wanted step, the token step nearest it (the earlier one on a tie); None when
        the run has no token steps. One top-1 pass over the run's index rows per wanted step
        (an as-of join sorted them all: 140 ms at 500k steps)."""
        dense = self._dense_span(run_id) if wanted else None
        if dense is not None:
            return [min(max(int(w), dense[0]), dense[1]) for w in wanted]
        out: list[int | None] = []
        for w in wanted:
            row = self._fetch("SELECT step FROM token_steps WHERE run_id = ? "
                              "ORDER BY abs(step - ?), step LIMIT 1", [run_id, int(w)])
            out.append(int(row[0][0]) if row else None)
        return out

    def spread_token_steps(self, run_id: str, n: int) -> list[int]:
        """Up to n token steps spread over the run: the first token step of each of n equal
        parts of [first, last] token step, and the last; ascending. One pass, n groups."""
        n = max(1, int(n))
        dense = self._dense_span(run_id)
        if dense is not None:     # each part's first step is its start: no index rows read
            lo, hi = dense
            width = max(1, hi - lo)
            return sorted({s for g in range(n) if (s := lo + -(-g * width // n)) <= hi} | {hi})
        rows = self._fetch(f"""
            WITH s AS (SELECT min(step) AS lo, max(step) AS hi FROM token_steps WHERE run_id = ?)
            SELECT min(t.step) FROM token_steps t, s
            WHERE t.run_id = ?
            GROUP BY least({n - 1}, (t.step - s.lo) * {n} // greatest(1, s.hi - s.lo))
            UNION SELECT hi FROM s WHERE hi IS NOT NULL""", [run_id, run_id])
        return sorted(int(r[0]) for r in rows)

    def read_histogram_ends(self, run_id: str, key: str, at: int | None = None):
        """(step, bin_lo, bin_hi, count) of at most two steps of a histogram, ranks summed: the
        run's first step holding it and its last at or before `at` (None: the last). The bins of
        two steps whatever the run's length (the run page's mismatch ratio histogram)."""
        import pandas as pd

        span = self._fetch("SELECT coalesce(first_step, 0), coalesce(last_step, -1) FROM runs "
                           "WHERE run_id = ?", [run_id])
        first, last = span[0] if span else (0, -1)
        top = last if at is None else min(int(at), last)
        # the ends are looked for near the run's first and last scalar steps first (where a
        # producer writes them): a scan of a few row groups, not of every step's bins
        head = self._histogram_end(run_id, key, first, first + NEAR_STEPS, last=False)
        if head.empty:
            head = self._histogram_end(run_id, key, -(1 << 62), top, last=False)
        tail = self._histogram_end(run_id, key, top - NEAR_STEPS, top, last=True)
        if tail.empty:
            tail = self._histogram_end(run_id, key, -(1 << 62), top, last=True)
        if len(head) and len(tail) and head["step"].iloc[0] == tail["step"].iloc[0]:
            return tail
        return pd.concat([head, tail], ignore_index=True) if len(head) and len(tail) else \
            (head if len(head) else tail)

    def _histogram_end(self, run_id: str, key: str, lo: int, hi: int, last: bool):
        """The bins (ranks summed) of the last (first) step in [lo, hi] holding the histogram."""
        return self._query(f"""
            SELECT step, bin_lo, bin_hi, sum(count) AS count FROM histograms
            WHERE run_id = ? AND key = ? AND step BETWEEN ? AND ?
            GROUP BY step, bin_lo, bin_hi
            QUALIFY step = {'max' if last else 'min'}(step) OVER ()
            ORDER BY bin_lo""", [run_id, key, int(lo), int(hi)])
