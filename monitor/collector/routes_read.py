"""The collector's read routes (runs, one run's scalars, histograms, tokens, samples, counts;
alerts): thin adapters over the Reader. Unknown run: 404; query integers beyond int64: 422."""
# an empty list for an unknown run would read as "no data yet"; int64 is DuckDB's BIGINT, and a
# larger number would reach the database and come back as a 500
# no `from __future__ import annotations`: FastAPI must see the Annotated types of local aliases
import json
from typing import Annotated, Any, Callable

import pandas as pd
from fastapi import APIRouter, Depends, Query
from fastapi.responses import Response

from forksight.base.interfaces import Reader
from forksight.base.errors import ApiError, unknown_run
from forksight.monitor.collector.token_pages import (
    TOKEN_PAGE_DEFAULT, TOKEN_PAGE_MAX, parse_cursor, read_token_page, table_json,
)

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
OptionalInt64 = Annotated[int | None, Query(ge=INT64_MIN, le=INT64_MAX)]
Downsample = Annotated[int, Query(ge=1, le=100_000, description="at most this many points per series")]
Step = Annotated[int, Query(ge=INT64_MIN, le=INT64_MAX)]
PageLimit = Annotated[int, Query(ge=1, le=TOKEN_PAGE_MAX, description="rows per page")]
Cursor = Annotated[str | None, Query(max_length=100, description="the X-Next-Cursor of the previous page")]


def paged_headers(total_means: str) -> dict:
    """The OpenAPI `responses` of a paged route: its X-Total-Count and X-Next-Cursor headers."""
    return {200: {"headers": {
        "X-Total-Count": {"description": total_means, "schema": {"type": "integer"}},
        "X-Next-Cursor": {"description": "pass as ?cursor= for the next page; absent on the last",
                          "schema": {"type": "string"}}}}}


def page_response(page, total: int, after: str | None) -> Response:
    """One page of rows as JSON, with how many there are in all and the next page's cursor."""
    headers = {"X-Total-Count": str(total)}
    if after is not None:
        headers["X-Next-Cursor"] = after
    return Response(table_json(page), media_type="application/json", headers=headers)


def frame_response(df: pd.DataFrame) -> Response:
    """A DataFrame as JSON records, floats exact (shortest round-trip repr), NaN/NA -> null."""
    import pyarrow as pa

    rows = pa.Table.from_pandas(df, preserve_index=False).to_pylist()   # NaN -> None
    return Response(json.dumps(rows, allow_nan=False), media_type="application/json")


def _isna(value: Any) -> bool:
    try:
        return bool(pd.isna(value))
    except (TypeError, ValueError):
        return False


