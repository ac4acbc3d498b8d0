"""Stats objects -> ``{catalog name: producer value}``: the one place the trainer names metrics.

Token-level means travel as :class:`~producer.Weighted` (a rank's mean with its token count),
per-token samples as :class:`~producer.Masked` (mean, max and min pool exactly), clip
fractions as masked booleans or :class:`~producer.Fraction`. Names come from
:mod:`schemas.metrics`, never from string literals.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from producer import Fraction, Masked, Weighted
from schemas import metrics as m
from trainer import ppo
from trainer.batch import RolloutBatch

Metrics = dict[str, Any]


def policy_step(stats: ppo.PolicyStats, sft: ppo.SFTStats) -> Metrics:
    """One optimizer step of the actor on one rank."""
    n = stats.n_tokens
    mask = stats.mask
    return {
        m.ACTOR_PG_LOSS.name: Weighted(stats.pg_loss, n),
        m.ACTOR_WEIGHTED_PG_LOSS.name: Weighted(stats.weighted_pg_loss, n),
        m.ACTOR_KL_LOSS.name: Weighted(stats.kl_loss, n),
        m.ACTOR_TOTAL_LOSS.name: Weighted(stats.total_loss, n),
        m.ACTOR_APPROXKL.name: Weighted(stats.approxkl, n),
        m.ACTOR_POLICYKL.name: Weighted(stats.policykl, n),
        m.ACTOR_RATIO.name: Masked(stats.ratio, mask),
        m.ACTOR_PPO_RATIO_HIGH_CLIPFRAC.name: Masked(stats.high_clipped, mask),
        m.ACTOR_PPO_RATIO_LOW_CLIPFRAC.name: Masked(stats.low_clipped, mask),
        m.ACTOR_PPO_RATIO_CLIPFRAC.name: Masked(stats.ratio_clipped, mask),
        m.ACTOR_CLIPFRAC.name: Masked(stats.surrogate_clipped, mask),
        m.ACTOR_SFT_LOSS.name: Weighted(_mean(sft.nll_sum, sft.n_tokens), sft.n_tokens),
        m.ACTOR_POSITIVE_SFT_LOSS.name: Weighted(
            _mean(sft.positive_sum, sft.positive_tokens), sft.positive_tokens
        ),
        m.ACTOR_NEGATIVE_SFT_LOSS.name: Weighted(
            _mean(sft.negative_sum, sft.negative_tokens), sft.negative_tokens
        ),
    }


def policy_shard(shard: RolloutBatch, lr: float) -> Metrics:
    """Once per step per actor_train rank: sample accounting for its own shard."""
    assert shard.valid is not None and shard.sample_weights is not None
    valid = int(shard.valid.sum())
    return {
        m.ACTOR_LR.name: lr,
        m.ACTOR_VALID_SAMPLES.name: valid,
        m.ACTOR_TOTAL_SAMPLES.name: shard.size,
        m.ACTOR_VALID_SAMPLE_RATIO.name: Fraction(valid, shard.size),
        m.ACTOR_SAMPLE_WEIGHTS.name: shard.sample_weights,
        # The throughput inputs: this rank's tokens (attention-mask sum) and samples.
        m.SYSTEM_STEP_TOKENS.name: int(shard.attention_mask.sum()),
        m.SYSTEM_STEP_SAMPLES.name: shard.size,
    }


def old_log_probs(log_probs: Tensor, entropy: Tensor, response_mask: Tensor) -> Metrics:
    mask = response_mask.bool()
    return {
        m.CRITIC_OLD_LOG_PROB.name: Masked(log_probs, mask),
        m.CRITIC_ENTROPY.name: Masked(entropy, mask),
    }


def ref_log_probs(log_probs: Tensor, response_mask: Tensor) -> Metrics:
    return {m.CRITIC_REF_LOG_PROB.name: Masked(log_probs, response_mask.bool())}


def values(v: Tensor, response_mask: Tensor) -> Metrics:
    return {m.CRITIC_VALUES.name: Masked(v, response_mask.bool())}


def value_step(stats: ppo.ValueStats) -> Metrics:
    n = stats.n_tokens
    return {
        m.CRITIC_LOSS.name: Weighted(stats.loss, n),
        m.CRITIC_ERROR.name: Weighted(stats.error, n),
        m.CRITIC_VPRED.name: Weighted(stats.vpred, n),
        m.CRITIC_VALUE.name: Weighted(stats.value, n),
        m.CRITIC_CLIPFRAC.name: Masked(stats.clipped, stats.mask),
    }


def batch_data(
    batch: RolloutBatch, reward_clipped: Tensor, correct: Tensor, ref_kl: float, kl_coef: float
) -> Metrics:
    """The driver's batch-level view of the data after the advantage stage."""
    assert batch.scores is not None and batch.rewards is not None
    assert batch.advantages is not None and batch.returns is not None
    mask = batch.response_mask.bool()
    n_tokens = int(mask.sum())
    return {
        m.CRITIC_SCORE.name: batch.scores,
        m.CRITIC_REWARDS.name: batch.rewards,
        m.CRITIC_REWARD_CLIP_FRAC.name: Fraction(int(reward_clipped.sum()), reward_clipped.numel()),
        m.CRITIC_ADVANTAGES.name: Masked(batch.advantages, mask),
        m.CRITIC_RETURNS.name: Masked(batch.returns, mask),
        m.RESPONSE_LENGTH.name: batch.response_lengths,
        m.PROMPT_LENGTH.name: batch.prompt_lengths,
        m.CRITIC_ACCURACY.name: Fraction(int(correct.sum()), correct.numel()),
        m.ACTOR_REF_KL.name: Weighted(ref_kl, n_tokens),
        m.ACTOR_KL_COEF.name: kl_coef,
    }


def validation(
    scores: Sequence[float],
    correct: Sequence[bool],
    distinct: dict[int, tuple[int, int]],
    repetition: tuple[int, int],
) -> Metrics:
    names = {1: m.VAL_DISTINCT_1.name, 2: m.VAL_DISTINCT_2.name}
    out: Metrics = {
        m.VAL_SCORE.name: torch.tensor(list(scores), dtype=torch.float64),
        m.VAL_ACCURACY.name: Fraction(sum(bool(c) for c in correct), len(correct)),
        m.VAL_REPETITION_RATE.name: Fraction(*repetition),
    }
    for n, (unique, total) in distinct.items():
        out[names[n]] = Fraction(unique, total)
    return out


def stage_times(times: dict[str, float]) -> Metrics:
    """The driver's step timings, keyed by catalog entry name."""
    known = {
        m.TIME_ROLLOUT.name,
        m.TIME_REF_LOG_PROBS_VALUES_REWARD.name,
        m.TIME_OLD_LOG_PROBS_VALUES.name,
        m.TIME_ADV.name,
    }
    unknown = set(times) - known
    if unknown:
        raise KeyError(f"not a driver stage timing: {sorted(unknown)}")
    return dict(times)


def _mean(total: float, count: int) -> float:
    return total / count if count else 0.0
