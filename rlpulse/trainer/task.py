"""Synthetic tasks with a verifiable reward: reverse a word, or add two integers.

* ``reverse``: the prompt is ``"abc>"``, the answer ``"cba"``;
* ``addition``: the prompt is ``"a+b="``, the answer the decimal sum.

The verifier gives 1.0 for the exact answer and partial credit (below 0.5) for the share of
characters in the right place, so a policy that is almost right still gets a gradient.
Validation prompts are a fixed held-out set that training never samples.

>>> task = build_task(TaskConfig(name="reverse", val_prompts=4), seed=0)
>>> score("12", "12"), score("13", "12"), score("", "12")
(1.0, 0.25, 0.0)
"""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass
from typing import Protocol

from rlpulse.trainer.config import TaskConfig


@dataclass(frozen=True)
class Problem:
    """One prompt with its reference answer and a difficulty (answer digits plus carries)."""

    prompt: str
    answer: str
    difficulty: float


def score(response: str, answer: str) -> float:
    """1.0 for the exact answer; otherwise 0.5 x the share of positions where the response
    matches the answer digit (over the longer of the two), which is below 0.5."""
    response = response.strip()
    if response == answer:
        return 1.0
    width = max(len(response), len(answer))
    if width == 0:
        return 0.0
    same = sum(1 for a, b in zip(response, answer, strict=False) if a == b)
    return 0.5 * same / width


def is_correct(response: str, answer: str) -> bool:
    return response.strip() == answer


def _problem(a: int, b: int) -> Problem:
    carries = int((a % 10) + (b % 10) >= 10)
    answer = str(a + b)
    return Problem(f"{a}+{b}=", answer, float(len(answer) + carries))


def _reverse_problem(word: str) -> Problem:
    return Problem(f"{word}>", word[::-1], float(len(word)))


class ReverseTask:
    """All words of ``min_len``..``max_len`` letters over the first ``letters`` letters of the
    alphabet; the answer is the word reversed. A fixed seeded split holds out validation."""

    def __init__(
        self, letters: int, min_len: int, max_len: int, val_prompts: int, seed: int
    ) -> None:
        alphabet = "abcdefghijklmnopqrstuvwxyz"[:letters]
        words = [
            "".join(w)
            for n in range(min_len, max_len + 1)
            for w in itertools.product(alphabet, repeat=n)
        ]
        if val_prompts >= len(words):
            raise ValueError(f"val_prompts={val_prompts} leaves no training words ({len(words)})")
        random.Random(seed).shuffle(words)
        self.val = [_reverse_problem(w) for w in words[:val_prompts]]
        self.train = [_reverse_problem(w) for w in words[val_prompts:]]
        self._rng = random.Random(seed + 1)

    def sample(self, n: int) -> list[Problem]:
        return [self._rng.choice(self.train) for _ in range(n)]


class AdditionTask:
    """All pairs ``a+b`` with operands in ``[0, max_operand]``, split into a fixed held-out
    validation set and the training pool, by a seeded shuffle."""

    def __init__(self, max_operand: int, val_prompts: int, seed: int) -> None:
        pairs = [(a, b) for a in range(max_operand + 1) for b in range(max_operand + 1)]
        if val_prompts >= len(pairs):
            raise ValueError(f"val_prompts={val_prompts} leaves no training pairs ({len(pairs)})")
        random.Random(seed).shuffle(pairs)
        self.val = [_problem(a, b) for a, b in pairs[:val_prompts]]
        self.train = [_problem(a, b) for a, b in pairs[val_prompts:]]
        self._rng = random.Random(seed + 1)

    def sample(self, n: int) -> list[Problem]:
        """``n`` training problems drawn with replacement."""
        return [self._rng.choice(self.train) for _ in range(n)]


class Task(Protocol):
    """What the trainer needs from a task: held-out problems and a training sampler."""

    val: list[Problem]
    train: list[Problem]

    def sample(self, n: int) -> list[Problem]: ...


def build_task(cfg: TaskConfig, seed: int) -> Task:
    if cfg.name == "reverse":
        return ReverseTask(cfg.letters, cfg.min_len, cfg.max_len, cfg.val_prompts, seed)
    return AdditionTask(cfg.max_operand, cfg.val_prompts, seed)
