"""Tasks and verifiers on hand-worked cases."""
from __future__ import annotations

import json
import random

import pytest

from forksight.trainer.tasks import (ArithmeticTask, CollapseTask, CountdownTask, JsonlTask, Problem,
                           held_out, make_task)


def test_reversed_addition_accepts_only_the_reversed_sum():
    task = ArithmeticTask(level=1, reverse=True)
    p = Problem(prompt="47+38=", answer="85", target="58")
    assert task.verify(p, "58") == (1.0, True)
    assert task.verify(p, " 58\nanything after the first line") == (1.0, True)
    assert task.verify(p, "85") == (0.0, False)  # the unreversed sum is wrong by construction
    assert task.verify(p, "") == (0.0, False)


def test_arithmetic_levels_generate_what_their_prompt_says():
    rng = random.Random(3)
    for level, symbol in ((1, "+"), (2, "+"), (3, "-"), (4, "*")):
        task = ArithmeticTask(level=level)
        for _ in range(20):
            p = task.sample(rng)
            a, b = p.prompt.rstrip("=").split(symbol, 1)
            value = {"+": int(a) + int(b), "-": int(a) - int(b), "*": int(a) * int(b)}[symbol]
            assert int(p.answer) == value
            assert task.verify(p, p.target) == (1.0, True)
    negative = Problem(prompt="12-47=", answer="-35", target="-53")
    assert ArithmeticTask(level=3).verify(negative, "-53")[1]
    with pytest.raises(ValueError, match="level"):
        ArithmeticTask(level=9)


def test_countdown_accepts_every_valid_expression_and_checks_the_numbers():
    task = CountdownTask()
    p = Problem(prompt="Use 3 7 9 to make 16:", answer="16", target="7+9",
                meta={"numbers": [3, 7, 9]})
    for good in ("7+9", "9+7", "(9+7)"):
        assert task.verify(p, good) == (1.0, True)
    assert task.verify(p, "3*7-9+4") == (0.0, False)     # 4 is not an allowed number
    assert task.verify(p, "7+7+2") == (0.0, False)        # 7 twice
    assert task.verify(p, "3+9") == (0.1, False)          # well formed, wrong value
    assert task.verify(p, "__import__('os')") == (0.0, False)
    # numbers recovered from the prompt when meta is absent (e.g. loaded from a file)
    bare = Problem(prompt="Use 2 5 6 to make 30:", answer="30", target="5*6")
    assert task.verify(bare, "6*5") == (1.0, True)
    rng = random.Random(1)
    for _ in range(30):
        q = task.sample(rng)
        assert task.verify(q, q.target) == (1.0, True)


def test_jsonl_uses_math_verify_for_equivalent_forms(tmp_path):
    path = tmp_path / "problems.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in [
        {"prompt": "Half of one?", "answer": "1/2"},
        {"prompt": "Square root of 16?", "answer": "4"},
    ]) + "\n")
    task = JsonlTask(str(path))
    half, four = task.problems
    assert task.verify(half, "0.5") == (1.0, True)
    assert task.verify(half, "\\frac{1}{2}") == (1.0, True)
    assert task.verify(half, "0.25") == (0.0, False)
    assert task.verify(four, "4.0") == (1.0, True)
    assert task.verify(four, "5") == (0.0, False)
    assert task.sample(random.Random(0)) in task.problems


def test_jsonl_errors_name_the_line(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "x", "answer": "1"}\n{"prompt": "no answer"}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:2: .*'prompt' and 'answer'"):
        JsonlTask(str(bad))
    with pytest.raises(FileNotFoundError):
        JsonlTask(str(tmp_path / "missing.jsonl"))
    with pytest.raises(ValueError, match="task_path"):
        make_task("jsonl")


def test_collapse_reward_is_graded_and_peaks_only_at_the_goal():
    task = CollapseTask(goal="7777")
    p = task.sample(random.Random(0))
    assert task.verify(p, "7777") == (1.0, True)
    assert task.verify(p, "7717") == (0.75, False)
    assert task.verify(p, "77777777") == (0.5, False)  # longer than the goal is penalised
    assert task.verify(p, "") == (0.0, False)


def test_held_out_is_deterministic_per_seed():
    task = make_task("arith")
    assert held_out(task, 5, 0) == held_out(task, 5, 0)
    assert held_out(task, 5, 0) != held_out(task, 5, 1)


