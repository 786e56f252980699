"""bench/probes.py pools each distinct probed token once (issue 50, item 0): the runs of one seed
share weights, rollout and probe seed at step 1, so their first probes are the same tokens; six
such runs must count them once, while the same positions of another seed, or of a later step
where the runs' weights have parted, stay distinct tokens."""
from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
import probes  # noqa: E402


def _rows(seed: int, step: int, run: str, entropy: list[float], pivotal: list[bool]) -> pd.DataFrame:
    n = len(entropy)
    return pd.DataFrame({"run": run, "seed": seed, "step": step, "sample_id": 0, "pos": range(n),
                         "token_id": [10 + p for p in range(n)], "entropy": entropy,
                         "v_before": [0.5] * n, "v_after": [0.9 if p else 0.5 for p in pivotal],
                         "delta": [0.4 if p else 0.0 for p in pivotal], "pivotal": pivotal})


def test_the_first_probe_shared_by_six_runs_of_a_seed_counts_once():
    first = [_rows(0, 1, f"run{r}", [0.1, 0.8, 0.3], [False, True, False]) for r in range(6)]
    later = [_rows(0, 5, f"run{r}", [h + r / 100 for h in (0.1, 0.8, 0.3)], [False, True, False]) for r in range(2)]
    other_seed = [_rows(1, 1, "run0", [0.1, 0.8, 0.3], [False, True, False])]
    rows = pd.concat(first + later + other_seed, ignore_index=True)
    assert probes._pooled(rows)["probed_tokens"] == 6 * 3 + 2 * 3 + 3          # what pooling counted before
    pooled = probes._pooled(probes.distinct(rows))
    assert pooled["probed_tokens"] == 3 + 2 * 3 + 3 and pooled["pivotal_tokens"] == 1 + 2 + 1
    assert pooled["H>=0.672"]["precision"] == 1.0 and pooled["H>=0.672"]["share"] == round(4 / 12, 4)


def test_the_bisection_page_is_the_rendering_of_its_json():
    import json

    import probe_search

    out = json.loads((ROOT / "docs" / "probe_search.json").read_text())
    assert (ROOT / "docs" / "probe_search.md").read_text() == probe_search.markdown(out)
    # the page's claims are the JSON's: the replayed search meets the target at its default split
    assert out["meta"]["split_at"] == out["meta"]["pivotal_delta"] / 2
    assert out["replay_by_split_share_of_delta"]["0.5"]["recall_of_reproducible"] == out["recall_of_reproducible"]["replay"]
