"""bench/trust_region.py's figures (issue 49): the docs page's table and findings are rendered from
the committed docs/trust_region.json, each configuration's mean is the mean of its runs recomputed
here, the figures are shares in [0, 1], and the answers the page gives follow from the rows."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
import marked_block  # noqa: E402
import trust_region  # noqa: E402

DOC = json.loads((ROOT / "docs" / "trust_region.json").read_text())


def test_the_page_is_rendered_from_the_committed_figures():
    page = trust_region.PAGE.read_text()
    stale = "stale: run `python bench/trust_region.py --render`"
    assert marked_block.block(page, trust_region.BEGIN, trust_region.END) == trust_region.table(DOC), stale
    assert marked_block.block(page, trust_region.FBEGIN, trust_region.FEND) == trust_region.findings(DOC), stale


def test_the_study_covers_both_lrs_each_configuration_and_three_seeds():
    configs = {(r["lr_name"], r["region"], r["updates"]) for r in DOC["rows"]}
    assert configs == {(lr, region, u) for lr in trust_region.LRS for region, u in trust_region.CONFIGS}
    assert all(r["seeds"] == [0, 1, 2] for r in DOC["rows"]) and DOC["meta"]["steps"] == 300


@pytest.mark.parametrize("key", ["trust/clip_frac", "trust/tv_outside_frac/q4", "eval_pass8_last", "entropy_end"])
def test_each_rows_mean_is_the_mean_of_its_runs(key):
    for row in DOC["rows"]:
        runs = [r for r in DOC["runs"] if (r["lr_name"], r["region"], r["updates"]) == (row["lr_name"], row["region"],
                                                                                          row["updates"])]
        values = [(r["trust"].get(key) if key.startswith("trust/") else r[key]) for r in runs]
        values = [v for v in values if v is not None]
        fig = row["figures"][key]
        if not values:
            assert fig["mean"] is None
            continue
        assert fig["mean"] == pytest.approx(float(np.mean(values)), rel=1e-9)
        assert fig["lo"] <= fig["mean"] <= fig["hi"]


def test_shares_are_shares_and_one_update_logs_no_trust_scalars():
    for run in DOC["runs"]:
        for key, value in run["trust"].items():
            if "frac" in key:
                assert 0.0 <= value <= 1.0, (run, key)
        if run["updates"] == 1 and run["region"] == "ratio":
            assert run["trust"] == {}          # the policy never moved when it trained: nothing to report
        if run["region"] == "tv":
            assert "trust/masked_frac" in run["trust"]


def test_the_asymmetry_answer_follows_from_the_rows():
    for lr in trust_region.LRS:
        row = next(r for r in DOC["rows"] if (r["lr_name"], r["region"], r["updates"]) == (lr, "ratio", 4))
        f = row["figures"]
        want = (f["trust/clip_frac/q4"]["mean"] > f["trust/clip_frac/q1"]["mean"]
                and f["trust/clipped_inside_frac"]["mean"] > 0.5)
        assert trust_region.asymmetry(DOC, lr) == want
