"""PPO losses, KL estimators and loss aggregation as pure functions. No models, no I/O.

Shapes: ``(B, T)`` per response token with a 0/1 ``mask``; ``(B,)`` per sample. The reward and
advantage maths lives in :mod:`rlpulse.trainer.advantage`.

**Aggregation.** A loss over a mini-batch is one of the four ``loss_agg_mode`` reductions that
verl (``core_algos.agg_loss``) and ROLL (``functionals.agg_loss``) offer, taken over the
*global* mini-batch: each data-parallel rank computes its own term with the global
denominators (:class:`AggScale`), so the all-reduced (summed) gradient is the gradient of the
global loss whatever the number of ranks.

**Statistics.** Every statistic comes back as an :class:`Aggregate`: this rank's term of the
global value and its share of the denominator. Logged as ``Weighted(part / share, share)``, the
collector's pooled mean over ranks is the global value of the mini-batch, and over K optimizer
steps the mean of their K global values, which is what ROLL reports (it sums the ranks' terms
of each step and divides by the number of steps). Nothing is a mean of per-rank means.

>>> m = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
>>> x = torch.tensor([[1.0, 3.0, 9.0], [5.0, 9.0, 9.0]])
>>> scale = AggScale.of(m)
>>> modes = ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"]
>>> [float(agg(x, m, mode, scale)) for mode in modes]
[3.0, 4.5, 3.5, 3.0]
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from rlpulse.trainer.config import LossAggMode

KL_CLAMP = 10.0
"""The k3 estimate is clamped to [-10, 10] per token, as both verl and ROLL do."""
SEQ_MEAN: LossAggMode = "seq-mean-token-mean"
TOKEN_MEAN: LossAggMode = "token-mean"


def masked_sum(x: Tensor, mask: Tensor) -> Tensor:
    return (x * mask).sum()


def masked_mean(x: Tensor, mask: Tensor) -> Tensor:
    """Mean over the masked elements; 0 when the mask is empty."""
    return masked_sum(x, mask) / mask.sum().clamp(min=1)


# ---------------------------------------------------------------------------------------------
# Aggregation


@dataclass(frozen=True)
class AggScale:
    """The global denominators of one mini-batch, the same on every rank: its loss tokens, its
    sequences with at least one loss token, and the divisor of ``seq-mean-token-sum-norm``.

    >>> AggScale.of(torch.tensor([[1.0, 1.0], [1.0, 0.0], [0.0, 0.0]]))
    AggScale(tokens=3.0, seqs=2.0, norm=2.0)
    """

    tokens: float
    seqs: float
    norm: float

    @classmethod
    def of(
        cls,
        mask: Tensor,
        norm: float | None = None,
        all_reduce: Callable[[Tensor], None] | None = None,
    ) -> AggScale:
        """Count ``mask``'s tokens and sequences, summed over ranks by ``all_reduce`` (in
        place, as ``Comm.all_reduce_sum``) when given. ``norm=None`` takes the response width,
        which is the same on every rank (every shard is cut from one padded batch)."""
        counts = torch.stack([mask.sum(), (mask.sum(-1) > 0).sum()]).to(torch.float64)
        if all_reduce is not None:
            all_reduce(counts)
        tokens, seqs = counts.tolist()
        return cls(tokens, seqs, float(mask.shape[-1]) if norm is None else float(norm))


@dataclass(frozen=True)
class Aggregate:
    """One rank's term of a statistic aggregated over a global mini-batch.

    ``part`` summed over the ranks is the global value; ``share`` is this rank's share of the
    denominator (its tokens, or its sequences, over the global count), summing to 1.

    >>> Aggregate(part=0.25, share=0.5).value  # this rank's own mean
    0.5
    """

    part: float
    share: float

    @property
    def value(self) -> float:
        """This rank's own aggregate (its part over its share); 0 when it has no share."""
        return self.part / self.share if self.share > 0 else 0.0


def _over(x: Tensor, denominator: float) -> Tensor:
    return x / denominator if denominator > 0 else x * 0.0


