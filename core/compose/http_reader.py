"""The Reader a running collector answers (`--url`): the reads the run page's figures, the HTML report
and the notebook functions make, each a GET of the collector's read API (docs/collector.md), so a
notebook or `forksight report --url` reads a run while it trains, without the DuckDB file (which the
collector holds). Token and probe steps are read page by page (X-Next-Cursor); every read is bounded
by the API's own limits. A collector that does not answer, refuses the token or does not know the
run raises with what to do."""
from __future__ import annotations

from typing import Any, Sequence

import pandas as pd

MAX_POINTS = 100_000          # the API's most points per series (routes_read.Downsample)
PAGE = 100_000                # the API's most rows per token or probe page


class HttpReader:
    """Reader over http(s)://host:port of `forksight serve`; `token`: its bearer token, if any."""

    def __init__(self, url: str, token: str | None = None, timeout: float = 120.0):
        import httpx

        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.url = url.rstrip("/")
        self.http = httpx.Client(base_url=self.url, headers=headers, timeout=timeout)

    def __enter__(self) -> "HttpReader":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self.http.close()

    def _get(self, path: str, *, missing_ok: bool = False, **params) -> Any:
        import httpx

        params = {k: v for k, v in params.items() if v is not None}
        try:
            resp = self.http.get(path, params=params)
        except httpx.HTTPError as exc:
            raise ConnectionError(f"no collector answers at {self.url} ({exc}): start `forksight serve` "
                                  "or check the url") from None
        if resp.status_code == 404 and missing_ok:
            return None
        if resp.status_code == 401:
            raise PermissionError(f"{self.url} wants a bearer token: pass token= (the collector's --token)")
        if resp.status_code == 404:
            raise KeyError(_detail(resp) or f"{path}: not found at {self.url}")
        if resp.status_code >= 400:
            raise RuntimeError(f"{self.url}{path} answered {resp.status_code}: {resp.text[:300]}")
        return resp

    def _frame(self, path: str, **params) -> pd.DataFrame:
        return pd.DataFrame(self._get(path, **params).json())

    def _pages(self, path: str, **params) -> pd.DataFrame:
        rows, cursor = [], None
        while True:
            resp = self._get(path, limit=PAGE, cursor=cursor, **params)
            rows += resp.json()
            cursor = resp.headers.get("X-Next-Cursor")
            if cursor is None:
                return pd.DataFrame(rows)

    # runs ------------------------------------------------------------------------------------
    def list_runs(self) -> pd.DataFrame:
        return self._frame("/api/runs")

    def run(self, run_id: str) -> dict | None:
        resp = self._get(f"/api/runs/{run_id}", missing_ok=True)
        return None if resp is None else resp.json()

    def has_run(self, run_id: str) -> bool:
        return self.run(run_id) is not None

    def row_counts(self, run_id: str) -> dict[str, int]:
        return self._get(f"/api/runs/{run_id}/counts").json()

    # scalars and histograms ------------------------------------------------------------------
    def scalar_keys(self, run_id: str) -> list[str]:
        return self._get(f"/api/runs/{run_id}/scalar_keys").json()

    def read_scalars(self, run_id: str, keys: Sequence[str] | None = None, downsample: int = 1000,
                     since_step: int | None = None) -> pd.DataFrame:
        frame = self._frame(f"/api/runs/{run_id}/scalars", keys=",".join(keys) if keys else None,
                            downsample=min(int(downsample), MAX_POINTS), since_step=since_step)
        return frame if len(frame) else pd.DataFrame({c: [] for c in ("key", "step", "value", "wall_time")})

    def steps_scalars(self, run_id: str, steps: Sequence[int]) -> dict[int, dict[str, float]]:
        out: dict[int, dict[str, float]] = {}
        for step in dict.fromkeys(int(s) for s in steps):
            frame = self.read_scalars(run_id, downsample=2, since_step=step)   # its first step is always kept
            at = frame[frame["step"] == step]
            if len(at):
                out[step] = dict(zip(at["key"], at["value"].astype(float)))
        return out

    def read_histograms(self, run_id: str, key: str = "entropy", downsample: int = 1000,
                        since_step: int | None = None) -> pd.DataFrame:
        frame = self._frame(f"/api/runs/{run_id}/histograms", key=key, downsample=min(int(downsample), MAX_POINTS),
                            since_step=since_step)
        return frame if len(frame) else pd.DataFrame({c: [] for c in ("step", "bin_lo", "bin_hi", "count")})

    def read_histogram_ends(self, run_id: str, key: str, at: int | None = None) -> pd.DataFrame:
        """The first step holding the histogram and the last at or before `at`, from the route's
        downsampled read (its first and last steps are always kept)."""
        frame = self.read_histograms(run_id, key, downsample=MAX_POINTS)
        if frame.empty:
            return frame
        steps = sorted(s for s in frame["step"].unique() if at is None or s <= at)
        keep = {steps[0], steps[-1]} if steps else set()
        return frame[frame["step"].isin(keep)].reset_index(drop=True)

    # alerts ----------------------------------------------------------------------------------
    def read_alerts(self, run_id: str | None = None, since_step: int | None = None) -> pd.DataFrame:
        return self._frame("/api/alerts", run_id=run_id, since_step=since_step)

    # tokens, samples, probes -----------------------------------------------------------------
    def token_steps(self, run_id: str, since_step: int | None = None) -> list[int]:
        steps = self._get(f"/api/runs/{run_id}/token_steps").json()
        return [s for s in steps if since_step is None or s >= since_step]

    def first_token_steps(self, run_id: str, n: int) -> list[int]:
        return self.token_steps(run_id)[:max(0, int(n))]

    def read_tokens(self, run_id: str, step: int, sample_id: int | None = None, **_) -> pd.DataFrame:
        return self._pages(f"/api/runs/{run_id}/tokens", step=int(step), sample_id=sample_id)

    def read_samples(self, run_id: str, step: int | None = None, group_id: int | None = None,
                     limit: int = 10_000) -> pd.DataFrame:
        return self._frame(f"/api/runs/{run_id}/samples", step=step, group_id=group_id, limit=limit)

    def probe_steps(self, run_id: str) -> list[int]:
        return self._get(f"/api/runs/{run_id}/probe_steps").json()

    def read_probes(self, run_id: str, step: int, sample_id: int | None = None, **_) -> pd.DataFrame:
        return self._pages(f"/api/runs/{run_id}/probes", step=int(step), sample_id=sample_id)

    def reference_steps(self, run_id: str) -> list[int]:
        return self._get(f"/api/runs/{run_id}/reference_steps").json()

    def read_reference(self, run_id: str, step: int, sample_id: int | None = None, **_) -> pd.DataFrame:
        return self._pages(f"/api/runs/{run_id}/reference", step=int(step), sample_id=sample_id)


def _detail(resp) -> str | None:
    try:
        detail = resp.json().get("detail")
    except ValueError:
        return None
    return detail if isinstance(detail, str) else None
