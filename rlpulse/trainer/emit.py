"""Stats objects -> ``{catalog name: producer value}``: the one place the trainer names metrics.

Loss statistics (:class:`rlpulse.trainer.ppo.Aggregate`) travel as :class:`~rlpulse.producer.Weighted`: a
rank's own value with its share of the mini-batch's denominator, which pools to the global
value per optimizer step and to the mean over optimizer steps. Per-token samples travel as
:class:`~rlpulse.producer.Masked` (mean, max and min pool exactly), counts of items as
:class:`~rlpulse.producer.Fraction`. Names come from :mod:`rlpulse.schemas.metrics`, never from string
literals.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from rlpulse.producer import Fraction, Masked, Samples, Weighted
from rlpulse.schemas import Stat, metrics as m
from rlpulse.trainer import ppo, samples
from rlpulse.trainer.advantage import AdvantageResult
from rlpulse.trainer.batch import RolloutBatch

Metrics = dict[str, Any]


def policy_step(stats: ppo.PolicyStats, sft: ppo.SFTStats) -> Metrics:
    """One optimizer step of the actor on one rank."""
    ratio = m.ACTOR_RATIO.output_names()
    return {
        m.ACTOR_PG_LOSS.name: _weighted(stats.pg_loss),
        m.ACTOR_WEIGHTED_PG_LOSS.name: _weighted(stats.weighted_pg_loss),
        m.ACTOR_KL_LOSS.name: _weighted(stats.kl_loss),
        m.ACTOR_TOTAL_LOSS.name: _weighted(stats.total_loss),
        m.ACTOR_APPROXKL.name: _weighted(stats.approxkl),
        m.ACTOR_POLICYKL.name: _weighted(stats.policykl),
        # The ratio's mean is per sequence (ROLL) while its extremes are over tokens: each
        # output is logged on its own and merges by its own statistic.
        ratio[Stat.MEAN]: _weighted(stats.ratio_mean),
        ratio[Stat.MAX]: Masked(stats.ratio, stats.mask),
        ratio[Stat.MIN]: Masked(stats.ratio, stats.mask),
        m.ACTOR_PPO_RATIO_HIGH_CLIPFRAC.name: _weighted(stats.ppo_ratio_high_clipfrac),
        m.ACTOR_PPO_RATIO_LOW_CLIPFRAC.name: _weighted(stats.ppo_ratio_low_clipfrac),
        m.ACTOR_PPO_RATIO_CLIPFRAC.name: _weighted(stats.ppo_ratio_clipfrac),
        m.ACTOR_CLIPFRAC.name: _weighted(stats.clipfrac),
        m.ACTOR_PG_CLIPFRAC_LOWER.name: _weighted(stats.pg_clipfrac_lower),
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


def old_log_probs(
    log_probs: Tensor,
    entropy: Tensor,
    response_mask: Tensor,
    rollout_log_probs: Tensor | None = None,
) -> Metrics:
    """actor_train's compute_log_probs on its shard: the old policy's log-probs and entropy,
    and, when the rollout engine gave its own log-probs of the same tokens, how far they are
    from the trainer's (zeros included: they are what the computation gives)."""
    mask = response_mask.bool()
    out: Metrics = {
        m.CRITIC_OLD_LOG_PROB.name: Masked(log_probs, mask),
        m.CRITIC_ENTROPY.name: Masked(entropy, mask),
    }
    if rollout_log_probs is not None:
        diff, ratio = ppo.rollout_mismatch(rollout_log_probs, log_probs)
        out[m.ROLLOUT_LOGPROB_DIFF.name] = Masked(diff, mask)
        out[m.ROLLOUT_PROB_RATIO.name] = Masked(ratio, mask)
    return out


def staleness(steps_behind: int, response_mask: Tensor) -> Metrics:
    """The driver, once per step: how many steps old the policy that generated the trained
    batch is, once per response token (token-weighted, as the loss weighs the tokens)."""
    mask = response_mask.bool()
    return {
        m.ASYNC_STALENESS.name: Masked(torch.full(mask.shape, float(steps_behind)), mask),
    }


def ref_log_probs(log_probs: Tensor, response_mask: Tensor) -> Metrics:
    return {m.CRITIC_REF_LOG_PROB.name: Masked(log_probs, response_mask.bool())}


def values(v: Tensor, response_mask: Tensor) -> Metrics:
    return {m.CRITIC_VALUES.name: Masked(v, response_mask.bool())}


def value_step(stats: ppo.ValueStats) -> Metrics:
    """One optimizer step of the critic."""
    return {
        m.CRITIC_LOSS.name: _weighted(stats.loss),
        m.CRITIC_ERROR.name: _weighted(stats.error),
        m.CRITIC_VPRED.name: _weighted(stats.vpred),
        m.CRITIC_VALUE.name: _weighted(stats.value),
        m.CRITIC_CLIPFRAC.name: _weighted(stats.clipfrac),
    }


def batch_data(adv: AdvantageResult, correct: Tensor, kl_coef: float) -> Metrics:
    """The driver's batch-level view of the data after the advantage stage."""
    batch = adv.batch
    assert batch.scores is not None
    assert batch.advantages is not None and batch.returns is not None
    mask = batch.response_mask.bool()
    answered = batch.response_lengths > 0
    clipped = adv.reward_clipped
    return {
        m.CRITIC_SCORE.name: batch.scores,
        # Empty responses have no token to carry a reward: they enter no advantage.
        m.CRITIC_REWARDS.name: Masked(adv.sequence_rewards, answered),
        m.CRITIC_REWARD_CLIP_FRAC.name: Fraction(int(clipped.sum()), clipped.numel()),
        m.CRITIC_ADVANTAGES.name: Masked(batch.advantages, mask),
        m.CRITIC_RETURNS.name: Masked(batch.returns, mask),
        m.RESPONSE_LENGTH.name: batch.response_lengths,
        m.PROMPT_LENGTH.name: batch.prompt_lengths,
        m.CRITIC_ACCURACY.name: Fraction(int(correct.sum()), correct.numel()),
        m.ACTOR_REF_KL.name: Weighted(adv.ref_kl, int(answered.sum())),
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


def _weighted(a: ppo.Aggregate) -> Weighted:
    """A rank's term of a global aggregate as the producer value that pools it exactly: its
    own value weighted by its share (see :mod:`rlpulse.trainer.ppo`)."""
    return Weighted(a.value, a.share)


def rollout_samples(rows: Sequence[samples.Row]) -> Metrics:
    """The driver, once per step: the trained batch's generations (``samples.rollout_rows``),
    ranked by reward; the collector keeps the best, the worst and a random few."""
    return {m.ROLLOUT_SAMPLES.name: Samples(rows, key=samples.ROLLOUT_KEY)}


def validation_samples(rows: Sequence[samples.Row]) -> Metrics:
    """The driver, at each validation: the held-out generations (``samples.validation_rows``),
    ranked by score."""
    return {m.VAL_SAMPLES.name: Samples(rows, key=samples.VALIDATION_KEY)}
