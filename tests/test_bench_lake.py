"""bench/lake.py at a toy scale: it runs, every token row written is in the lake once, compaction
leaves one file per partition and expiry one snapshot per table. No time is asserted (figures are
the bench's to report; ratios only mean something at scale)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("pyiceberg", reason="the lake needs the `lake` extra: pip install -e '.[lake]'")

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_bench_lake_counts_at_toy_scale():
    runs, steps, tokens, bg, bg_steps, bg_tokens = 2, 12, 64, 3, 4, 10
    done = subprocess.run([sys.executable, str(REPO / "bench" / "lake.py"), "--runs", str(runs), "--steps", str(steps),
                           "--tokens", str(tokens), "--repeats", "1", "--page-repeats", "1", "--commit-rows", "300",
                           "--commit-seconds", "0.3", "--background-runs", str(bg), "--background-steps",
                           str(bg_steps), "--background-tokens", str(bg_tokens)],
                          capture_output=True, text=True, timeout=600, cwd=REPO)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout)
    assert report["scale"]["token_rows"] == runs * steps * tokens
    # the bench checks it; so does this: the measured runs' rows and the background runs'
    assert report["commit"]["lake_token_rows"] == runs * steps * tokens + bg * bg_steps * bg_tokens
    files = report["files_and_snapshots"]
    before, after, expired = files["before_compact"], files["after_compact"], files["after_compact_and_expire"]
    for name in ("scalars", "tokens", "samples", "histograms"):
        assert after[name]["files"] == runs + bg, name       # steps < 1000: one partition per run, one file each
        assert after[name]["rows"] == before[name]["rows"] and before[name]["files"] >= runs, name
        assert expired[name]["snapshots"] == 1, name
    assert after["all"]["files_per_1000_steps"] == pytest.approx(
        after["all"]["files"] * 1000 / (runs * steps + bg * bg_steps), abs=0.01)
    for page in ("run_page_first_open", "tokens_first_render"):
        figure = report["pages"][page]
        assert figure["lake_over_duckdb"] == pytest.approx(figure["lake_only_ms"] / figure["duckdb_ms"], abs=0.01)


def test_bench_lake_day_counts_snapshots_of_data_not_heartbeats():
    """`bench/lake.py --day` at a toy scale: 40 intervals, each a heartbeat, data in 4 of them: one snapshot per
    data commit in a step table and one overwrite (delete + append) of the run's row per data commit, none per
    heartbeat; expiry keeps the current snapshot and the newest metadata files."""
    done = subprocess.run([sys.executable, str(REPO / "bench" / "lake.py"), "--day", "--day-intervals", "40",
                           "--day-data-every", "10"], capture_output=True, text=True, timeout=300, cwd=REPO)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout)
    day, after = report["after_the_day"], report["after_the_committers_expiry"]
    assert report["heartbeats"] == 40 and report["data_steps"] == 4
    assert day["scalars"]["snapshots"] == 4 and day["tokens"]["snapshots"] == 4
    assert day["runs"]["snapshots"] <= 1 + 2 * 4                    # created, then one overwrite per data step
    assert all(1 <= after[t]["snapshots"] <= day[t]["snapshots"] for t in ("scalars", "tokens", "runs"))
