"""The driver's advantage stage on a hand-made batch."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from trainer import ppo
from trainer.advantage import compute_advantages, sample_weights, validity
from trainer.batch import RolloutBatch
from trainer.config import PPOConfig


def _batch() -> RolloutBatch:
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0], [1.0, 0.0, 0.0], [1.0, 1.0, 0.0]])
    return RolloutBatch(
        input_ids=torch.zeros(4, 5, dtype=torch.long),
        attention_mask=torch.ones(4, 5),
        response_mask=mask,
        prompt_width=2,
        scores=torch.tensor([1.0, 0.0, 0.5, 0.5]),
        valid=torch.tensor([True, True, True, False]),
        old_log_probs=torch.full((4, 3), -1.0),
        ref_log_probs=torch.full((4, 3), -1.5),
        values=torch.zeros(4, 3),
    )


def test_ppo_advantages_are_whitened_over_trained_tokens_and_kl_shapes_returns() -> None:
    cfg = PPOConfig(reward_clip=None, gamma=1.0, lam=1.0)
    out = compute_advantages(_batch(), cfg, kl_coef=0.1, group_size=1)
    adv, loss_mask = out.batch.advantages, out.batch.loss_mask
    assert ppo.masked_mean(adv, loss_mask).item() == pytest.approx(0.0, abs=1e-6)
    assert out.ref_kl == pytest.approx(0.5)  # logp_old - logp_ref = -1 - (-1.5)
    # gamma = lam = 1, V = 0: the first token's return is the reward minus the KL of every token
    rewards = ppo.normalize_rewards(_batch().scores, "batch", None).rewards
    lengths = _batch().response_mask.sum(-1)
    assert out.batch.returns[:, 0].tolist() == pytest.approx(
        (rewards - 0.1 * 0.5 * lengths).tolist(), abs=1e-6
    )
    no_kl = compute_advantages(_batch(), dataclasses.replace(cfg, kl_placement="loss"), 0.1, 1)
    assert no_kl.batch.returns[:, 0].tolist() == pytest.approx(rewards.tolist(), abs=1e-6)


def test_grpo_advantages_use_groups_and_no_values() -> None:
    cfg = PPOConfig(algorithm="grpo", kl_placement="loss", reward_clip=None)
    out = compute_advantages(_batch().replace(values=None), cfg, kl_coef=0.1, group_size=2)
    assert out.batch.advantages[:, 0].tolist() == pytest.approx([1.0, -1.0, 0.0, 0.0], abs=1e-4)


def test_validity_and_sample_weights() -> None:
    cfg = PPOConfig(algorithm="grpo", kl_placement="loss", drop_uniform_groups=True)
    valid = validity(
        torch.tensor([False, True, False, False]),
        torch.tensor([2, 3, 0, 2]),
        torch.tensor([1.0, 0.0, 0.5, 0.5]),
        cfg,
        group_size=2,
    )
    # truncated, empty, and a group whose scores are all equal
    assert valid.tolist() == [True, False, False, False]
    assert sample_weights([1.0, 3.0], "difficulty").tolist() == [0.5, 1.5]
    assert sample_weights([1.0, 3.0], "uniform").tolist() == [1.0, 1.0]