def test_steps_task_writes_the_column_sum_in_words_and_checks_only_the_answer():
    from forksight.trainer.tasks import StepsTask

    task = StepsTask()
    assert task.write(27, 82) == " 7+2=9, 2+8=10 carry 1, answer 109"      # the example
    assert task.write(58, 67) == " 8+7=15 carry 1, 5+6+1=12 carry 1, answer 125"
    assert task.write(10, 10) == " 0+0=0, 1+1=2, answer 20"
    p = Problem(prompt="27+82:", answer="109", target=task.write(27, 82))
    assert task.verify(p, p.target) == (1.0, True)
    assert task.verify(p, " 7+2=8, 2+8=10 carry 1, answer 109") == (1.0, True)  # the answer decides
    assert task.verify(p, " 7+2=9, 2+8=10 carry 1, answer 108") == (0.0, False)
    assert task.verify(p, " 7+2=9, 2+8=10 carry 1, answer 1090") == (0.0, False)
    assert task.verify(p, "answer 109 and more") == (0.0, False)
    rng = random.Random(1)
    for _ in range(200):   # every generated target is its own correct answer, and the sum adds up
        q = task.sample(rng)
        a, b = map(int, q.prompt.rstrip(":").split("+"))
        assert q.answer == str(a + b) and task.verify(q, q.target)[1]
    assert make_task("steps").name == "steps2" and make_task("steps", level=2).name == "steps3"
    assert StepsTask(digits=3).write(999, 1) == " 9+1=10 carry 1, 9+0+1=10 carry 1, 9+0+1=10 carry 1, answer 1000"
    with pytest.raises(ValueError, match="2 or 3"):
        StepsTask(digits=4)


def test_the_tiny_tokenizer_writes_steps_as_whole_words_and_single_digits(tiny):
    from forksight.trainer.tasks import StepsTask

    _, tokenizer = tiny
    text = StepsTask.write(58, 67)
    pieces = [tokenizer.decode([i]) for i in tokenizer(text).input_ids]
    assert " carry" in pieces and " answer" in pieces
    assert all(len(p) == 1 for p in pieces if any(ch.isdigit() for ch in p))   # one token per digit
    assert "".join(pieces) == text


def test_graded_steps_score_each_character_of_the_worked_solution_in_place():
    from forksight.trainer.tasks import StepsTask

    task = StepsTask(graded=True)
    target = task.write(27, 82)                   # " 7+2=9, 2+8=10 carry 1, answer 109": 34 chars
    p = Problem(prompt="27+82:", answer="109", target=target)
    n = len(target.strip())
    assert n == 33
    assert task.verify(p, target) == (1.0, True)
    # one wrong step digit: 32 of 33 characters in place, and the answer still right
    assert task.verify(p, " 7+2=8, 2+8=10 carry 1, answer 109") == (32 / 33, True)
    # a wrong answer digit: also 32/33, but not correct (pass@k counts answers, not the grade)
    assert task.verify(p, " 7+2=9, 2+8=10 carry 1, answer 108") == (32 / 33, False)
    # a longer completion is scored against its own length: 33 in place of 37 characters
    assert task.verify(p, target + " and") == (33 / 37, False)
    assert task.verify(p, "") == (0.0, False)
    # ungraded, the answer alone decides
    assert StepsTask().verify(p, " 7+2=8, 2+8=10 carry 1, answer 109") == (1.0, True)


def test_a_problem_pool_draws_only_its_own_problems_and_verifies_as_the_task_does():
    from forksight.trainer.tasks import ProblemPool, StepsTask

    base = StepsTask()
    pool = ProblemPool(base, 4, seed=3)
    rng = random.Random(0)
    drawn = {pool.sample(rng) for _ in range(400)}
    assert drawn == set(pool.problems) and len(pool.problems) == 4      # all four, nothing else
    assert [p.prompt for p in ProblemPool(base, 4, seed=3).problems] == [p.prompt for p in pool.problems]
    assert [p.prompt for p in ProblemPool(base, 4, seed=4).problems] != [p.prompt for p in pool.problems]
    p = pool.problems[0]
    assert pool.verify(p, p.target) == base.verify(p, p.target) == (1.0, True)
    assert pool.name == "steps2x4"
    with pytest.raises(ValueError, match="at least one"):
        ProblemPool(base, 0)
