"""Test-only rule reward for tests/verl_main.py, loaded by verl's `reward.custom_reward_function.path`.

A tiny random model never adds numbers, so the rule is a coin flip that depends only on the text
(correct when the response's decoded text has an even length): what is checked downstream is
the bookkeeping (uid groups, pass@k), not the arithmetic. A ground truth of "nan" scores NaN (a
diverged reward: a critical alert, on request). Each verdict is appended, with the prompt's
dataset index, to $FORKSIGHT_TEST_VERDICTS, for the test's hand count.
"""
import json
import os


def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    acc = len(solution_str) % 2 == 0 and ground_truth != "nan"
    path = os.environ.get("FORKSIGHT_TEST_VERDICTS")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps({"index": (extra_info or {}).get("index"), "acc": acc}) + "\n")
    return {"score": float("nan") if ground_truth == "nan" else float(acc), "acc": acc}
