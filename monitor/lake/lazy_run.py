"""A lake run's Reader that opens only the tables each call reads (run_views.RunDb): the tokens page
of one step plans `tokens` (and `scalars`, for the run's step span), not every table and rollup."""
from __future__ import annotations

# Reader method -> the step tables it reads. A method not listed opens everything first (correct,
# only slower): a new Reader method never reads a table that is not there. Rollups are built by the
# Reader's before_rollups hook, when a read first uses them (RunDb.rollups).
_SPAN = ("scalars",)            # runs.last_step / first_step come from the run's scalars
_TOKENS = ("tokens",)
NEEDS: dict[str, tuple[str, ...]] = {
    # the run's row as the lake's runs table has it (its committer syncs it with each commit); a read
    # of its scalars then sets the span from the rows themselves
    "run": (),
    **{m: _SPAN for m in ("list_runs", "run_progress", "runs_page", "scalar_keys")},
    **{m: () for m in ("has_run", "read_alerts", "read_alerts_page", "alert_detectors")},
    **{m: ("probes",) for m in ("probe_steps", "read_probes", "probe_page")},
    **{m: ("reference",) for m in ("reference_steps", "read_reference", "reference_page", "reference_words")},
    "read_words": (),               # the writer's aggregate: a run only the lake holds has none
    **{m: _TOKENS for m in ("token_steps", "token_step_span", "first_token_steps",
                            "nearest_token_steps", "spread_token_steps", "read_tokens")},
    "read_token_history": ("tokens", "samples"),
    "read_samples": ("samples",),
    "row_counts": ("scalars", "histograms", "samples", "tokens", "probes", "reference"),   # every data table
    # percentiles of multi-rank steps are re-merged from the histograms
    **{m: ("scalars", "histograms") for m in ("read_scalars", "read_scalars_of_runs", "steps_scalars",
                                              "read_histograms", "read_histogram_ends")},
}
_ALL = ("scalars", "histograms", "samples", "tokens", "probes", "reference")


class LazyRunReader:
    """The collector's Reader over a RunDb: each call first opens the tables it reads."""

    def __init__(self, db):
        self.db = db
        self.stale_after = db.reader.stale_after

    def __getattr__(self, name: str):
        attr = getattr(self.db.reader, name)
        if not callable(attr) or name.startswith("__"):
            return attr
        tables = NEEDS.get(name, _ALL)

        def call(*args, **kwargs):
            self.db.ensure(tables)
            return attr(*args, **kwargs)
        return call
