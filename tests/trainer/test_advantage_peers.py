"""GRPO advantages against the peers' formula (issue 22, item 3).

verl (``compute_grpo_outcome_advantage``) and ROLL (``group_reward_norm``) standardise each
group's raw scores: per group the mean and the unbiased (Bessel-corrected) std, then
``(score - mean) / (std + 1e-6)``; verl gives a group of one mean 0 and std 1. The reference
below is written from that description with the standard library, independently of the
trainer's torch code.
"""

from __future__ import annotations

import random
import statistics

import pytest
import torch

from rlpulse.trainer.advantage import compute_advantages, grpo_advantages
from rlpulse.trainer.batch import RolloutBatch
from rlpulse.trainer.config import PPOConfig

EPS = 1e-6
GRPO = PPOConfig(algorithm="grpo", kl_placement="loss")
"""The defaults otherwise: ``reward_norm: batch``, ``reward_clip: 2.0``."""


def peer_advantages(scores: list[float], group_size: int) -> list[float]:
    """The peers' per-sample GRPO advantage, group by group."""
    out: list[float] = []
    for start in range(0, len(scores), group_size):
        group = scores[start : start + group_size]
        if len(group) == 1:
            mean, std = 0.0, 1.0
        else:
            mean, std = statistics.mean(group), statistics.stdev(group)
        out.extend((s - mean) / (std + EPS) for s in group)
    return out


def batch_of(scores: list[float], width: int = 3) -> RolloutBatch:
    """Responses of 1..width tokens (right-padded), so broadcasting to tokens is checked too."""
    n = len(scores)
    lengths = [1 + i % width for i in range(n)]
    mask = torch.tensor([[1.0] * k + [0.0] * (width - k) for k in lengths])
    return RolloutBatch(
        input_ids=torch.zeros(n, 2 + width, dtype=torch.long),
        attention_mask=torch.ones(n, 2 + width),
        response_mask=mask,
        prompt_width=2,
        scores=torch.tensor(scores),
        old_log_probs=torch.full((n, width), -1.0),
        ref_log_probs=torch.full((n, width), -1.2),
    )


def advantages_by_sample(batch: RolloutBatch, group_size: int, cfg: PPOConfig = GRPO) -> list:
    out = compute_advantages(batch, cfg, kl_coef=0.05, group_size=group_size).batch
    assert out.advantages is not None
    mask = batch.response_mask
    per_sample = out.advantages[:, 0]
    # every token of a response carries its sample's advantage; padding carries nothing
    assert torch.equal(out.advantages, per_sample.unsqueeze(-1) * mask)
    return per_sample.tolist()


def test_the_issue_example_matches_the_peers() -> None:
    # One group {1, 0.3, 0, 0} among groups of zeros. Batch normalisation and the 2.0 clip
    # before the group standardisation gave [1.198, 0.452, -0.825, -0.825].
    scores = [1.0, 0.3, 0.0, 0.0] + [0.0] * 20
    got = advantages_by_sample(batch_of(scores), group_size=4)
    assert got[:4] == pytest.approx([1.431, -0.053, -0.689, -0.689], abs=5e-4)
    assert got == pytest.approx(peer_advantages(scores, 4), abs=1e-5)
    assert got[4:] == [0.0] * 20  # no spread, no signal


def test_critic_rewards_are_the_raw_scores_that_enter_the_group_statistics() -> None:
    scores = [1.0, 0.3, 0.0, 0.0] + [0.0] * 20
    result = compute_advantages(batch_of(scores), GRPO, kl_coef=0.05, group_size=4)
    # verl's critic/rewards for GRPO (KL in the loss): token_level_rewards.sum(-1), the score
    assert result.sequence_rewards.tolist() == pytest.approx(scores)
    assert not result.reward_clipped.any()  # nothing is clipped on the way to the advantage
    # positive samples (the SFT loss) are those better than their group's average
    assert result.batch.rewards is not None
    assert (result.batch.rewards > 0).tolist() == [True] + [False] * 23


@pytest.mark.parametrize("group_size", [2, 4, 5, 8, 16])
@pytest.mark.parametrize("seed", range(5))
def test_random_batches_match_the_peers(group_size: int, seed: int) -> None:
    rng = random.Random(seed)
    groups = 64 // group_size
    scores: list[float] = []
    for _ in range(groups):
        kind = rng.choice(["binary", "partial", "wide", "outlier", "uniform"])
        if kind == "binary":
            group = [float(rng.random() < 0.2) for _ in range(group_size)]
        elif kind == "partial":
            group = [rng.choice([0.0, 0.1, 0.3, 0.5, 1.0]) for _ in range(group_size)]
        elif kind == "wide":
            group = [rng.uniform(-50.0, 50.0) for _ in range(group_size)]
        elif kind == "outlier":
            group = [0.0] * (group_size - 1) + [rng.uniform(20.0, 100.0)]
        else:
            group = [rng.uniform(-1.0, 1.0)] * group_size
        scores.extend(group)
    got = advantages_by_sample(batch_of(scores), group_size)
    assert got == pytest.approx(peer_advantages(scores, group_size), rel=1e-5, abs=1e-5)
    # reward_norm and reward_clip do not enter GRPO: none of them changes a number
    other = PPOConfig(algorithm="grpo", kl_placement="loss", reward_norm="none", reward_clip=0.5)
    assert advantages_by_sample(batch_of(scores), group_size, other) == pytest.approx(got)


def test_a_group_of_one_keeps_its_score_as_verl_does() -> None:
    # verl: a prompt with a single response gets mean 0 and std 1
    out = grpo_advantages(torch.tensor([0.7, -2.0, 0.0]), 1, torch.ones(3, 2))
    expected = peer_advantages([0.7, -2.0, 0.0], 1)
    assert out.advantages[:, 0].tolist() == pytest.approx(expected, rel=1e-6)
    assert out.advantages[:, 1].tolist() == pytest.approx(expected, rel=1e-6)
