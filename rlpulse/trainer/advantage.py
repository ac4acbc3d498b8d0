"""The driver's advantage stage (``time/adv``): rewards, KL shaping, advantages, validity.

Runs on the whole batch in one place, so batch statistics (reward normalisation, advantage
whitening, GRPO groups) are global, not per rank. The maths are pure functions; standard
deviations are the unbiased (Bessel-corrected) ones, as verl (``torch.std`` in
``compute_grpo_outcome_advantage``) and ROLL (``reward_norm``, ``masked_whiten``) use.

GRPO standardises each group's *raw* scores, as both peers do (verl's
``compute_grpo_outcome_advantage``; ROLL's ``group_reward_norm``, which replaces its batch
normalisation for GRPO); ``ppo.reward_norm`` and ``ppo.reward_clip`` apply to PPO only.

>>> import torch
>>> m = torch.tensor([[1.0, 1.0, 0.0]])
>>> gae(torch.tensor([[0.0, 1.0, 0.0]]), torch.zeros(1, 3), m, gamma=1.0, lam=1.0).advantages
tensor([[1., 1., 0.]])
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from rlpulse.trainer import ppo
from rlpulse.trainer.batch import RolloutBatch
from rlpulse.trainer.config import PPOConfig

# ---------------------------------------------------------------------------------------------
# Rewards


@dataclass(frozen=True)
class RewardResult:
    """Per-sample rewards after normalisation and clipping, and which ones were clipped."""

    rewards: Tensor
    clipped: Tensor


def normalize_rewards(
    scores: Tensor, mode: str, clip: float | None, eps: float = 1e-6
) -> RewardResult:
    """``mode='batch'`` standardises the scores over the batch, ``(s - mean) / (std + eps)``
    with the unbiased std (ROLL's ``reward_norm``); then values outside ``[-clip, clip]`` are
    clipped. All-equal scores, or a single one, standardise to zeros."""
    rewards = scores.float()
    if mode == "batch":
        std = rewards.std() if rewards.numel() > 1 else rewards.new_zeros(())
        rewards = (rewards - rewards.mean()) / (std + eps)
    elif mode != "none":
        raise ValueError(f"unknown reward normalisation {mode!r}")
    if clip is None:
        return RewardResult(rewards, torch.zeros_like(rewards, dtype=torch.bool))
    clipped = rewards.abs() > clip
    return RewardResult(rewards.clamp(-clip, clip), clipped)


def token_level_rewards(
    rewards: Tensor, mask: Tensor, kl: Tensor | None = None, kl_coef: float = 0.0
) -> Tensor:
    """The sequence reward on each response's last token, minus ``kl_coef * kl`` on every
    token (the KL penalty in the reward, as in RLHF PPO)."""
    last = (mask.sum(-1).long() - 1).clamp(min=0)
    out = torch.zeros_like(mask, dtype=torch.float32)
    rows = torch.arange(mask.shape[0])
    out[rows, last] = rewards.float() * (mask.sum(-1) > 0)
    if kl is not None and kl_coef:
        out = out - kl_coef * kl * mask
    return out


# ---------------------------------------------------------------------------------------------
# Advantages


@dataclass(frozen=True)
class Advantages:
    advantages: Tensor
    returns: Tensor


def gae(rewards: Tensor, values: Tensor, mask: Tensor, gamma: float, lam: float) -> Advantages:
    """Generalised advantage estimation over right-padded responses.

    ``delta_t = r_t + gamma * V_{t+1} - V_t`` with ``V`` taken as 0 after a response's last
    token; ``A_t = delta_t + gamma * lam * A_{t+1}``; returns are ``A + V``.
    """
    batch, width = rewards.shape
    advantages = torch.zeros_like(rewards)
    running = torch.zeros(batch, dtype=rewards.dtype)
    for t in reversed(range(width)):
        if t + 1 < width:
            keep = mask[:, t + 1]
            next_value = values[:, t + 1] * keep
        else:
            keep = torch.zeros(batch, dtype=rewards.dtype)
            next_value = keep
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        running = delta + gamma * lam * running * keep
        advantages[:, t] = running
    advantages = advantages * mask
    return Advantages(advantages, (advantages + values) * mask)


def masked_whiten(x: Tensor, mask: Tensor, eps: float = 1e-8) -> Tensor:
    """Shift and scale the masked elements to mean 0 and unbiased variance 1 (ROLL's
    ``masked_whiten`` with ``masked_var(unbiased=True)``). With fewer than two masked elements
    the variance is undefined and ``x`` comes back unscaled, as ROLL then skips whitening."""
    n = mask.sum()
    if n < 2:
        return x * mask
    mean = ppo.masked_sum(x, mask) / n
    var = ppo.masked_sum((x - mean) ** 2, mask) / (n - 1)
    return (x - mean) * torch.rsqrt(var + eps) * mask


def group_standardize(scores: Tensor, group_size: int, eps: float = 1e-6) -> Tensor:
    """Each score standardised within its group of ``group_size`` consecutive samples (same
    prompt): ``(s - mean) / (std + eps)`` with the unbiased std. A group of one has no spread
    to measure: it takes mean 0 and std 1, so its score passes through (verl's convention).

    >>> [round(a, 4) for a in group_standardize(torch.tensor([1.0, 0.0, 3.0, 3.0]), 2).tolist()]
    [0.7071, -0.7071, 0.0, 0.0]
    """
    # In float64: the float32 mean of equal scores can miss them by an ulp, which the
    # division by (std + eps) would blow up to a spurious advantage of ~1e-3.
    groups = scores.double().view(-1, group_size)
    if group_size == 1:
        return (groups / (1.0 + eps)).view(-1).float()
    mean = groups.mean(-1, keepdim=True)
    std = groups.std(-1, keepdim=True)
    return ((groups - mean) / (std + eps)).view(-1).float()


def grpo_advantages(scores: Tensor, group_size: int, mask: Tensor, eps: float = 1e-6) -> Advantages:
    """Group-normalised advantages: each response's raw score standardised within its group
    (:func:`group_standardize`; verl's ``compute_grpo_outcome_advantage``, ROLL's
    ``group_reward_norm``), broadcast to its tokens. The returns are the advantages (there is
    no critic)."""
    advantages = group_standardize(scores, group_size, eps).unsqueeze(-1) * mask
    return Advantages(advantages, advantages.clone())


def uniform_groups(scores: Tensor, group_size: int) -> Tensor:
    """Per sample: True when every response in its group has the same score (no signal)."""
    groups = scores.float().view(-1, group_size)
    same = (groups.max(-1).values - groups.min(-1).values) == 0
    return same.repeat_interleave(group_size)


# ---------------------------------------------------------------------------------------------
# The stage


@dataclass(frozen=True)
class AdvantageResult:
    batch: RolloutBatch
    reward_clipped: Tensor
    sequence_rewards: Tensor
    """Per sample, the sum of its token-level rewards: the reward that enters the advantage,
    after normalisation, clipping and (with ``kl_placement: reward``) the KL penalty; with
    GRPO the raw score, which the group standardisation turns into the advantage (verl)."""
    ref_kl: float
    """KL (k1) of the old policy to the reference, averaged per response, then over responses
    with at least one token: the KL controller's input."""


def validity(
    truncated: Tensor, response_lengths: Tensor, scores: Tensor, cfg: PPOConfig, group_size: int
) -> Tensor:
    """Per sample: may it contribute to the loss? Empty responses never; truncated ones not
    with ``drop_truncated``; GRPO groups without score spread not with
    ``drop_uniform_groups``."""
    valid = response_lengths > 0
    if cfg.drop_truncated:
        valid &= ~truncated
    if cfg.algorithm == "grpo" and cfg.drop_uniform_groups:
        valid &= ~uniform_groups(scores, group_size)
    return valid


def sample_weights(difficulty: Sequence[float], mode: str) -> Tensor:
    """``uniform``: all 1. ``difficulty``: proportional to the task's difficulty, mean 1."""
    d = torch.tensor(list(difficulty), dtype=torch.float32)
    if mode == "uniform":
        return torch.ones_like(d)
    return d / d.mean()


def compute_advantages(
    batch: RolloutBatch, cfg: PPOConfig, kl_coef: float, group_size: int
) -> AdvantageResult:
    assert batch.scores is not None and batch.old_log_probs is not None
    assert batch.ref_log_probs is not None
    mask = batch.response_mask
    kl = ppo.kl_k1(batch.old_log_probs, batch.ref_log_probs)
    # Both peers feed the controller the mean of per-sequence means (verl apply_kl_penalty,
    # ROLL apply_kl_penalty / compute_token_reward).
    ref_kl = float(ppo.agg(kl, mask, ppo.SEQ_MEAN, ppo.AggScale.of(mask)))
    shaped_kl = kl if cfg.kl_placement == "reward" else None
    if cfg.algorithm == "grpo":
        # The raw scores enter the group standardisation, as in verl and ROLL: normalising
        # over the batch first is an affine map the group statistics undo, and clipping in
        # batch units would distort a group's spread (one success among many failures). GRPO
        # puts the KL in the loss (a config check), so the token rewards are the scores.
        normalized = group_standardize(batch.scores, group_size)
        token_rewards = token_level_rewards(batch.scores, mask, shaped_kl, kl_coef)
        adv = grpo_advantages(batch.scores, group_size, mask)
        rewards = RewardResult(normalized, torch.zeros_like(normalized, dtype=torch.bool))
    else:
        assert batch.values is not None
        rewards = normalize_rewards(batch.scores, cfg.reward_norm, cfg.reward_clip)
        token_rewards = token_level_rewards(rewards.rewards, mask, shaped_kl, kl_coef)
        adv = gae(token_rewards, batch.values, mask, cfg.gamma, cfg.lam)
        if cfg.whiten_advantages:
            # Whiten over the tokens that will be trained on, so their advantages are centred.
            adv = Advantages(masked_whiten(adv.advantages, batch.loss_mask), adv.returns)
    # ``rewards`` are the normalised ones: positive means better than the batch average (PPO)
    # or than the group's (GRPO); the driver picks the SFT loss's positive samples by them.
    out = batch.replace(rewards=rewards.rewards, advantages=adv.advantages, returns=adv.returns)
    return AdvantageResult(out, rewards.clipped, token_rewards.sum(-1), ref_kl)