def agg(x: Tensor, mask: Tensor, mode: str, scale: AggScale) -> Tensor:
    """This rank's term of ``x`` aggregated over the global mini-batch by ``mode`` (a tensor
    that keeps the graph). With ``m`` the mask, sums over this rank's rows:

    * ``token-mean``: ``sum(x*m) / tokens``;
    * ``seq-mean-token-sum``: ``sum_i sum_t(x*m) / seqs``;
    * ``seq-mean-token-mean``: ``sum_i [sum_t(x*m) / sum_t(m)] / seqs``;
    * ``seq-mean-token-sum-norm``: ``sum(x*m) / norm`` (no mean over sequences, as in verl
      and ROLL: "turns off seq-dim averaging").

    Sequences without a masked token contribute nothing and are not counted.
    """
    if mode == "token-mean":
        return _over(masked_sum(x, mask), scale.tokens)
    if mode == "seq-mean-token-sum":
        return _over(masked_sum(x, mask), scale.seqs)
    if mode == "seq-mean-token-mean":
        per_seq = (x * mask).sum(-1) / mask.sum(-1).clamp(min=1)
        return _over(per_seq.sum(), scale.seqs)
    if mode == "seq-mean-token-sum-norm":
        return _over(masked_sum(x, mask), scale.norm)
    raise ValueError(f"unknown loss aggregation mode {mode!r}")


def share(mask: Tensor, mode: str, scale: AggScale) -> float:
    """This rank's share of ``mode``'s denominator: its sequences under the two sequence-mean
    modes, its tokens otherwise (the token-sum-norm divisor is a constant; tokens split it)."""
    if mode in ("seq-mean-token-sum", "seq-mean-token-mean"):
        mine = float((mask.sum(-1) > 0).sum())
        return mine / scale.seqs if scale.seqs > 0 else 0.0
    mine = float(mask.sum())
    return mine / scale.tokens if scale.tokens > 0 else 0.0


@torch.no_grad()
def aggregate(x: Tensor, mask: Tensor, mode: str, scale: AggScale) -> Aggregate:
    """:func:`agg` as a detached statistic, with this rank's share."""
    return Aggregate(float(agg(x.detach(), mask, mode, scale)), share(mask, mode, scale))


def fraction_mode(mode: str) -> LossAggMode:
    """How a clip fraction is weighted under a loss mode: as the loss weighs its tokens, so the
    fraction is the share of the loss's weight on flagged tokens. Every token weighs the same
    under ``token-mean``, ``seq-mean-token-sum`` and ``seq-mean-token-sum-norm``; every
    sequence under ``seq-mean-token-mean``. (ROLL aggregates the flags with the mode itself,
    which under the two token-sum modes is a count per sequence, not a fraction.)"""
    return SEQ_MEAN if mode == SEQ_MEAN else TOKEN_MEAN


# ---------------------------------------------------------------------------------------------
# KL


def kl_k1(log_probs: Tensor, ref_log_probs: Tensor) -> Tensor:
    """log p - log p_ref: unbiased per-token KL estimate under samples from p."""
    return log_probs - ref_log_probs


def kl_k3(log_probs: Tensor, ref_log_probs: Tensor) -> Tensor:
    """exp(r) - r - 1 with r = log p_ref - log p, clamped to [-10, 10] as verl (``kl_penalty``,
    ``low_var_kl``) and ROLL (``compute_approx_kl``, ``k3``) do: non-negative, low variance,
    and one outlier token cannot dominate the mean."""
    r = ref_log_probs - log_probs
    return (torch.exp(r) - r - 1).clamp(-KL_CLAMP, KL_CLAMP)


def rollout_mismatch(rollout_log_probs: Tensor, log_probs: Tensor) -> tuple[Tensor, Tensor]:
    """Per token, the rollout engine's log-prob minus the trainer's (``rollout/logprob_diff``)
    and the trainer's over the engine's probability, exp(-diff) (``rollout/prob_ratio``, the
    importance weight of truncated-IS corrections). Both engines scoring a token alike give 0
    and 1; nothing here hides a difference, however small.

    >>> d, r = rollout_mismatch(torch.tensor([-1.0, -2.0]), torch.tensor([-1.0, -1.5]))
    >>> d.tolist(), [round(x, 4) for x in r.tolist()]
    ([0.0, -0.5], [1.0, 1.6487])
    """
    diff = rollout_log_probs - log_probs
    return diff, torch.exp(-diff)


@dataclass(frozen=True)
class AdaptiveKLController:
    """Adapts the KL coefficient so the observed KL tracks ``target_kl`` (Ziegler et al. 2019).

    ``coef <- coef * (1 + clip(kl / target - 1, -0.2, 0.2) * n_steps / horizon)``, capped at
    ``coef_max``. With ``target_kl=None`` the coefficient stays fixed.

    >>> round(AdaptiveKLController(0.1, 0.05, 10, 1.0).update(0.1, n_steps=5).coef, 6)
    0.11
    """

    coef: float
    target_kl: float | None
    horizon: int
    coef_max: float

    def update(self, current_kl: float, n_steps: int) -> AdaptiveKLController:
        if self.target_kl is None:
            return self
        error = min(max(current_kl / self.target_kl - 1.0, -0.2), 0.2)
        coef = self.coef * (1.0 + error * n_steps / self.horizon)
        return AdaptiveKLController(
            min(coef, self.coef_max), self.target_kl, self.horizon, self.coef_max
        )


