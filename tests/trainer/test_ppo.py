"""PPO maths against small cases computed by hand."""

from __future__ import annotations

import math

import pytest
import torch

from trainer import ppo

T = torch.tensor


def test_gae_hand_computed() -> None:
    # gamma=0.9, lam=0.8; deltas: d2 = 1 - 0.7 = 0.3, d1 = 0.9*0.7 - 0.6 = 0.03,
    # d0 = 0.9*0.6 - 0.5 = 0.04; A2 = 0.3, A1 = 0.03 + 0.72*0.3, A0 = 0.04 + 0.72*A1.
    out = ppo.gae(T([[0.0, 0.0, 1.0]]), T([[0.5, 0.6, 0.7]]), T([[1.0, 1.0, 1.0]]), 0.9, 0.8)
    assert out.advantages[0].tolist() == pytest.approx([0.21712, 0.246, 0.3], abs=1e-6)
    assert out.returns[0].tolist() == pytest.approx([0.71712, 0.846, 1.0], abs=1e-6)


def test_gae_stops_at_the_end_of_a_padded_response() -> None:
    # The padded column's value (9.0) must not leak into the last real token.
    out = ppo.gae(T([[0.0, 2.0, 0.0]]), T([[0.5, 1.0, 9.0]]), T([[1.0, 1.0, 0.0]]), 0.9, 0.8)
    assert out.advantages[0].tolist() == pytest.approx([1.12, 1.0, 0.0], abs=1e-6)
    assert out.returns[0, 2].item() == 0.0


