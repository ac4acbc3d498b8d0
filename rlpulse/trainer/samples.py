"""The rows the trainer logs as samples: one per generation, with the numbers behind it.

Pure functions of what the driver (:mod:`rlpulse.trainer.driver`) already holds; they log
nothing. Where each is meant to be called, once the ``Samples`` value is in the producer:

* :func:`rollout_rows`, in ``Driver.step`` at stage 9, beside ``emit.batch_data``: by then
  ``batch`` is the advantage stage's output (``adv.batch`` with ``positive`` set), so it holds
  the verifier's ``scores``, the ``advantages``, the trainer's ``old_log_probs`` and the
  engine's ``rollout_log_probs``; ``gen`` is the step's ``Generation`` (its texts and
  ``policy_version``) and the prompts are ``[p.prompt for p in problems]``, in batch order.
  Logged as ``Samples(rows, key=ROLLOUT_KEY)``.
* :func:`validation_rows`, in ``Driver.validate`` after the scores are computed, beside
  ``emit.validation``: the held-out prompts, the greedy ``gen`` and ``scores``. Logged as
  ``Samples(rows, key=VALIDATION_KEY)``.

Per-token values are reduced to one number per sample over its response tokens
(``response_mask``), not the loss mask: an invalid sample (truncated, filtered) is still a
generation worth reading, and usually the one to read. The reductions are done on the whole
batch at once and moved to Python in one ``tolist()`` per field, so a batch on the GPU syncs a
handful of times, not once per sample.

>>> import torch
>>> from rlpulse.trainer.rollout import Generation
>>> mask = torch.tensor([[1.0, 1.0, 0.0]])
>>> b = RolloutBatch(torch.zeros(1, 4, dtype=torch.long), torch.ones(1, 4), mask, 1,
...                  scores=torch.tensor([1.0]), advantages=torch.tensor([[0.5, 1.5, 9.0]]),
...                  old_log_probs=torch.tensor([[-1.0, -2.0, 0.0]]))
>>> rollout_rows(["1+1="], Generation(b, ["2"], torch.tensor([False]), 3), b, step=5)
[{'prompt': '1+1=', 'response': '2', 'reward': 1.0, 'advantage': 1.0, 'response_length': 2, \
'logprob_mismatch': None, 'staleness': 2}]
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from rlpulse.trainer.batch import RolloutBatch
from rlpulse.trainer.rollout import Generation

Row = dict[str, str | int | float | None]

PROMPT = "prompt"
RESPONSE = "response"
REWARD = "reward"
"""The verifier's score of the sample (``batch.scores``), not the normalised reward
(``batch.rewards``): ranking by the score shows the best and worst answers of the step, while a
normalised reward is relative to its batch or GRPO group."""
ADVANTAGE = "advantage"
RESPONSE_LENGTH = "response_length"
LOGPROB_MISMATCH = "logprob_mismatch"
STALENESS = "staleness"
SCORE = "score"
ROLLOUT_KEY = REWARD
"""The field rollout samples are ranked by (their top and bottom ``k``)."""
VALIDATION_KEY = SCORE


def _masked_means(values: Tensor, mask: Tensor) -> list[float | None]:
    """Per row, the mean of ``values`` over the tokens of ``mask``; None for a row of none."""
    mask = mask.to(torch.float64)
    counts = mask.sum(-1)
    means = (values.to(torch.float64) * mask).sum(-1) / counts.clamp(min=1)
    return [m if n > 0 else None for m, n in zip(means.tolist(), counts.tolist(), strict=True)]


def rollout_rows(
    prompts: Sequence[str], gen: Generation, batch: RolloutBatch, step: int
) -> list[Row]:
    """One row per sample of a trained batch (see the module text for when to call it).

    ``advantage``: the mean advantage over the response's tokens (GRPO gives every token the
    same one; GAE's vary). ``logprob_mismatch``: the mean absolute difference between the
    engine's log-prob of each response token and the trainer's old log-prob of it (None when
    the engine gave none); the absolute value, because a sample's tokens that the engine
    scores too high and too low would cancel in a plain mean. ``staleness``: ``step`` minus
    the version of the weights that generated the batch (None when the engine did not say).
    A sample with an empty response has no mean: its ``advantage`` and ``logprob_mismatch``
    are None. ``ValueError`` when the batch lacks the advantage stage's fields or the
    prompts, texts and rows do not line up (a call in the wrong place).
    """
    if batch.scores is None or batch.advantages is None or batch.old_log_probs is None:
        raise ValueError(
            "rollout_rows needs the batch after the advantage stage (scores, advantages and "
            "old_log_probs set)"
        )
    if not len(prompts) == len(gen.responses) == batch.size:
        raise ValueError(
            f"{len(prompts)} prompts, {len(gen.responses)} responses and {batch.size} batch "
            "rows: they must be the same samples, in the same order"
        )
    mask = batch.response_mask
    advantages = _masked_means(batch.advantages, mask)
    if batch.rollout_log_probs is None:
        mismatch: list[float | None] = [None] * batch.size
    else:
        diff = (batch.rollout_log_probs.double() - batch.old_log_probs.double()).abs()
        mismatch = _masked_means(diff, mask)
    lengths = [int(n) for n in mask.sum(-1).tolist()]
    staleness = step - gen.policy_version if gen.policy_version >= 0 else None
    return [
        {
            PROMPT: prompt,
            RESPONSE: response,
            REWARD: float(reward),
            ADVANTAGE: advantage,
            RESPONSE_LENGTH: length,
            LOGPROB_MISMATCH: diff_mean,
            STALENESS: staleness,
        }
        for prompt, response, reward, advantage, length, diff_mean in zip(
            prompts,
            gen.responses,
            batch.scores.tolist(),
            advantages,
            lengths,
            mismatch,
            strict=True,
        )
    ]


def validation_rows(prompts: Sequence[str], gen: Generation, scores: Sequence[float]) -> list[Row]:
    """One row per held-out prompt: the prompt, the greedy response and its score (as
    ``Driver.validate`` computes them). ``ValueError`` when they do not line up."""
    if not len(prompts) == len(gen.responses) == len(scores):
        raise ValueError(
            f"{len(prompts)} prompts, {len(gen.responses)} responses and {len(scores)} scores: "
            "they must be the same samples, in the same order"
        )
    return [
        {PROMPT: prompt, RESPONSE: response, SCORE: float(score)}
        for prompt, response, score in zip(prompts, gen.responses, scores, strict=True)
    ]