# ---------------------------------------------------------------------------------------------
# Policy loss


@dataclass(frozen=True)
class PolicyStats:
    """The statistics of one policy-loss evaluation on one rank (see the catalog's help for
    each metric's formula). ``ratio`` and ``mask`` give the extremes of the ratio."""

    n_tokens: int
    pg_loss: Aggregate
    weighted_pg_loss: Aggregate
    kl_loss: Aggregate
    total_loss: Aggregate
    approxkl: Aggregate
    policykl: Aggregate
    clipfrac: Aggregate
    ratio_mean: Aggregate
    ppo_ratio_high_clipfrac: Aggregate
    ppo_ratio_low_clipfrac: Aggregate
    ppo_ratio_clipfrac: Aggregate
    pg_clipfrac_lower: Aggregate
    ratio: Tensor
    mask: Tensor


@dataclass(frozen=True)
class PolicyLoss:
    loss: Tensor
    stats: PolicyStats


def policy_loss(
    log_probs: Tensor,
    old_log_probs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    clip_low: float,
    clip_high: float,
    scale: AggScale,
    mode: str = TOKEN_MEAN,
    clip_ratio_c: float | None = None,
    sample_weights: Tensor | None = None,
    ref_log_probs: Tensor | None = None,
    kl_coef: float = 0.0,
    entropy: Tensor | None = None,
    entropy_coef: float = 0.0,
    sft_nll: Tensor | None = None,
    sft_coef: float = 0.0,
) -> PolicyLoss:
    """Clipped surrogate with separate low and high clip ranges (ratio in
    ``[1 - clip_low, 1 + clip_high]``), aggregated by ``mode`` over the global mini-batch of
    ``scale``, plus optional terms (each aggregated the same way):

    * dual clip: with ``A < 0`` the token loss is capped at ``-clip_ratio_c * A``;
    * ``kl_coef * k3(log_probs, ref_log_probs)``: the KL penalty in the loss;
    * ``- entropy_coef * entropy``: an entropy bonus;
    * ``sft_coef * sft_nll``: an NLL term on the tokens the caller selected (positives).

    ``sample_weights`` (per sample) scale the policy-gradient term (``weighted_pg_loss``,
    which is what is back-propagated); ``pg_loss`` is reported unweighted. The KL is always
    measured when ``ref_log_probs`` is given, even with ``kl_coef=0``.
    """
    mask = mask.to(log_probs.dtype)
    log_ratio = log_probs - old_log_probs
    ratio = torch.exp(log_ratio)
    surrogate = ratio * advantages
    clipped_surrogate = ratio.clamp(1.0 - clip_low, 1.0 + clip_high) * advantages
    pg_tokens = -torch.min(surrogate, clipped_surrogate)
    dual_clipped = torch.zeros_like(mask, dtype=torch.bool)
    if clip_ratio_c is not None:
        # A negative advantage with a huge ratio would make an unbounded loss: cap it.
        bound = -clip_ratio_c * advantages
        dual_clipped = (advantages < 0) & (pg_tokens > bound)
        pg_tokens = torch.where(advantages < 0, torch.minimum(pg_tokens, bound), pg_tokens)
    weights = torch.ones_like(mask) if sample_weights is None else sample_weights.unsqueeze(-1)
    weighted_pg_tokens = pg_tokens * weights

    total_tokens = weighted_pg_tokens
    kl_tokens = torch.zeros_like(log_probs)
    if ref_log_probs is not None:
        kl_tokens = kl_k3(log_probs, ref_log_probs)
        total_tokens = total_tokens + kl_coef * kl_tokens
    if entropy is not None:
        total_tokens = total_tokens - entropy_coef * entropy
    if sft_nll is not None:
        total_tokens = total_tokens + sft_coef * sft_nll

    loss = agg(total_tokens, mask, mode, scale)
    with torch.no_grad():
        high = (ratio > 1.0 + clip_high).to(mask.dtype)
        low = (ratio < 1.0 - clip_low).to(mask.dtype)

        def by_mode(x: Tensor, how: str = mode) -> Aggregate:
            return aggregate(x, mask, how, scale)

        stats = PolicyStats(
            n_tokens=int(mask.sum().item()),
            pg_loss=by_mode(pg_tokens),
            weighted_pg_loss=by_mode(weighted_pg_tokens),
            kl_loss=by_mode(kl_tokens),
            total_loss=by_mode(total_tokens),
            approxkl=by_mode(0.5 * log_ratio**2),
            policykl=by_mode(log_ratio),
            # The clipped branch is active where it is strictly the smaller surrogate.
            clipfrac=by_mode((clipped_surrogate < surrogate).to(mask.dtype), fraction_mode(mode)),
            ratio_mean=by_mode(ratio, SEQ_MEAN),
            ppo_ratio_high_clipfrac=by_mode(high, TOKEN_MEAN),
            ppo_ratio_low_clipfrac=by_mode(low, TOKEN_MEAN),
            ppo_ratio_clipfrac=by_mode(high + low, TOKEN_MEAN),
            pg_clipfrac_lower=by_mode(dual_clipped.to(mask.dtype), TOKEN_MEAN),
            ratio=ratio.detach(),
            mask=mask.detach().bool(),
        )
    return PolicyLoss(loss, stats)


