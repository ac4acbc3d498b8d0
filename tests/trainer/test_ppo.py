"""PPO losses, KL and aggregation against small cases computed by hand."""

from __future__ import annotations

import math

import pytest
import torch

from rlpulse.trainer import ppo
from rlpulse.trainer.config import LOSS_AGG_MODES

T = torch.tensor


def _one_rank(mask: torch.Tensor) -> ppo.AggScale:
    return ppo.AggScale.of(mask)


# ---------------------------------------------------------------------------------------------
# Aggregation

# Two sequences of 3 and 1 loss tokens (a third row has none), in a width of 4.
X = T([[1.0, 2.0, 6.0, 9.0], [4.0, 9.0, 9.0, 9.0], [7.0, 7.0, 7.0, 7.0]])
M = T([[1.0, 1.0, 1.0, 0.0], [1.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
BY_HAND = {
    "token-mean": (1 + 2 + 6 + 4) / 4,  # 13 / 4 tokens
    "seq-mean-token-sum": (9 + 4) / 2,  # sequence sums 9 and 4, over 2 sequences
    "seq-mean-token-mean": (3 + 4) / 2,  # sequence means 3 and 4
    "seq-mean-token-sum-norm": 13 / 4,  # the sum over the width 4; no mean over sequences
}


def test_scale_counts_tokens_and_non_empty_sequences() -> None:
    assert ppo.AggScale.of(M) == ppo.AggScale(tokens=4.0, seqs=2.0, norm=4.0)
    assert ppo.AggScale.of(M, norm=6.0).norm == 6.0


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_every_mode_by_hand(mode: str) -> None:
    assert float(ppo.agg(X, M, mode, _one_rank(M))) == pytest.approx(BY_HAND[mode])
    stat = ppo.aggregate(X, M, mode, _one_rank(M))
    assert stat.share == 1.0 and stat.value == pytest.approx(BY_HAND[mode])


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_ranks_terms_add_up_and_shares_pool_to_the_global_value(mode: str) -> None:
    # Rank A holds row 0, rank B rows 1 and 2, both with the global scale.
    scale = _one_rank(M)
    a = ppo.aggregate(X[:1], M[:1], mode, scale)
    b = ppo.aggregate(X[1:], M[1:], mode, scale)
    assert a.part + b.part == pytest.approx(BY_HAND[mode])
    assert a.share + b.share == pytest.approx(1.0)
    # What the collector does with Weighted(value, share): sum(value * share) / sum(share).
    pooled = (a.value * a.share + b.value * b.share) / (a.share + b.share)
    assert pooled == pytest.approx(BY_HAND[mode])
    # The share is by sequence under the sequence-mean modes, by token otherwise.
    by_seq = mode in ("seq-mean-token-sum", "seq-mean-token-mean")
    assert a.share == (0.5 if by_seq else 0.75)


def test_a_rank_without_tokens_has_no_share() -> None:
    empty = ppo.aggregate(X[2:], M[2:], "token-mean", _one_rank(M))
    assert (empty.part, empty.share, empty.value) == (0.0, 0.0, 0.0)


def test_unknown_mode_fails() -> None:
    with pytest.raises(ValueError, match="unknown loss aggregation mode"):
        ppo.agg(X, M, "seq-sum", _one_rank(M))


# ---------------------------------------------------------------------------------------------
# Policy loss


def _policy(**kw):  # four tokens: ratios 1.5, 0.5, 1.0, 1.1; the last is masked out
    mask = kw.pop("mask", T([[1.0, 1.0, 1.0, 0.0]]))
    args = dict(
        log_probs=torch.log(T([[1.5, 0.5, 1.0, 1.1]])),
        old_log_probs=torch.zeros(1, 4),
        advantages=T([[1.0, 1.0, -1.0, -1.0]]),
        mask=mask,
        clip_low=0.2,
        clip_high=0.28,
        scale=_one_rank(mask),
    )
    args.update(kw)
    return ppo.policy_loss(**args)


def test_clip_fractions_and_ratio_statistics() -> None:
    s = _policy().stats
    assert s.n_tokens == 3
    assert s.ppo_ratio_high_clipfrac.value == pytest.approx(1 / 3)  # 1.5 > 1.28
    assert s.ppo_ratio_low_clipfrac.value == pytest.approx(1 / 3)  # 0.5 < 0.8
    assert s.ppo_ratio_clipfrac.value == pytest.approx(2 / 3)
    # Only token 0 takes the clipped branch: for token 1 the unclipped 0.5 is the smaller.
    assert s.clipfrac.value == pytest.approx(1 / 3)
    assert s.ratio[s.mask].tolist() == pytest.approx([1.5, 0.5, 1.0])
    assert s.ratio_mean.value == pytest.approx(1.0)  # one sequence: (1.5 + 0.5 + 1.0) / 3
    # pg = -min(r*A, clip(r)*A): -1.28, -0.5, +1.0
    assert s.pg_loss.value == pytest.approx((-1.28 - 0.5 + 1.0) / 3)
    assert s.pg_clipfrac_lower.value == 0.0


def test_negative_advantage_clips_the_low_side() -> None:
    s = _policy(advantages=T([[-1.0, -1.0, -1.0, -1.0]])).stats
    # r=1.5, A=-1: -1.5 < -1.28, unclipped is smaller. r=0.5: clip gives -0.8 < -0.5: clipped.
    assert s.clipfrac.value == pytest.approx(1 / 3)
    assert s.pg_loss.value == pytest.approx((1.5 + 0.8 + 1.0) / 3)


def test_dual_clip_caps_the_loss_of_negative_advantages() -> None:
    # ratios 5, 2, 5; advantages -1, -1, +1. PPO's loss: 5 (unclipped branch), 2, -1.28.
    # With clip_ratio_c = 3 the first is capped at -3 * A = 3 (verl's pg_losses3); the
    # second is below the cap and a positive advantage is never dual-clipped.
    kw = dict(
        log_probs=torch.log(T([[5.0, 2.0, 5.0]])),
        old_log_probs=torch.zeros(1, 3),
        advantages=T([[-1.0, -1.0, 1.0]]),
        mask=torch.ones(1, 3),
    )
    plain = _policy(**kw).stats
    assert plain.pg_loss.value == pytest.approx((5.0 + 2.0 - 1.28) / 3)
    dual = _policy(clip_ratio_c=3.0, **kw)
    assert dual.stats.pg_loss.value == pytest.approx((3.0 + 2.0 - 1.28) / 3)
    assert dual.stats.pg_clipfrac_lower.value == pytest.approx(1 / 3)
    assert dual.stats.clipfrac.value == pytest.approx(1 / 3)  # the positive token, as before
    # The capped token passes no gradient.
    logp = torch.log(T([[5.0, 2.0, 5.0]])).requires_grad_(True)
    (grad,) = torch.autograd.grad(_policy(clip_ratio_c=3.0, **{**kw, "log_probs": logp}).loss, logp)
    assert grad[0, 0] == 0.0 and grad[0, 1] != 0.0


def test_approx_kl_and_policy_kl_signs() -> None:
    s = _policy().stats
    lr = [math.log(1.5), math.log(0.5), 0.0]  # logp - logp_old
    assert s.approxkl.value == pytest.approx(sum(0.5 * x * x for x in lr) / 3, rel=1e-6)
    # ROLL's policykl is logp - logp_old (verl's ppo_kl is the negative).
    assert s.policykl.value == pytest.approx(sum(lr) / 3, rel=1e-6)
    assert s.policykl.value < 0


def test_k3_and_its_clamp() -> None:
    # p = 0.5, p_ref = 0.25: r = ln 0.5, exp(r) - r - 1 = 0.5 + ln 2 - 1
    k3 = ppo.kl_k3(torch.log(T([0.5])), torch.log(T([0.25])))
    assert k3.item() == pytest.approx(math.log(2) - 0.5, rel=1e-6)
    # r = 5: e^5 - 6 = 142.4 is clamped to 10, as verl and ROLL clamp it.
    assert ppo.kl_k3(T([0.0]), T([5.0])).item() == 10.0
    assert ppo.kl_k3(T([0.0]), T([2.0])).item() == pytest.approx(math.exp(2) - 3)


def test_kl_loss_term() -> None:
    base = _policy()
    with_kl = _policy(ref_log_probs=torch.zeros(1, 4), kl_coef=2.0)
    # k3 per token with r = -log(ratio): exp(r) - r - 1 = 1/ratio + log(ratio) - 1
    by_hand = sum(1 / r + math.log(r) - 1 for r in (1.5, 0.5, 1.0)) / 3
    assert with_kl.stats.kl_loss.value == pytest.approx(by_hand, rel=1e-6)
    expected = base.stats.total_loss.value + 2.0 * by_hand
    assert with_kl.stats.total_loss.value == pytest.approx(expected, abs=1e-6)
    assert with_kl.stats.pg_loss == base.stats.pg_loss


def test_sample_weights_scale_the_weighted_loss_only() -> None:
    s = _policy(sample_weights=T([2.0])).stats
    assert s.weighted_pg_loss.value == pytest.approx(2 * s.pg_loss.value)
    assert s.total_loss.value == pytest.approx(s.weighted_pg_loss.value)


# Two sequences: ratios (1.5, 1.0) and (1.1); advantages 1 on every token.
TWO = dict(
    log_probs=torch.log(T([[1.5, 1.0], [1.1, 1.0]])),
    old_log_probs=torch.zeros(2, 2),
    advantages=torch.ones(2, 2),
    mask=T([[1.0, 1.0], [1.0, 0.0]]),
)
# pg per token: -1.28 (clipped), -1.0, -1.1; the clipped flags: 1, 0, 0.
TWO_BY_HAND = {
    "token-mean": ((-1.28 - 1.0 - 1.1) / 3, 1 / 3),
    "seq-mean-token-sum": ((-2.28 - 1.1) / 2, 1 / 3),
    "seq-mean-token-mean": ((-1.14 - 1.1) / 2, (0.5 + 0.0) / 2),
    "seq-mean-token-sum-norm": ((-1.28 - 1.0 - 1.1) / 2, 1 / 3),  # width 2
}


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_pg_loss_and_clipfrac_follow_the_mode(mode: str) -> None:
    out = _policy(**TWO, mode=mode, scale=_one_rank(TWO["mask"]))
    pg, clipfrac = TWO_BY_HAND[mode]
    assert out.stats.pg_loss.value == pytest.approx(pg)
    assert out.loss.item() == pytest.approx(pg)  # what is back-propagated, one rank
    assert out.stats.clipfrac.value == pytest.approx(clipfrac)
    # ROLL's fixed choices, whatever the mode: the ratio mean per sequence, the ratio clip
    # fractions per token.
    assert out.stats.ratio_mean.value == pytest.approx((1.25 + 1.1) / 2)
    assert out.stats.ppo_ratio_high_clipfrac.value == pytest.approx(1 / 3)


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_global_scale_splits_the_gradient_exactly(mode: str) -> None:
    # Two ranks' losses, each with the global scale, sum to the full batch's loss and gradient.
    logp = torch.log(T([[1.2, 0.9, 1.0], [1.0, 1.3, 0.7]])).requires_grad_(True)
    mask = T([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    adv = T([[1.0, -0.5, 0.2], [0.3, 2.0, 1.0]])
    kw = dict(clip_low=0.2, clip_high=0.28, mode=mode, scale=_one_rank(mask))

    def loss(rows: slice) -> torch.Tensor:
        return ppo.policy_loss(
            logp[rows], torch.zeros(2, 3)[rows], adv[rows], mask[rows], **kw
        ).loss

    full = loss(slice(0, 2))
    (g_full,) = torch.autograd.grad(full, logp)
    halves = [loss(slice(0, 1)), loss(slice(1, 2))]
    assert sum(h.item() for h in halves) == pytest.approx(full.item())
    g_sum = sum(torch.autograd.grad(h, logp)[0] for h in halves)
    assert torch.allclose(g_full, g_sum)


def test_adaptive_kl_controller() -> None:
    ctl = ppo.AdaptiveKLController(coef=0.1, target_kl=0.05, horizon=10, coef_max=1.0)
    assert ctl.update(0.1, n_steps=5).coef == pytest.approx(0.11)  # error clipped to +0.2
    assert ctl.update(0.055, n_steps=5).coef == pytest.approx(0.105)  # error 0.1 x 5/10
    assert ctl.update(0.0, n_steps=5).coef == pytest.approx(0.09)  # error clipped to -0.2
    capped = ppo.AdaptiveKLController(coef=0.9, target_kl=0.05, horizon=10, coef_max=0.95)
    assert capped.update(1.0, n_steps=10).coef == pytest.approx(0.95)
    fixed = ppo.AdaptiveKLController(coef=0.1, target_kl=None, horizon=10, coef_max=1.0)
    assert fixed.update(5.0, n_steps=100).coef == 0.1


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


# ---------------------------------------------------------------------------------------------
# Value loss: ROLL's per-sequence token means


def _value(clip: float | None):
    mask = T([[1.0, 1.0], [1.0, 0.0]])
    return ppo.value_loss(
        T([[0.5, 0.1], [2.0, 7.0]]),
        torch.zeros(2, 2),
        T([[1.0, -1.0], [0.0, 0.0]]),
        mask,
        clip=clip,
        scale=_one_rank(mask),
    )


def test_value_statistics_are_per_sequence_means() -> None:
    out = _value(clip=0.2)
    s = out.stats
    # Row 0, token 0: v_clipped = 0.2, (0.2 - 1)^2 = 0.64 > 0.25: the clipped branch, 0.32;
    # token 1: v_clipped = 0.1 = v, 0.605. Row 1: v_clipped = 0.2, 0.04 < 4: unclipped, 2.0.
    assert s.loss.value == pytest.approx(((0.32 + 0.605) / 2 + 2.0) / 2)
    assert out.loss.item() == pytest.approx(s.loss.value)
    assert s.clipfrac.value == pytest.approx((0.5 + 0.0) / 2)
    assert s.error.value == pytest.approx(((0.25 + 1.21) / 2 + 4.0) / 2)
    assert s.vpred.value == pytest.approx(((0.5 + 0.1) / 2 + 2.0) / 2)
    assert s.value.value == 0.0
    # A token-weighted mean would be (0.25 + 1.21 + 4) / 3: the test tells them apart.
    assert s.error.value != pytest.approx((0.25 + 1.21 + 4.0) / 3)


def test_value_clipping_off_clips_nothing() -> None:
    s = _value(clip=None).stats
    assert s.clipfrac.value == 0.0
    assert s.loss.value == pytest.approx(0.5 * ((0.25 + 1.21) / 2 + 4.0) / 2)
