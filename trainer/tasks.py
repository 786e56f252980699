"""Tasks with verifiers: procedural arithmetic (levels), addition worked in steps (readable
completions), countdown (several valid answers),
user problems from JSONL (checked with math-verify), and a "collapse" task whose optimum is
one deterministic string. Every verifier returns (reward, correct).
"""
from __future__ import annotations

import ast
import json
import operator
import random
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol


@dataclass(frozen=True)
class Problem:
    """One prompt, the reference answer, and a completion the warm-up can imitate."""

    prompt: str
    answer: str
    target: str  # a correct completion (without EOS), used by the supervised warm-up
    meta: dict = field(default_factory=dict, compare=False, hash=False)


class Task(Protocol):
    """What the trainer needs from a task."""

    name: str

    def sample(self, rng: random.Random) -> Problem: ...

    def verify(self, problem: Problem, completion: str) -> tuple[float, bool]: ...


def _clean(completion: str) -> str:
    """The answer is the completion's first line, stripped (EOS already removed by decode)."""
    return completion.strip().split("\n", 1)[0].strip()


# ---------------------------------------------------------------------------------------------
# Arithmetic: level 1 = two-digit addition, 2 = three-digit addition, 3 = two-digit minus
# two-digit (sign allowed), 4 = two-digit times one-digit. The answer is written with its digits
# reversed by default: the model then emits the least significant digit first, which is the
# order carries are computed in (DESIGN.md: reversed addition learns 2-4x faster).

_LEVELS = {
    1: (lambda r: (r.randint(10, 99), r.randint(10, 99)), "+", operator.add),
    2: (lambda r: (r.randint(100, 999), r.randint(100, 999)), "+", operator.add),
    3: (lambda r: (r.randint(10, 99), r.randint(10, 99)), "-", operator.sub),
    4: (lambda r: (r.randint(10, 99), r.randint(2, 9)), "*", operator.mul),
}


@dataclass
class ArithmeticTask:
    """`a OP b=` → the result (digits reversed when `reverse`); reward 1 exact, else 0."""

    level: int = 1
    reverse: bool = True
    name: str = "arith"

    def __post_init__(self) -> None:
        if self.level not in _LEVELS:
            raise ValueError(f"arithmetic level must be one of {sorted(_LEVELS)}, got {self.level}")
        self.name = f"arith{self.level}{'r' if self.reverse else ''}"

    def sample(self, rng: random.Random) -> Problem:
        draw, symbol, fn = _LEVELS[self.level]
        a, b = draw(rng)
        value = fn(a, b)
        answer = str(value)
        written = self.write(value)
        return Problem(prompt=f"{a}{symbol}{b}=", answer=answer, target=written)

    def write(self, value: int) -> str:
        """How the model is asked to write a number: reversed digits, sign first."""
        if not self.reverse:
            return str(value)
        sign = "-" if value < 0 else ""
        return sign + str(abs(value))[::-1]

    def verify(self, problem: Problem, completion: str) -> tuple[float, bool]:
        ok = _clean(completion) == self.write(int(problem.answer))
        return float(ok), ok


# ---------------------------------------------------------------------------------------------
# Countdown: make the target from some of the given numbers, each at most once, with + - *.
# Many answers are right (order, different subsets), so a collapsed policy loses pass@k.

_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul}


def _eval_expr(text: str) -> tuple[int, list[int]] | None:
    """Value and literals of an expression made of integers, + - * and brackets; else None."""
    if not re.fullmatch(r"[\d+\-*() ]{1,64}", text):
        return None
    try:
        tree = ast.parse(text, mode="eval").body
    except SyntaxError:
        return None
    used: list[int] = []

    def walk(node) -> int:
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            used.append(node.value)
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](walk(node.left), walk(node.right))
        raise ValueError("unsupported")

    try:
        return walk(tree), used
    except ValueError:
        return None


