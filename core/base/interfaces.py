"""The doors between rooms, as typed Protocols (TensorBoard's `DataProvider` and MLflow's
`AbstractStore` are the models): producers log through a `Sink`; the dashboard and the read
routes read through a `Reader`; ingest hands each complete step to an `AlertHub`. Each has
its implementations in its own room (sinks: HttpSink/NullSink, compose: LocalSink; collector:
Reader; alerts: AlertHub); the code on the other side of a door types against these only."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping, Protocol, Sequence, runtime_checkable

from forksight.base.limits import MAX_READ_TOKEN_ROWS

if TYPE_CHECKING:
    import pandas as pd


@runtime_checkable
class Sink(Protocol):
    """Where one run's records go. Logging never does I/O on the caller's thread."""

    run_id: str
    alerts: list[dict]

    @property
    def should_stop(self) -> bool:
        """True once a critical alert arrived and the run was opened with stop_on_alert."""

    def log_scalars(self, step: int, values: Mapping[str, Any], weight: float | None = None) -> None:
        """Per-step numbers; weight = token count, used when ranks are merged."""

    def log_tokens(self, step: int, columns: Mapping[str, Any]) -> None:
        """Per-token columns of equal length (sample_id, pos, token_id, token, entropy, ...)."""

    def log_samples(self, step: int, rows: Sequence[Mapping[str, Any]]) -> None:
        """Whole trajectories (prompt, completion, reward, verdict, group)."""

    def log_histogram(self, step: int, key: str, counts, edges) -> None:
        """A histogram over all of a step's tokens (fixed edges, so ranks add up bin by bin)."""

    def log_probes(self, step: int, rows: Sequence[Mapping[str, Any]]) -> None:
        """Monte-Carlo value probes of tokens (sample_id, pos, v_before, v_after, delta, se, k, ...)."""

    def log_reference(self, step: int, rows: Sequence[Mapping[str, Any]]) -> None:
        """The reference set re-scored at `step` (sample_id, pos, token_id, token, entropy, renyi2, logp, fork)."""

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until everything logged so far is stored; False on failure or timeout."""

    def await_alerts(self, timeout: float = 10.0) -> None:
        """Wait (bounded) until everything logged so far is judged, so `should_stop` is exact."""

    def undelivered(self) -> dict[str, int]:
        """Rows per table not (yet) stored."""

    def finish(self, status: str = "finished") -> dict[str, int]:
        """Flush, mark the run with `status`; returns `undelivered()`."""


@runtime_checkable
class Reader(Protocol):
    """The one read interface over a store: every read is bounded (a downsample or a limit)."""

    def list_runs(self) -> "pd.DataFrame": ...

    def run(self, run_id: str) -> dict | None: ...

    def has_run(self, run_id: str) -> bool: ...

    def scalar_keys(self, run_id: str) -> list[str]: ...

    def read_scalars(self, run_id: str, keys: Sequence[str] | None = None, downsample: int = 1000,
                     since_step: int | None = None) -> "pd.DataFrame": ...

    def read_scalars_of_runs(self, keys: Sequence[str], downsample: int = 24,
                             run_ids: Sequence[str] | None = None) -> "pd.DataFrame": ...

    def runs_page(self, *, where: Sequence[tuple[str, str, object]] = (),
                  order: Sequence[tuple[str, bool]] = (), limit: int = 50, offset: int = 0
                  ) -> "tuple[pd.DataFrame, int]": ...

    def read_histograms(self, run_id: str, key: str = "entropy", downsample: int = 1000,
                        since_step: int | None = None) -> "pd.DataFrame": ...

    def read_histogram_ends(self, run_id: str, key: str, at: int | None = None) -> "pd.DataFrame": ...

    def steps_scalars(self, run_id: str, steps: Sequence[int]) -> dict[int, dict[str, float]]: ...

    def token_steps(self, run_id: str, since_step: int | None = None) -> list[int]: ...

    def token_step_span(self, run_id: str) -> tuple[int, int | None, int | None]: ...

    def first_token_steps(self, run_id: str, n: int) -> list[int]: ...

    def nearest_token_steps(self, run_id: str, wanted: Sequence[int]) -> list[int | None]: ...

    def spread_token_steps(self, run_id: str, n: int) -> list[int]: ...

    def read_token_history(self, run_id: str, steps: Sequence[int], metric: str | Sequence[str],
                           prompt: str | None = None, per_step: int = 20_000) -> "pd.DataFrame": ...

    def read_tokens(self, run_id: str, step: int, sample_id: int | None = None,
                    limit: int = MAX_READ_TOKEN_ROWS) -> "pd.DataFrame": ...

    def read_samples(self, run_id: str, step: int | None = None, group_id: int | None = None,
                     limit: int = 10_000) -> "pd.DataFrame": ...

    def probe_steps(self, run_id: str) -> list[int]: ...

    def read_probes(self, run_id: str, step: int, sample_id: int | None = None,
                    limit: int = 100_000) -> "pd.DataFrame": ...

    def probe_page(self, run_id: str, step: int, sample_id: int | None, limit: int,
                   after: tuple[int, int, int, int] | None) -> "tuple[Any, int, str | None]": ...

    def reference_steps(self, run_id: str) -> list[int]: ...

    def read_reference(self, run_id: str, step: int, sample_id: int | None = None,
                       limit: int = 1_000_000) -> "pd.DataFrame": ...

    def reference_page(self, run_id: str, step: int, sample_id: int | None, limit: int,
                       after: tuple[int, int, int, int] | None) -> "tuple[Any, int, str | None]": ...

    def read_words(self, run_id: str, start: int | None = None, end: int | None = None, *, order: str = "count",
                   min_count: int = 1, limit: int = 200) -> "pd.DataFrame": ...

    def reference_words(self, run_id: str, step: int, *, order: str = "count", min_count: int = 1,
                        limit: int = 200) -> "pd.DataFrame": ...

    def read_alerts(self, run_id: str | None = None, since_step: int | None = None) -> "pd.DataFrame": ...

    def run_progress(self, run_id: str) -> tuple[int, int]: ...

    def read_alerts_page(self, *, run_ids: Sequence[str] = (), severities: Sequence[str] = (),
                         detectors: Sequence[str] = (), limit: int = 100, offset: int = 0
                         ) -> "tuple[pd.DataFrame, int]": ...

    def alert_detectors(self) -> list[str]: ...

    def row_counts(self, run_id: str) -> dict[str, int]: ...


@runtime_checkable
class AlertHub(Protocol):
    """Judges each complete step of each run; returns rows for the `alerts` table."""

    def on_step(self, run_id: str, step: int, scalars: dict[str, float],
                vocab_size: int | None = None) -> list[dict]: ...

    def close(self) -> None: ...
