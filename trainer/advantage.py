"""The driver's advantage stage (``time/adv``): rewards, KL shaping, advantages, validity.

Runs on the whole batch in one place, so batch statistics (reward normalisation, advantage
whitening, GRPO groups) are global, not per rank.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from trainer import ppo
from trainer.batch import RolloutBatch
from trainer.config import PPOConfig


@dataclass(frozen=True)
class AdvantageResult:
    batch: RolloutBatch
    reward_clipped: Tensor
    ref_kl: float
    """Mean per-token KL (k1) of the old policy to the reference: the KL controller's input."""


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
        valid &= ~ppo.uniform_groups(scores, group_size)
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
    rewards = ppo.normalize_rewards(batch.scores, cfg.reward_norm, cfg.reward_clip)
    kl = ppo.kl_k1(batch.old_log_probs, batch.ref_log_probs)
    ref_kl = float(ppo.masked_mean(kl, mask))
    if cfg.algorithm == "grpo":
        adv = ppo.grpo_advantages(rewards.rewards, group_size, mask)
    else:
        assert batch.values is not None
        shaped_kl = kl if cfg.kl_placement == "reward" else None
        token_rewards = ppo.token_level_rewards(rewards.rewards, mask, shaped_kl, kl_coef)
        adv = ppo.gae(token_rewards, batch.values, mask, cfg.gamma, cfg.lam)
        if cfg.whiten_advantages:
            # Whiten over the tokens that will be trained on, so their advantages are centred.
            adv = ppo.Advantages(ppo.masked_whiten(adv.advantages, batch.loss_mask), adv.returns)
    out = batch.replace(rewards=rewards.rewards, advantages=adv.advantages, returns=adv.returns)
    return AdvantageResult(out, rewards.clipped, ref_kl)
