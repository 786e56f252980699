"""bench/reference.py (issue 48 item 6): when a signal "moved" and how far ahead of the alert, and the per-lr
summary, on hand-made runs; the docs page is the rendering of its stored JSON, and its verdicts are the
JSON's numbers."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
import reference  # noqa: E402


def test_a_signal_moves_at_the_first_step_past_its_threshold():
    scalars = pd.DataFrame({"step": [0, 10, 20, 30, 0, 10, 20], "key": ["ref/fork_overlap"] * 4 + ["ref/entropy/base_forks"] * 3,
                            "value": [1.0, 0.9, 0.79, 0.5, 1.2, 0.7, 0.5]})
    assert reference._moved(scalars, "ref/fork_overlap") == 20
    assert reference._moved(scalars, "ref/entropy/base_forks") == 20          # below half of 1.2
    assert reference._moved(scalars, "ref/spearman") is None


def _run(lr, seed, overlap, deciles, alert, moved):
    return {"lr": lr, "seed": seed, "fork_overlap": overlap, "spearman": 0.9, "dh_by_decile": deciles,
            "first_collapse_alert": alert, "lead": {"ref/fork_overlap": None if alert is None or moved is None
                                                    else alert - moved}}


def test_the_summary_averages_seeds_and_the_top_decile_share_is_of_the_sum():
    flat, rising = [0.1] * 10, [0.01] * 9 + [0.91]
    runs = [_run(5e-4, 0, 0.4, rising, 40, 30), _run(5e-4, 1, 0.6, rising, None, 20),
            _run(5e-5, 0, 0.9, flat, None, None)]
    s = reference.summary(runs)
    assert s["0.0005"]["fork_overlap"] == pytest.approx(0.5) and s["0.0005"]["collapse_alerts"] == 1
    assert s["0.0005"]["top_decile_share"] == pytest.approx(0.91 / 1.0, abs=1e-3)
    assert s["5e-05"]["top_decile_share"] == pytest.approx(0.1) and s["0.0005"]["lead_overlap"] == [10, None]


def test_the_page_is_the_rendering_of_its_json():
    out = json.loads((ROOT / "docs" / "reference.json").read_text())
    assert (ROOT / "docs" / "reference.md").read_text() == reference.markdown(out)
    assert out["summary"] == reference.summary(out["runs"]) and out["verdict"] == reference.verdict(out)
    assert len(out["runs"]) == 6 and {r["seed"] for r in out["runs"]} == {0, 1, 2}