@dataclass
class CountdownTask:
    """`Use 3 7 9 to make 16:` → an expression such as `7+9`; reward 1 if right, 0.1 if it
    is a well-formed expression over the allowed numbers with the wrong value, else 0."""

    count: int = 3
    max_number: int = 20
    name: str = "countdown"

    def sample(self, rng: random.Random) -> Problem:
        numbers = [rng.randint(1, self.max_number) for _ in range(self.count)]
        a, b = rng.sample(numbers, 2)
        op = rng.choice(["+", "*"] if a * b <= 99 else ["+"])
        expr = f"{a}{op}{b}"
        target = eval(expr)  # noqa: S307 - built from two ints and one operator above
        prompt = f"Use {' '.join(map(str, numbers))} to make {target}:"
        return Problem(prompt=prompt, answer=str(target), target=expr,
                       meta={"numbers": numbers})

    def verify(self, problem: Problem, completion: str) -> tuple[float, bool]:
        parsed = _eval_expr(_clean(completion))
        if parsed is None:
            return 0.0, False
        value, used = parsed
        pool = list(self._numbers(problem))
        for n in used:
            if n not in pool:
                return 0.0, False
            pool.remove(n)
        ok = value == int(problem.answer)
        return (1.0 if ok else 0.1), ok

    @staticmethod
    def _numbers(problem: Problem) -> list[int]:
        if "numbers" in problem.meta:
            return problem.meta["numbers"]
        head = problem.prompt.split(" to make ")[0].removeprefix("Use ")
        return [int(x) for x in head.split()]


# ---------------------------------------------------------------------------------------------
# JSONL: user problems {"prompt": ..., "answer": ...}, verified by math-verify, so 1/2, 0.5
# and \frac{1}{2} all count as the same answer.


