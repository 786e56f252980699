"""Where `forksight probe` and `forksight rescore` read a stored run and write their rows (probes, the
reference set): a DuckDB file (`--db`, opened as the one writer) or a collector (`--url`: the read
routes, then one idempotent ingest batch per write)."""
from __future__ import annotations

import os
import uuid
from typing import Any, Callable


class ProbeInputError(ValueError):
    """Input `forksight probe` cannot work with; the message names it and what to do."""


def reported(command: str, work: Callable[[], int]) -> int:
    """Run a stored-run command's work: bad input exits 2, a store that cannot be opened or a collector that
    is down exits 1, each said on one line naming the command."""
    import sys

    try:
        return work()
    except ProbeInputError as exc:
        print(f"forksight {command}: {exc}", file=sys.stderr)
        return 2
    except (RuntimeError, OSError) as exc:
        print(f"forksight {command}: {exc}", file=sys.stderr)
        return 1


def _hint(steps: list[int]) -> str:
    if not steps:
        return "none"
    return ", ".join(map(str, steps)) if len(steps) <= 12 else \
        f"{len(steps)} steps from {steps[0]} to {steps[-1]} (e.g. {', '.join(map(str, steps[:6]))}, ...)"


def _records(df) -> list[dict]:
    import pyarrow as pa

    return pa.Table.from_pandas(df, preserve_index=False).to_pylist()      # NaN -> None


class DbSource:
    """A DuckDB file, opened read-write (no collector may hold it)."""

    def __init__(self, path: str):
        from forksight.monitor.collector.store import Store

        if not os.path.exists(path):
            raise ProbeInputError(f"--db: no DuckDB file at {path}")
        self.store = Store(path, verify=False)
        self.reader = self.store.reader

    def __enter__(self) -> "DbSource":
        return self

    def __exit__(self, *exc) -> None:
        self.store.close()

    def run_config(self, run: str) -> dict:

        row = self.reader.run(run)
        if row is None:
            runs = self.reader.list_runs()["run_id"].tolist()
            raise ProbeInputError(f"no run {run!r} in {self.store.path}; runs there: {', '.join(runs) or 'none'}")
        return row.get("config") if isinstance(row.get("config"), dict) else {}

    def samples(self, run: str, step: int) -> list[dict]:
        return _records(self.reader.read_samples(run, step, limit=100_000))

    def tokens(self, run: str, step: int) -> list[dict]:
        return _records(self.reader.read_tokens(run, step, limit=2_000_000))

    def token_steps_hint(self, run: str) -> str:
        return _hint(self.reader.token_steps(run))

    def probe_rows(self, run: str) -> list[dict]:
        return [{**r, "step": s} for s in self.reader.probe_steps(run) for r in _records(self.reader.read_probes(run, s))]

    def reference_steps(self, run: str) -> list[int]:
        return self.reader.reference_steps(run)

    def reference(self, run: str, step: int) -> list[dict]:
        return _records(self.reader.read_reference(run, step))

    def set_config(self, run: str, config: dict) -> None:
        self.store.update_run(run, config=config)

    def write(self, run: str, step: int, rows: list[dict], scalars: dict[str, float], table: str = "probes") -> None:
        """`rows` of a keyed table (probes, reference) and `scalars` at `step`, in one write."""
        from forksight.base.records import Records, probes_table, reference_table, scalars_table
        from forksight.monitor.sinks.base import finite_scalars, keyed_rows

        warned: set = set()
        make = {"probes": probes_table, "reference": reference_table}[table]
        records = Records(scalars=scalars_table(finite_scalars(step, scalars, None, warned)),
                          **{table: make(keyed_rows(table, step, rows, warned))})
        self.store.write(run, records).result()


class UrlSource:
    """A collector: GET the run, its samples and token pages; POST one batch of probes and scalars."""

    def __init__(self, url: str, token: str | None = None):
        import httpx

        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.http = httpx.Client(base_url=url.rstrip("/"), headers=headers, timeout=120)
        self.url = url

    def __enter__(self) -> "UrlSource":
        return self

    def __exit__(self, *exc) -> None:
        self.http.close()

    def _get(self, path: str, **params) -> Any:
        import httpx


        try:
            resp = self.http.get(path, params=params)
        except httpx.HTTPError as exc:
            raise RuntimeError(f"no collector answers at {self.url} ({exc}); start `forksight serve` or "
                               "check --url") from None
        if resp.status_code == 404:
            raise ProbeInputError(resp.json().get("detail", f"{path}: not found"))
        if resp.status_code >= 400:
            raise RuntimeError(f"{self.url}{path} answered {resp.status_code}: {resp.text[:300]}")
        return resp

    def run_config(self, run: str) -> dict:
        config = self._get(f"/api/runs/{run}").json().get("config")
        return config if isinstance(config, dict) else {}

    def samples(self, run: str, step: int) -> list[dict]:
        return self._get(f"/api/runs/{run}/samples", step=step, limit=100_000).json()

    def _pages(self, path: str, **params) -> list[dict]:
        """Every row of a paged route (tokens, probes, reference), following X-Next-Cursor."""
        rows, cursor = [], None
        while True:
            resp = self._get(path, limit=100_000, **params, **({"cursor": cursor} if cursor else {}))
            rows += resp.json()
            if (cursor := resp.headers.get("X-Next-Cursor")) is None:
                return rows

    def tokens(self, run: str, step: int) -> list[dict]:
        return self._pages(f"/api/runs/{run}/tokens", step=step)

    def token_steps_hint(self, run: str) -> str:
        return _hint(self._get(f"/api/runs/{run}/token_steps").json())

    def probe_rows(self, run: str) -> list[dict]:
        return [{**r, "step": step} for step in self._get(f"/api/runs/{run}/probe_steps").json()
                for r in self._pages(f"/api/runs/{run}/probes", step=step)]

    def reference_steps(self, run: str) -> list[int]:
        return self._get(f"/api/runs/{run}/reference_steps").json()

    def reference(self, run: str, step: int) -> list[dict]:
        return self._pages(f"/api/runs/{run}/reference", step=step)

    def set_config(self, run: str, config: dict) -> None:
        resp = self.http.patch(f"/api/runs/{run}", json={"config": config})
        if resp.status_code >= 300:
            raise RuntimeError(f"the collector refused the run's new config ({resp.status_code}): {resp.text[:300]}")

    def write(self, run: str, step: int, rows: list[dict], scalars: dict[str, float], table: str = "probes") -> None:
        """`rows` of a keyed table (probes, reference) and `scalars` at `step`, in one ingest batch."""
        from forksight.monitor.sinks.base import finite_scalars, keyed_rows

        warned: set = set()
        body = {"batch_id": uuid.uuid4().hex, table: keyed_rows(table, step, rows, warned),
                "scalars": finite_scalars(step, scalars, None, warned)}
        resp = self.http.post(f"/api/runs/{run}/ingest", json=body)
        if resp.status_code >= 300:
            raise RuntimeError(f"the collector refused the {table} rows ({resp.status_code}): {resp.text[:500]}")


def add_run_source(parser) -> None:
    """--db FILE | --url URL [--token T] --run NAME: where a stored run is read (probe, report)."""
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--db", metavar="FILE", help="the DuckDB file (no collector may hold it)")
    where.add_argument("--url", help="a running collector (forksight serve) holding the run")
    parser.add_argument("--token", default=None, help="the collector's bearer token (--url)")
    parser.add_argument("--run", required=True, help="the run's id")


def open_source(args) -> DbSource | UrlSource:
    return DbSource(args.db) if args.db else UrlSource(args.url, args.token)
