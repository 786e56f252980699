"""A NaN loss cannot be stored (the store keeps finite numbers), yet the collector must still
raise the non-finite alert: the sink sends a finite marker in its place, over HTTP too."""
from __future__ import annotations

import math

from collector_util import InProcessCollector

from forksight.monitor.sinks.client import open_sink
from forksight.base.limits import NONFINITE_PREFIX


def test_nan_and_inf_scalars_raise_the_non_finite_alert_through_a_real_collector(tmp_path):
    with InProcessCollector(tmp_path / "nf.duckdb") as server:
        sink = open_sink("nan-run", url=server.url)
        sink.log_scalars(1, {"loss": 0.5, "entropy/mean": 1.0})
        sink.log_scalars(2, {"loss": math.nan, "grad_norm": math.inf, "entropy/mean": 1.0})
        sink.log_scalars(3, {"loss": 0.4, "entropy/mean": 1.0})   # step 2 is judged once 3 arrives
        sink.finish()
        reader = server.collector.store.reader
        stored = reader.read_scalars(sink.run_id)
        at2 = dict(zip(stored[stored.step == 2].key, stored[stored.step == 2].value))
        assert "loss" not in at2 and "grad_norm" not in at2          # never stored as numbers
        assert at2[NONFINITE_PREFIX + "loss"] == 0.0                 # 0 = NaN
        assert at2[NONFINITE_PREFIX + "grad_norm"] == 1.0            # 1 = +inf
        alerts = reader.read_alerts(sink.run_id)
        nonfinite = alerts[alerts.detector == "non_finite"]
        assert len(nonfinite) == 1 and int(nonfinite.step.iloc[0]) == 2
        assert nonfinite.severity.iloc[0] == "critical"
        message = nonfinite.message.iloc[0]
        assert "loss=nan" in message and "grad_norm=inf" in message
        assert any(a["detector"] == "non_finite" for a in sink.alerts)  # and the client heard of it


def test_a_marker_that_would_exceed_the_key_limit_is_not_sent_and_the_batch_still_lands(tmp_path):
    from forksight.base.limits import MAX_KEY_CHARS

    long_key = "k" * MAX_KEY_CHARS                   # a valid key whose marker would be too long
    with InProcessCollector(tmp_path / "long.duckdb") as server:
        sink = open_sink("long-key", url=server.url)
        sink.log_scalars(1, {long_key: math.nan, "loss": 0.5})
        sink.finish()
        assert not sink.rejected
        stored = server.collector.store.reader.read_scalars(sink.run_id)
        assert stored.key.tolist() == ["loss"] and stored.value.tolist() == [0.5]