@dataclass
class JsonlTask:
    """Problems from a JSONL file; the verdict is math_verify.verify(parse(answer), parse(output))."""

    path: str
    name: str = "jsonl"
    problems: list[Problem] = field(default_factory=list, repr=False)

    def __post_init__(self) -> None:
        file = Path(self.path)
        if not file.exists():
            raise FileNotFoundError(f"JSONL task file {file} does not exist")
        for lineno, line in enumerate(file.read_text().splitlines(), 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{file}:{lineno}: not valid JSON ({exc.msg})") from exc
            if not isinstance(row, dict) or not {"prompt", "answer"} <= row.keys():
                raise ValueError(f"{file}:{lineno}: each line needs an object with 'prompt' and 'answer'")
            answer = str(row["answer"])
            self.problems.append(Problem(prompt=str(row["prompt"]), answer=answer, target=answer))
        if not self.problems:
            raise ValueError(f"{file} holds no problems")
        self.name = f"jsonl:{file.stem}"

    def sample(self, rng: random.Random) -> Problem:
        return rng.choice(self.problems)

    def verify(self, problem: Problem, completion: str) -> tuple[float, bool]:
        from math_verify import parse, verify

        gold = parse(_as_math(problem.answer))
        guess = parse(_as_math(_clean(completion)))
        ok = bool(gold) and bool(guess) and bool(verify(gold, guess))
        return float(ok), ok


def _as_math(text: str) -> str:
    """math-verify extracts from LaTeX or $…$; wrap bare answers so '0.5' parses as a number."""
    return text if "$" in text or "\\" in text else f"${text}$"


# ---------------------------------------------------------------------------------------------
# Collapse: the best completion is one fixed string whatever the prompt. The reward is graded
# (matching characters), so GRPO gets signal from the first step, and the optimum is
# deterministic: with a high learning rate entropy falls to ~0 within ~100 steps.


@dataclass
class CollapseTask:
    """Any prompt → the fixed string `goal`; reward = fraction of positions matching it."""

    goal: str = "7777"
    name: str = "collapse"

    def sample(self, rng: random.Random) -> Problem:
        a, b = rng.randint(10, 99), rng.randint(10, 99)
        return Problem(prompt=f"{a}+{b}=", answer=self.goal, target=self.goal)

    def verify(self, problem: Problem, completion: str) -> tuple[float, bool]:
        text = _clean(completion)
        hits = sum(x == y for x, y in zip(text, self.goal))
        reward = hits / max(len(self.goal), len(text)) if text else 0.0
        return reward, text == self.goal


# ---------------------------------------------------------------------------------------------
# Steps: column addition written out in words and digits, so a completion reads as reasoning:
# "58+67: 8+7=15 carry 1, 5+6+1=12 carry 1, answer 125". The model is uncertain where the sum
# needs work (a step's result, a carry, the answer's digits) and sure where it copies digits.

_ANSWER = re.compile(r"answer (-?\d+)\s*$")


@dataclass
class StepsTask:
    """`a+b:` → the column sum step by step, then `answer N`; correct if N = a+b. The reward is
    1/0 on that or, `graded`, the fraction of the reference's characters the completion writes
    in place: a dense reward that wants the worked steps right too (a right answer after wrong
    steps scores less), and whose optimum is one string per prompt."""

    digits: int = 2
    graded: bool = False
    name: str = "steps"
    max_new_tokens: int = 40  # two digits: at most 37 tokens and EOS
    # the supervised warm-up that reaches sampled pass@1 0.3 fastest on the tiny model (measured:
    # ~400 steps; 256-row batches at 2e-3 take 4x longer per step for no fewer steps)
    warmup_settings: dict = field(default_factory=lambda: {"lr": 3e-3, "batch": 64}, repr=False)

    def __post_init__(self) -> None:
        if self.digits not in (2, 3):
            raise ValueError(f"steps task digits must be 2 or 3, got {self.digits}")
        self.name = f"steps{self.digits}"
        self.max_new_tokens = 40 if self.digits == 2 else 58

    def sample(self, rng: random.Random) -> Problem:
        low, high = 10 ** (self.digits - 1), 10 ** self.digits - 1
        a, b = rng.randint(low, high), rng.randint(low, high)
        return Problem(prompt=f"{a}+{b}:", answer=str(a + b), target=self.write(a, b))

    @staticmethod
    def write(a: int, b: int) -> str:
        """The worked sum, least significant column first: ` 7+2=9, 2+8=10 carry 1, answer 109`."""
        xs, ys = str(a)[::-1], str(b)[::-1]
        steps, carry = [], 0
        for i in range(max(len(xs), len(ys))):
            terms = [xs[i] if i < len(xs) else "0", ys[i] if i < len(ys) else "0"] + (["1"] if carry else [])
            total = sum(map(int, terms))
            carry = total // 10
            steps.append(f"{'+'.join(terms)}={total}" + (" carry 1" if carry else ""))
        return " " + ", ".join(steps) + f", answer {a + b}"

    def verify(self, problem: Problem, completion: str) -> tuple[float, bool]:
        text = _clean(completion)
        found = _ANSWER.search(text)
        ok = bool(found) and found.group(1) == problem.answer
        if not self.graded:
            return float(ok), ok
        want = problem.target.strip()
        return sum(w == g for w, g in zip(want, text)) / max(len(want), len(text)), ok


def make_task(name: str, *, level: int = 1, reverse: bool = True, path: str | None = None,
              graded: bool = False) -> Task:
    """Task by name: arith, steps (level 1: two digits, else three; `graded`: partial credit per
    character of the worked solution), countdown, jsonl (needs path), collapse."""
    if name == "arith":
        return ArithmeticTask(level=level, reverse=reverse)
    if name == "countdown":
        return CountdownTask()
    if name == "jsonl":
        if not path:
            raise ValueError("task 'jsonl' needs task_path: a JSONL file of {prompt, answer} lines")
        return JsonlTask(path)
    if name == "collapse":
        return CollapseTask()
    if name == "steps":
        return StepsTask(digits=2 if level == 1 else 3, graded=graded)
    raise ValueError(f"unknown task {name!r}: choose arith, steps, countdown, jsonl or collapse")


@dataclass
class ProblemPool:
    """A task restricted to `size` problems drawn once from `seed`: few-shot RLVR (Wang et al.
    2025, "Reinforcement Learning for Reasoning in Large Language Models with One Training
    Example"). The policy can learn each problem's answer, so it sharpens, and can collapse,
    within a short run; verification is the task's own."""

    task: Task
    size: int
    seed: int = 0
    name: str = ""
    problems: list[Problem] = field(default_factory=list, repr=False)

    def __post_init__(self) -> None:
        if self.size < 1:
            raise ValueError(f"a problem pool needs at least one problem, got {self.size}")
        rng = random.Random(f"pool-{self.seed}")
        self.problems = [self.task.sample(rng) for _ in range(self.size)]
        self.name = f"{self.task.name}x{self.size}"

    def sample(self, rng: random.Random) -> Problem:
        return rng.choice(self.problems)

    def verify(self, problem: Problem, completion: str) -> tuple[float, bool]:
        return self.task.verify(problem, completion)


def held_out(task: Task, n: int, seed: int) -> list[Problem]:
    """A fixed set of evaluation problems from their own seed. Not disjoint from training:
    two-digit addition has only 8,100 problems, so some also appear in training batches. A
    ProblemPool's are drawn from its whole task, never from the pool (that would test the
    problems the run trains on: memorisation read as held-out skill)."""
    rng = random.Random(f"eval-{seed}")
    if not isinstance(task, ProblemPool):
        return [task.sample(rng) for _ in range(n)]
    pool = {p.prompt for p in task.problems}
    out: list[Problem] = []
    for _ in range(1000 * n):  # bounded: a task with no problem outside the pool must not hang
        problem = task.task.sample(rng)
        if problem.prompt not in pool:
            out.append(problem)
            if len(out) == n:
                return out
    raise ValueError(f"held_out: the task {task.task.name!r} has no problems outside its pool of "
                     f"{task.size}; use a larger task or no problem_pool")
