"""Reward functions `forksight probe --reward tests/probe_rewards.py:NAME` loads in the probe tests:
one that works, and one for each way a reward can be bad."""


def starts_with_digit(prompt: str, completion: str) -> float:
    return 1.0 if completion[:1].isdigit() else 0.0


def raises(prompt: str, completion: str) -> float:
    return 1 / 0


def not_a_number(prompt: str, completion: str):
    return "high"


def nan_reward(prompt: str, completion: str) -> float:
    return float("nan")
