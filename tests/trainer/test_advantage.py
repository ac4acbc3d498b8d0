"""The driver's advantage stage and its maths, on hand-made batches computed by hand."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from rlpulse.trainer import ppo
from rlpulse.trainer.advantage import (
    compute_advantages,
    gae,
    grpo_advantages,
    masked_whiten,
    normalize_rewards,
    sample_weights,
    token_level_rewards,
    uniform_groups,
    validity,
)
from rlpulse.trainer.batch import RolloutBatch
from rlpulse.trainer.config import PPOConfig

T = torch.tensor


def test_gae_hand_computed() -> None:
    # gamma=0.9, lam=0.8; deltas: d2 = 1 - 0.7 = 0.3, d1 = 0.9*0.7 - 0.6 = 0.03,
    # d0 = 0.9*0.6 - 0.5 = 0.04; A2 = 0.3, A1 = 0.03 + 0.72*0.3, A0 = 0.04 + 0.72*A1.
    out = gae(T([[0.0, 0.0, 1.0]]), T([[0.5, 0.6, 0.7]]), T([[1.0, 1.0, 1.0]]), 0.9, 0.8)
    assert out.advantages[0].tolist() == pytest.approx([0.21712, 0.246, 0.3], abs=1e-6)
    assert out.returns[0].tolist() == pytest.approx([0.71712, 0.846, 1.0], abs=1e-6)


def test_gae_stops_at_the_end_of_a_padded_response() -> None:
    # The padded column's value (9.0) must not leak into the last real token.
    out = gae(T([[0.0, 2.0, 0.0]]), T([[0.5, 1.0, 9.0]]), T([[1.0, 1.0, 0.0]]), 0.9, 0.8)
    assert out.advantages[0].tolist() == pytest.approx([1.12, 1.0, 0.0], abs=1e-6)
    assert out.returns[0, 2].item() == 0.0


def test_token_level_rewards_puts_the_score_on_the_last_token_and_subtracts_kl() -> None:
    mask = T([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    kl = T([[0.1, 0.2, 5.0], [0.0, 0.0, 0.3]])
    out = token_level_rewards(T([1.0, -1.0]), mask, kl, kl_coef=0.5)
    assert out.flatten().tolist() == pytest.approx([-0.05, 0.9, 0.0, 0.0, 0.0, -1.15])


def test_reward_normalisation_uses_the_unbiased_std_then_clips() -> None:
    # mean 0.25; unbiased variance (3 * 0.0625 + 0.5625) / 3 = 0.25, std 0.5 (the population
    # std would be sqrt(0.1875) = 0.433).
    out = normalize_rewards(T([0.0, 0.0, 0.0, 1.0]), "batch", clip=1.4)
    assert out.rewards.tolist() == pytest.approx([-0.5, -0.5, -0.5, 1.4], rel=1e-5)
    assert out.clipped.tolist() == [False, False, False, True]
    assert not normalize_rewards(T([3.0, -3.0]), "none", clip=None).clipped.any()
    assert normalize_rewards(T([0.7]), "batch", clip=None).rewards.tolist() == [0.0]


def test_grpo_advantages_use_the_unbiased_group_std() -> None:
    mask = T([[1.0, 0.0], [1.0, 1.0], [1.0, 1.0], [1.0, 0.0]])
    scores = T([1.0, 0.0, 0.5, 0.5])
    out = grpo_advantages(scores, 2, mask)
    a = 0.5 / math.sqrt(0.5)  # (1 - 0.5) / std([1, 0]) = 0.5 / 0.7071
    expected = [a, 0.0, -a, -a, 0.0, 0.0, 0.0, 0.0]
    assert out.advantages.flatten().tolist() == pytest.approx(expected, abs=1e-5)
    assert uniform_groups(scores, 2).tolist() == [False, False, True, True]
    # A group of 4 with one success: mean 0.25, unbiased std 0.5 (population: 0.433).
    four = grpo_advantages(T([1.0, 0.0, 0.0, 0.0]), 4, torch.ones(4, 1))
    assert four.advantages.flatten().tolist() == pytest.approx([1.5, -0.5, -0.5, -0.5], rel=1e-5)


def test_whitening_uses_the_unbiased_variance() -> None:
    x = T([[1.0, 2.0, 3.0, 50.0]])
    mask = T([[1.0, 1.0, 1.0, 0.0]])
    # mean 2, unbiased variance (1 + 0 + 1) / 2 = 1 (population: 2/3, giving +-1.22)
    assert masked_whiten(x, mask)[0].tolist() == pytest.approx([-1.0, 0.0, 1.0, 0.0], abs=1e-6)
    # One token: no variance to scale by, as ROLL skips whitening then.
    assert masked_whiten(x, T([[0.0, 1.0, 0.0, 0.0]])).tolist() == [[0.0, 2.0, 0.0, 0.0]]


def _batch() -> RolloutBatch:
    mask = T([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0], [1.0, 0.0, 0.0], [1.0, 1.0, 0.0]])
    return RolloutBatch(
        input_ids=torch.zeros(4, 5, dtype=torch.long),
        attention_mask=torch.ones(4, 5),
        response_mask=mask,
        prompt_width=2,
        scores=T([1.0, 0.0, 0.5, 0.5]),
        valid=T([True, True, True, False]),
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
    rewards = normalize_rewards(_batch().scores, "batch", None).rewards
    lengths = _batch().response_mask.sum(-1)
    penalised = rewards - 0.1 * 0.5 * lengths
    assert out.batch.returns[:, 0].tolist() == pytest.approx(penalised.tolist(), abs=1e-6)
    # critic/rewards: the reward that enters the advantage, after the KL penalty.
    assert out.sequence_rewards.tolist() == pytest.approx(penalised.tolist(), abs=1e-6)
    no_kl = compute_advantages(_batch(), dataclasses.replace(cfg, kl_placement="loss"), 0.1, 1)
    assert no_kl.batch.returns[:, 0].tolist() == pytest.approx(rewards.tolist(), abs=1e-6)
    assert no_kl.sequence_rewards.tolist() == pytest.approx(rewards.tolist(), abs=1e-6)


def test_ref_kl_is_the_mean_of_per_sequence_means() -> None:
    # Sequence KLs: (0.1, 0.3) -> 0.2; (1.0) -> 1.0; an empty response counts for nothing.
    old = T([[0.1, 0.3, 0.0], [1.0, 0.0, 0.0], [9.0, 9.0, 9.0]])
    batch = RolloutBatch(
        input_ids=torch.zeros(3, 5, dtype=torch.long),
        attention_mask=torch.ones(3, 5),
        response_mask=T([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, 0.0]]),
        prompt_width=2,
        scores=T([1.0, 0.0, 0.0]),
        old_log_probs=old,
        ref_log_probs=torch.zeros(3, 3),
        values=torch.zeros(3, 3),
    )
    out = compute_advantages(batch, PPOConfig(), kl_coef=0.1, group_size=1)
    assert out.ref_kl == pytest.approx((0.2 + 1.0) / 2)  # the token mean would be 0.467


def test_grpo_advantages_use_groups_and_no_values() -> None:
    cfg = PPOConfig(algorithm="grpo", kl_placement="loss", reward_clip=None)
    out = compute_advantages(_batch().replace(values=None), cfg, kl_coef=0.1, group_size=2)
    a = 1 / math.sqrt(2)  # the normalised rewards of group 0 are +-x; (x - 0) / (x * sqrt 2)
    assert out.batch.advantages[:, 0].tolist() == pytest.approx([a, -a, 0.0, 0.0], abs=1e-4)


def test_validity_and_sample_weights() -> None:
    cfg = PPOConfig(algorithm="grpo", kl_placement="loss", drop_uniform_groups=True)
    valid = validity(
        T([False, True, False, False]),
        T([2, 3, 0, 2]),
        T([1.0, 0.0, 0.5, 0.5]),
        cfg,
        group_size=2,
    )
    # truncated, empty, and a group whose scores are all equal
    assert valid.tolist() == [True, False, False, False]
    assert sample_weights([1.0, 3.0], "difficulty").tolist() == [0.5, 1.5]
    assert sample_weights([1.0, 3.0], "uniform").tolist() == [1.0, 1.0]