def test_token_level_rewards_puts_the_score_on_the_last_token_and_subtracts_kl() -> None:
    mask = T([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    kl = T([[0.1, 0.2, 5.0], [0.0, 0.0, 0.3]])
    out = ppo.token_level_rewards(T([1.0, -1.0]), mask, kl, kl_coef=0.5)
    assert out.flatten().tolist() == pytest.approx([-0.05, 0.9, 0.0, 0.0, 0.0, -1.15])


def _policy(**kw):  # four tokens: ratios 1.5, 0.5, 1.0, 1.1; the last is masked out
    args = dict(
        log_probs=torch.log(T([[1.5, 0.5, 1.0, 1.1]])),
        old_log_probs=torch.zeros(1, 4),
        advantages=T([[1.0, 1.0, -1.0, -1.0]]),
        mask=T([[1.0, 1.0, 1.0, 0.0]]),
        clip_low=0.2,
        clip_high=0.28,
        normaliser=3.0,
    )
    args.update(kw)
    return ppo.policy_loss(**args)


def test_clip_fractions_and_ratio_statistics() -> None:
    s = _policy().stats
    m = s.mask
    frac = lambda flags: flags[m].float().mean().item()  # noqa: E731
    assert s.n_tokens == 3
    assert frac(s.high_clipped) == pytest.approx(1 / 3)  # 1.5 > 1.28
    assert frac(s.low_clipped) == pytest.approx(1 / 3)  # 0.5 < 0.8
    assert frac(s.ratio_clipped) == pytest.approx(2 / 3)
    # Only token 0 takes the clipped branch: for token 1 the unclipped 0.5 is the smaller.
    assert s.surrogate_clipped[m].tolist() == [True, False, False]
    assert s.ratio[m].tolist() == pytest.approx([1.5, 0.5, 1.0])
    # pg = -min(r*A, clip(r)*A): -1.28, -0.5, +1.0
    assert s.pg_loss == pytest.approx((-1.28 - 0.5 + 1.0) / 3)


def test_negative_advantage_clips_the_low_side() -> None:
    s = _policy(advantages=T([[-1.0, -1.0, -1.0, -1.0]])).stats
    # r=1.5, A=-1: -1.5 < -1.28, unclipped is smaller. r=0.5: clip gives -0.8 < -0.5: clipped.
    assert s.surrogate_clipped[s.mask].tolist() == [False, True, False]


def test_approx_kl_and_policy_kl() -> None:
    s = _policy().stats
    lr = [math.log(1.5), math.log(0.5), 0.0]
    assert s.approxkl == pytest.approx(sum(0.5 * x * x for x in lr) / 3, rel=1e-6)
    assert s.policykl == pytest.approx(-sum(lr) / 3, rel=1e-6)


def test_kl_k3_and_kl_loss_term() -> None:
    # p = 0.5, p_ref = 0.25: r = ln 0.5, exp(r) - r - 1 = 0.5 + ln 2 - 1
    k3 = ppo.kl_k3(torch.log(T([0.5])), torch.log(T([0.25])))
    assert k3.item() == pytest.approx(math.log(2) - 0.5, rel=1e-6)
    base = _policy()
    with_kl = _policy(ref_log_probs=torch.zeros(1, 4), kl_coef=2.0)
    assert with_kl.stats.kl_loss > 0
    expected = base.stats.total_loss + 2.0 * with_kl.stats.kl_loss
    assert with_kl.stats.total_loss == pytest.approx(expected, abs=1e-6)
    assert with_kl.stats.pg_loss == base.stats.pg_loss


def test_sample_weights_scale_the_weighted_loss_only() -> None:
    s = _policy(sample_weights=T([2.0])).stats
    assert s.weighted_pg_loss == pytest.approx(2 * s.pg_loss)
    assert s.total_loss == pytest.approx(s.weighted_pg_loss)


def test_normaliser_splits_the_gradient_exactly() -> None:
    # Two halves with the global token count as normaliser sum to the full batch's gradient.
    logp = torch.log(T([[1.2, 0.9], [1.0, 1.3]])).requires_grad_(True)
    kw = dict(
        old_log_probs=torch.zeros(2, 2),
        advantages=T([[1.0, -0.5], [0.3, 2.0]]),
        clip_low=0.2,
        clip_high=0.28,
    )
    full = ppo.policy_loss(logp, mask=torch.ones(2, 2), normaliser=4.0, **kw).loss
    (g_full,) = torch.autograd.grad(full, logp)
    halves = [
        ppo.policy_loss(logp, mask=T(m), normaliser=4.0, **kw).loss
        for m in ([[1.0, 1.0], [0.0, 0.0]], [[0.0, 0.0], [1.0, 1.0]])
    ]
    g_sum = sum(torch.autograd.grad(h, logp)[0] for h in halves)
    assert torch.allclose(g_full, g_sum)


def test_value_clipping() -> None:
    out = ppo.value_loss(
        T([[0.5, 0.1]]),
        torch.zeros(1, 2),
        T([[1.0, -1.0]]),
        torch.ones(1, 2),
        clip=0.2,
        normaliser=2.0,
    )
    s = out.stats
    # token 0: clipped v=0.2, (0.2-1)^2=0.64 > 0.25: clipped branch active. token 1: equal.
    assert s.clipped.tolist() == [[True, False]]
    assert s.loss == pytest.approx((0.32 + 0.605) / 2)
    assert s.error == pytest.approx((0.25 + 1.21) / 2)
    assert out.loss.item() == pytest.approx(s.loss)
    assert s.vpred == pytest.approx(0.3)


def test_value_clipping_off_clips_nothing() -> None:
    out = ppo.value_loss(
        T([[0.5, 0.1]]),
        torch.zeros(1, 2),
        T([[1.0, -1.0]]),
        torch.ones(1, 2),
        clip=None,
        normaliser=2.0,
    )
    assert not out.stats.clipped.any()
    assert out.stats.loss == pytest.approx(0.5 * (0.25 + 1.21) / 2)


def test_adaptive_kl_controller() -> None:
    ctl = ppo.AdaptiveKLController(coef=0.1, target_kl=0.05, horizon=10, coef_max=1.0)
    assert ctl.update(0.1, n_steps=5).coef == pytest.approx(0.11)  # error clipped to +0.2
    assert ctl.update(0.055, n_steps=5).coef == pytest.approx(0.105)  # error 0.1 x 5/10
    assert ctl.update(0.0, n_steps=5).coef == pytest.approx(0.09)  # error clipped to -0.2
    capped = ppo.AdaptiveKLController(coef=0.9, target_kl=0.05, horizon=10, coef_max=0.95)
    assert capped.update(1.0, n_steps=10).coef == pytest.approx(0.95)
    fixed = ppo.AdaptiveKLController(coef=0.1, target_kl=None, horizon=10, coef_max=1.0)
    assert fixed.update(5.0, n_steps=100).coef == 0.1


def test_reward_normalisation_and_clipping() -> None:
    out = ppo.normalize_rewards(T([0.0, 0.0, 0.0, 1.0]), "batch", clip=1.5)
    std = math.sqrt(0.1875)
    assert out.rewards.tolist() == pytest.approx([-0.25 / std] * 3 + [1.5], rel=1e-5)
    assert out.clipped.tolist() == [False, False, False, True]
    assert not ppo.normalize_rewards(T([3.0, -3.0]), "none", clip=None).clipped.any()


def test_grpo_advantages_and_uniform_groups() -> None:
    mask = T([[1.0, 0.0], [1.0, 1.0], [1.0, 1.0], [1.0, 0.0]])
    scores = T([1.0, 0.0, 0.5, 0.5])
    out = ppo.grpo_advantages(scores, 2, mask)
    expected = [1.0, 0.0, -1.0, -1.0, 0.0, 0.0, 0.0, 0.0]
    assert out.advantages.flatten().tolist() == pytest.approx(expected, abs=1e-5)
    assert ppo.uniform_groups(scores, 2).tolist() == [False, False, True, True]


def test_sft_stats_split_positive_and_negative() -> None:
    nll = T([[1.0, 2.0], [3.0, 4.0]])
    s = ppo.sft_stats(nll, T([[1.0, 1.0], [1.0, 0.0]]), positive=T([True, False]))
    assert (s.nll_sum, s.n_tokens) == (6.0, 3)
    assert (s.positive_sum, s.positive_tokens, s.negative_sum, s.negative_tokens) == (
        3.0,
        2,
        3.0,
        1,
    )
