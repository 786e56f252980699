"""The tokens page's step picker reads: the span of a run's token steps and the token step
nearest each wanted step, from the writer's token_steps index, so the page never reads (and
the browser never holds) the whole step list. A mixin of the Reader (reads via its _fetch)."""
from __future__ import annotations

from typing import Sequence


class TokenStepReads:
    """Reader.token_step_span, first_token_steps and nearest_token_steps (mixed into the Reader)."""

    def token_step_span(self, run_id: str) -> tuple[int, int | None, int | None]:
        """(how many steps hold token rows, the first, the last); (0, None, None) when none."""
        n, first, last = self._fetch("SELECT count(*), min(step), max(step) FROM token_steps "
                                     "WHERE run_id = ?", [run_id])[0]
        return int(n), None if first is None else int(first), None if last is None else int(last)

    def first_token_steps(self, run_id: str, n: int) -> list[int]:
        """The run's first n token steps, ascending."""
        return [int(r[0]) for r in self._fetch("SELECT step FROM token_steps WHERE run_id = ? "
                                               "ORDER BY step LIMIT ?", [run_id, max(0, int(n))])]

    def nearest_token_steps(self, run_id: str, wanted: Sequence[int]) -> list[int | None]:
        """For each wanted step, the token step nearest it (the earlier one on a tie); None
        for each when the run has no token steps. One query (two as-of joins), whatever the
        number of token steps."""
        wanted = [int(w) for w in wanted]
        if not wanted:
            return []
        rows = self._fetch("""
            WITH w AS (SELECT unnest(?::BIGINT[]) AS v, unnest(range(len(?::BIGINT[]))) AS i),
            t AS (SELECT step FROM token_steps WHERE run_id = ?),
            lo AS (SELECT w.i, t.step FROM w ASOF LEFT JOIN t ON w.v >= t.step),
            hi AS (SELECT w.i, t.step FROM w ASOF LEFT JOIN t ON w.v <= t.step)
            SELECT w.i, w.v, lo.step, hi.step FROM w JOIN lo USING (i) JOIN hi USING (i)
            ORDER BY w.i""", [wanted, wanted, run_id])
        out: list[int | None] = []
        for _, v, below, above in rows:
            if below is None or above is None:
                out.append(above if below is None else below)
            else:
                out.append(int(below) if v - below <= above - v else int(above))
        return out
