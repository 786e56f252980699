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


def _study_tokens() -> pd.DataFrame:
    """Two probed completions of 10 tokens, worked by hand: in the first, the pivot (pos 3) has the
    highest H and the smallest margin; in the second, the pivot (pos 7) has the highest JS only."""
    import probe_rules  # noqa: F401

    rows = []
    for sid, pivot in ((0, 3), (1, 7)):
        for pos in range(10):
            rows.append({"run": "r", "step": 5, "split": "train", "sample_id": sid, "pos": pos,
                         "entropy": (0.9 if pos == pivot else 0.05 * pos) if sid == 0 else 0.05 * (9 - pos) + 0.01,
                         "js": (0.5 if pos == pivot else 0.01) if sid == 1 else 0.02 * pos,
                         "margin": (0.05 if pos == pivot else 0.9) if sid == 0 else 0.5 + 0.01 * pos,
                         "pivotal": pos == pivot, "h_q10": 0.44, "h_q20": 0.4, "h_q30": 0.35})
    return pd.DataFrame(rows)


def test_every_rule_is_scored_on_the_same_completions_as_worked_by_hand():
    import probe_rules

    picked = probe_rules.pick_columns(_study_tokens())
    # 20% of 10 tokens = 2 per completion, for every ranked rule, random included
    for rule in ("H 20%", "JS 20%", "margin 20%", "random 20%"):
        assert picked.groupby("sample_id")[rule].sum().tolist() == [2, 2]
    scored = probe_rules.score(picked, resamples=200)
    assert scored["tokens"] == 20 and scored["pivotal_tokens"] == 2 and scored["base_rate"] == 0.1
    rules = scored["rules"]
    # H top-2: completion 0 picks {3, 9} (the pivot), completion 1 picks {0, 1} (not 7): 1 hit of 4 picks
    assert rules["H 20%"]["precision"] == 0.25 and rules["H 20%"]["recall"] == 0.5
    assert rules["H 20%"]["lift"] == 2.5
    # JS top-2: completion 0 picks {8, 9}, completion 1 picks 7 and one more: 1 hit
    assert rules["JS 20%"]["recall"] == 0.5
    # the smallest margins: pos 3 in completion 0, pos 0 and 1 in completion 1
    assert rules["margin 20%"]["recall"] == 0.5
    # abs:0.672 picks the one token with H 0.9, the pivot: precision 1, recall 1/2
    assert rules["abs:0.672"]["precision"] == 1.0 and rules["abs:0.672"]["recall"] == 0.5
    assert rules["abs:0.672"]["share"] == 0.05 and rules["abs:0.672"]["f1"] == round(2 * 0.5 / 1.5, 4)
    # top:0.2 reads the step's threshold (0.4): H >= 0.4 is pos 3 (0.9), 8 and 9 of completion 0 and
    # 0 and 1 of completion 1 (0.46, 0.41)
    assert rules["top:0.2"]["share"] == 0.25
    for v in rules.values():          # every interval holds its point estimate
        for key in ("precision", "recall", "lift"):
            if v[key] is not None and v[f"{key}_ci"]:
                lo, hi = v[f"{key}_ci"]
                assert lo - 1e-9 <= v[key] <= hi + 1e-9
    assert probe_rules.best(scored, "defined") == "abs:0.672"


def test_a_table_without_a_pivot_scores_nothing():
    import probe_rules

    tokens = _study_tokens().assign(pivotal=False)
    assert probe_rules.score(probe_rules.pick_columns(tokens)) == {}


def test_the_study_page_is_the_rendering_of_its_json_and_has_the_power_asked():
    import json

    for page in ("probes", "probes_readable"):      # the study, and its first try on the readable preset
        tried = json.loads((ROOT / "docs" / f"{page}.json").read_text())
        assert (ROOT / "docs" / f"{page}.md").read_text() == probes.markdown(tried)
        assert tried["verdict"] == probes.verdict(tried["study"]["pooled"])
    out = json.loads((ROOT / "docs" / "probes.json").read_text())
    pooled = out["study"]["pooled"]
    # issue 50: at least 500 pivotal tokens over >= 3 seeds and both lrs
    assert pooled["pivotal_tokens"] >= 500 and len(out["meta"]["seeds"].split(",")) >= 3
    assert {r["lr_of"] for r in out["runs"]} == {"sweep", "preset"}
    # the same completions under every rule: equal counts at each share, random included
    rules = pooled["rules"]
    for share in ("10%", "20%", "30%"):
        assert len({rules[f"{name} {share}"]["share"] for name in ("H", "JS", "margin", "random")}) == 1
    # the verdict is the JSON's own: it names the best rule of each family
    import probe_rules

    assert f"`{probe_rules.best(pooled, '%')}` ranks best" in out["verdict"]
    assert f"`{probe_rules.best(pooled, 'defined')}` has the best F1" in out["verdict"]


def test_the_default_fork_rule_is_the_one_the_study_found_best():
    """Evidence decides the default (issue 50, item 4): the rule as defined with the best F1 against the
    study's pivotal tokens, its interval above the runner-up's."""
    import json

    import probe_rules

    from forksight.base.fork_rule import DEFAULT_FORK_RULE

    pooled = json.loads((ROOT / "docs" / "probes.json").read_text())["study"]["pooled"]
    best = probe_rules.best(pooled, "defined")
    assert str(DEFAULT_FORK_RULE) == best
    others = [v for r, v in pooled["rules"].items() if "%" not in r and r != best]
    assert all(pooled["rules"][best]["f1_ci"][0] > v["f1_ci"][1] for v in others)