def read_routes(reader: Reader, has_run: Callable[[str], bool]) -> APIRouter:
    """GET routes over `reader`; `has_run(run_id)` decides 404 for the per-run ones."""
    router = APIRouter()

    def known_run(run_id: str) -> str:
        if not has_run(run_id):
            raise unknown_run(run_id)
        return run_id

    Run = Annotated[str, Depends(known_run)]

    @router.get("/api/runs")
    def list_runs() -> Response:
        return frame_response(reader.list_runs())

    @router.get("/api/runs/{run_id}")
    def get_run(run_id: Run) -> dict:
        return {k: (None if _isna(v) else v) for k, v in reader.run(run_id).items()}   # Run: it exists

    @router.get("/api/runs/{run_id}/scalar_keys")
    def scalar_keys(run_id: Run) -> list[str]:
        return reader.scalar_keys(run_id)

    @router.get("/api/runs/{run_id}/scalars")
    def scalars(run_id: Run, keys: str | None = Query(None, description="comma-separated keys"),
                downsample: Downsample = 1000, since_step: OptionalInt64 = None) -> Response:
        key_list = [k for k in keys.split(",") if k] if keys else None
        return frame_response(reader.read_scalars(run_id, key_list, downsample=downsample, since_step=since_step))

    @router.get("/api/runs/{run_id}/histograms")
    def histograms(run_id: Run, key: str = "entropy", downsample: Downsample = 1000,
                   since_step: OptionalInt64 = None) -> Response:
        return frame_response(reader.read_histograms(run_id, key, downsample=downsample, since_step=since_step))

    @router.get("/api/runs/{run_id}/token_steps")
    def token_steps(run_id: Run) -> list[int]:
        return reader.token_steps(run_id)

    @router.get("/api/runs/{run_id}/tokens", responses=paged_headers("rows of the step (and sample) in all"))
    def tokens(run_id: Run, step: Step, sample_id: OptionalInt64 = None, limit: PageLimit = TOKEN_PAGE_DEFAULT,
               cursor: Cursor = None) -> Response:
        """One page of a step's token rows, ordered by rank, sample, position: at most `limit`
        rows; X-Total-Count says how many there are, X-Next-Cursor names the next page."""
        return page_response(*read_token_page(reader, run_id, step, sample_id, limit, parse_cursor(cursor)))

    @router.get("/api/runs/{run_id}/probe_steps")
    def probe_steps(run_id: Run) -> list[int]:
        """Steps that hold Monte-Carlo value probes (`forksight probe`, --probe-every), ascending."""
        return reader.probe_steps(run_id)

    @router.get("/api/runs/{run_id}/probes", responses=paged_headers("probe rows of the step (and sample) in all"))
    def probes(run_id: Run, step: Step, sample_id: OptionalInt64 = None, limit: PageLimit = TOKEN_PAGE_DEFAULT,
               cursor: Cursor = None) -> Response:
        """One page of a step's value probes (sample_id, pos, token_id, token, fork, entropy, v_before,
        v_after, delta, se, se_before, se_after, k, pivotal, alternatives as JSON text), ordered and
        paged as /tokens is: X-Total-Count says how many, X-Next-Cursor names the next page."""
        return page_response(*reader.probe_page(run_id, step, sample_id, limit, parse_cursor(cursor)))

    @router.get("/api/runs/{run_id}/reference_steps")
    def reference_steps(run_id: Run) -> list[int]:
        """Steps at which the run's reference set was re-scored, ascending; the first is the base."""
        return reader.reference_steps(run_id)

    @router.get("/api/runs/{run_id}/reference", responses=paged_headers("reference rows of the step (and sample) in all"))
    def reference(run_id: Run, step: Step, sample_id: OptionalInt64 = None, limit: PageLimit = TOKEN_PAGE_DEFAULT,
                  cursor: Cursor = None) -> Response:
        """One page of the reference set as the policy of `step` scores it, teacher-forced (sample_id, pos,
        token_id, token, entropy, renyi2, logp, fork; the base step's prompt tokens at negative pos),
        ordered and paged as /tokens is: X-Total-Count says how many, X-Next-Cursor names the next page."""
        return page_response(*reader.reference_page(run_id, step, sample_id, limit, parse_cursor(cursor)))

    @router.get("/api/runs/{run_id}/words")
    def words(run_id: Run, start: OptionalInt64 = None, end: OptionalInt64 = None,
              reference_step: OptionalInt64 = None,
              order: str = Query("count", pattern="^(count|fork_share|entropy|token)$",
                                 description="count, fork_share, entropy (mean H) or token"),
              min_count: int = Query(1, ge=1, le=INT64_MAX, description="only strings seen at least this often"),
              limit: int = Query(200, ge=1, le=10_000)) -> Response:
        """Tokens by what they are: per decoded token string, over the stored token rows of steps
        start..end (inclusive; the writer keeps each step's top strings by count and by fork share), its
        count, forks, fork_share and entropy_mean; with reference_step, over the reference set as the
        policy of that step scores it (the same text at every step)."""
        if reference_step is not None:
            return frame_response(reader.reference_words(run_id, reference_step, order=order, min_count=min_count,
                                                         limit=limit))
        return frame_response(reader.read_words(run_id, start, end, order=order, min_count=min_count, limit=limit))

    @router.get("/api/runs/{run_id}/samples")
    def samples(run_id: Run, step: OptionalInt64 = None, group_id: OptionalInt64 = None,
                limit: int = Query(10_000, ge=1, le=100_000)) -> Response:
        return frame_response(reader.read_samples(run_id, step, group_id, limit=limit))

    @router.get("/api/runs/{run_id}/counts")
    def counts(run_id: Run) -> dict:
        return reader.row_counts(run_id)

    @router.get("/api/alerts")
    def alerts(run_id: str | None = None, since_step: OptionalInt64 = None) -> Response:
        return frame_response(reader.read_alerts(run_id, since_step))

    return router