@dataclass(frozen=True)
class SFTStats:
    """Token-level NLL sums and counts: all, positive and negative samples."""

    nll_sum: float
    n_tokens: int
    positive_sum: float
    positive_tokens: int
    negative_sum: float
    negative_tokens: int


def sft_stats(nll: Tensor, mask: Tensor, positive: Tensor) -> SFTStats:
    """Split the masked per-token NLL ``(B, T)`` by the per-sample ``positive`` flag."""
    with torch.no_grad():
        mask = mask.float()
        pos_mask = mask * positive.float().unsqueeze(-1)
        neg_mask = mask - pos_mask
        return SFTStats(
            float(masked_sum(nll, mask)),
            int(mask.sum()),
            float(masked_sum(nll, pos_mask)),
            int(pos_mask.sum()),
            float(masked_sum(nll, neg_mask)),
            int(neg_mask.sum()),
        )


# ---------------------------------------------------------------------------------------------
# Value loss


VALUE_MODE: LossAggMode = SEQ_MEAN
"""The critic's aggregation, loss and statistics alike: per-sequence token means averaged over
sequences, as ROLL's critic computes ``critic/loss``, ``value``, ``vpred``, ``error`` and
``clipfrac``."""


@dataclass(frozen=True)
class ValueStats:
    n_tokens: int
    loss: Aggregate
    error: Aggregate
    vpred: Aggregate
    value: Aggregate
    clipfrac: Aggregate


@dataclass(frozen=True)
class ValueLoss:
    loss: Tensor
    stats: ValueStats


def value_loss(
    vpred: Tensor,
    old_values: Tensor,
    returns: Tensor,
    mask: Tensor,
    *,
    clip: float | None,
    scale: AggScale,
) -> ValueLoss:
    """``0.5 * max((v - R)^2, (v_clipped - R)^2)`` with ``v_clipped`` kept within ``clip`` of
    the old value, aggregated by :data:`VALUE_MODE`; ``clipfrac`` counts tokens where the
    clipped term was the larger (the active branch). Without clipping the loss is
    ``0.5 * (v - R)^2`` and nothing is clipped. ``error`` is the unclipped squared error."""
    mask = mask.to(vpred.dtype)
    error_tokens = (vpred - returns) ** 2
    if clip is None:
        loss_tokens = 0.5 * error_tokens
        clipped = torch.zeros_like(mask)
    else:
        # clamp with bounds, not old + clamp(v - old): inside the range it must return v
        # itself, or rounding makes the two errors differ and noise counts as clipping.
        v_clipped = torch.clamp(vpred, min=old_values - clip, max=old_values + clip)
        clipped_error = (v_clipped - returns) ** 2
        loss_tokens = 0.5 * torch.max(error_tokens, clipped_error)
        clipped = (clipped_error > error_tokens).to(mask.dtype)
    loss = agg(loss_tokens, mask, VALUE_MODE, scale)
    with torch.no_grad():
        stats = ValueStats(
            n_tokens=int(mask.sum().item()),
            loss=aggregate(loss_tokens, mask, VALUE_MODE, scale),
            error=aggregate(error_tokens, mask, VALUE_MODE, scale),
            vpred=aggregate(vpred, mask, VALUE_MODE, scale),
            value=aggregate(old_values, mask, VALUE_MODE, scale),
            clipfrac=aggregate(clipped, mask, VALUE_MODE, scale),
        )
    return ValueLoss(loss, stats)
