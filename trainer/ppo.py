"""PPO and GRPO maths as pure functions over tensors. No models, no I/O, no globals.

Shapes: ``(B, T)`` per response token with a 0/1 ``mask``; ``(B,)`` per sample. Losses come
back with the scalar to back-propagate *and* a stats object of detached tensors, from which
the workers log token-level means together with their token counts (so ranks pool exactly).

The loss to back-propagate is ``sum(token_loss * mask) / normaliser``. Data-parallel ranks
pass the *global* token count of the mini-batch as ``normaliser``; the sum of their gradients
(the all-reduce) is then exactly the gradient of the global token mean.

>>> import torch
>>> m = torch.tensor([[1.0, 1.0, 0.0]])
>>> gae(torch.tensor([[0.0, 1.0, 0.0]]), torch.zeros(1, 3), m, gamma=1.0, lam=1.0).advantages
tensor([[1., 1., 0.]])
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


def masked_sum(x: Tensor, mask: Tensor) -> Tensor:
    return (x * mask).sum()


def masked_mean(x: Tensor, mask: Tensor) -> Tensor:
    """Mean over the masked elements; 0 when the mask is empty."""
    return masked_sum(x, mask) / mask.sum().clamp(min=1)


def masked_whiten(x: Tensor, mask: Tensor, eps: float = 1e-8) -> Tensor:
    """Shift and scale the masked elements to mean 0, std 1 (population std)."""
    mean = masked_mean(x, mask)
    var = masked_mean((x - mean) ** 2, mask)
    return (x - mean) * torch.rsqrt(var + eps) * mask


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
    """``mode='batch'`` standardises the scores over the batch; then values outside
    ``[-clip, clip]`` are clipped. A batch with all-equal scores standardises to zeros."""
    rewards = scores.float()
    if mode == "batch":
        rewards = (rewards - rewards.mean()) / (rewards.std(unbiased=False) + eps)
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


def grpo_advantages(scores: Tensor, group_size: int, mask: Tensor, eps: float = 1e-6) -> Advantages:
    """Group-normalised advantages: each response's score standardised within its group of
    ``group_size`` consecutive samples (same prompt), broadcast to its tokens. The returns are
    the advantages (there is no critic)."""
    groups = scores.float().view(-1, group_size)
    mean = groups.mean(-1, keepdim=True)
    std = groups.std(-1, unbiased=False, keepdim=True)
    per_sample = ((groups - mean) / (std + eps)).view(-1)
    advantages = per_sample.unsqueeze(-1) * mask
    return Advantages(advantages, advantages.clone())


def uniform_groups(scores: Tensor, group_size: int) -> Tensor:
    """Per sample: True when every response in its group has the same score (no signal)."""
    groups = scores.float().view(-1, group_size)
    same = (groups.max(-1).values - groups.min(-1).values) == 0
    return same.repeat_interleave(group_size)


# ---------------------------------------------------------------------------------------------
# KL


def kl_k1(log_probs: Tensor, ref_log_probs: Tensor) -> Tensor:
    """log p - log p_ref: unbiased per-token KL estimate under samples from p."""
    return log_probs - ref_log_probs


def kl_k3(log_probs: Tensor, ref_log_probs: Tensor) -> Tensor:
    """exp(r) - r - 1 with r = log p_ref - log p: non-negative, low-variance KL estimate."""
    r = ref_log_probs - log_probs
    return torch.exp(r) - r - 1


@dataclass(frozen=True)
class AdaptiveKLController:
    """Adapts the KL coefficient so the observed KL tracks ``target_kl`` (Ziegler et al. 2019).

    ``coef <- coef * (1 + clip(kl / target - 1, -0.2, 0.2) * n_steps / horizon)``, capped at
    ``coef_max``. With ``target_kl=None`` the coefficient stays fixed.

    >>> AdaptiveKLController(0.1, 0.05, 10, 1.0).update(0.1, n_steps=5).coef
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
    """Detached per-token statistics of one policy-loss evaluation on one rank.

    Means are over this rank's ``n_tokens`` loss tokens; the boolean tensors are per token and
    are read together with ``mask``.
    """

    n_tokens: int
    pg_loss: float
    weighted_pg_loss: float
    kl_loss: float
    entropy: float
    approxkl: float
    policykl: float
    total_loss: float
    mask: Tensor
    ratio: Tensor
    high_clipped: Tensor
    low_clipped: Tensor
    ratio_clipped: Tensor
    surrogate_clipped: Tensor


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
    normaliser: float,
    sample_weights: Tensor | None = None,
    ref_log_probs: Tensor | None = None,
    kl_coef: float = 0.0,
    entropy: Tensor | None = None,
    entropy_coef: float = 0.0,
    sft_nll: Tensor | None = None,
    sft_coef: float = 0.0,
) -> PolicyLoss:
    """Clipped surrogate with separate low and high clip ranges (ratio in
    ``[1 - clip_low, 1 + clip_high]``), plus optional terms:

    * ``kl_coef * k3(log_probs, ref_log_probs)``: the KL penalty in the loss;
    * ``- entropy_coef * entropy``: an entropy bonus;
    * ``sft_coef * sft_nll``: an NLL term on the tokens the caller selected (positives).

    ``sample_weights`` (per sample) scale the policy-gradient term (``weighted_pg_loss``,
    which is what is back-propagated); ``pg_loss`` is reported unweighted. The KL is always
    measured when ``ref_log_probs`` is given, even with ``kl_coef=0``.
    """
    mask = mask.float()
    log_ratio = log_probs - old_log_probs
    ratio = torch.exp(log_ratio)
    surrogate = ratio * advantages
    clipped_ratio = ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    clipped_surrogate = clipped_ratio * advantages
    pg_tokens = -torch.min(surrogate, clipped_surrogate)
    weights = torch.ones_like(mask) if sample_weights is None else sample_weights.unsqueeze(-1)
    weighted_pg_tokens = pg_tokens * weights

    total_tokens = weighted_pg_tokens
    kl_tokens = torch.zeros_like(log_probs)
    if ref_log_probs is not None:
        kl_tokens = kl_k3(log_probs, ref_log_probs)
        total_tokens = total_tokens + kl_coef * kl_tokens
    entropy_tokens = torch.zeros_like(log_probs) if entropy is None else entropy
    total_tokens = total_tokens - entropy_coef * entropy_tokens
    if sft_nll is not None:
        total_tokens = total_tokens + sft_coef * sft_nll

    loss = masked_sum(total_tokens, mask) / normaliser
    with torch.no_grad():
        stats = PolicyStats(
            n_tokens=int(mask.sum().item()),
            pg_loss=float(masked_mean(pg_tokens, mask)),
            weighted_pg_loss=float(masked_mean(weighted_pg_tokens, mask)),
            kl_loss=float(masked_mean(kl_tokens, mask)),
            entropy=float(masked_mean(entropy_tokens, mask)),
            approxkl=float(masked_mean(0.5 * log_ratio**2, mask)),
            policykl=float(masked_mean(-log_ratio, mask)),
            total_loss=float(masked_mean(total_tokens, mask)),
            mask=mask.detach().bool(),
            ratio=ratio.detach(),
            high_clipped=(ratio > 1.0 + clip_high).detach(),
            low_clipped=(ratio < 1.0 - clip_low).detach(),
            ratio_clipped=((ratio > 1.0 + clip_high) | (ratio < 1.0 - clip_low)).detach(),
            # The clipped branch is active where it is strictly the smaller surrogate.
            surrogate_clipped=(clipped_surrogate < surrogate).detach(),
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


@dataclass(frozen=True)
class ValueStats:
    n_tokens: int
    loss: float
    error: float
    vpred: float
    value: float
    mask: Tensor
    clipped: Tensor


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
    normaliser: float,
) -> ValueLoss:
    """``0.5 * max((v - R)^2, (v_clipped - R)^2)`` with ``v_clipped`` kept within ``clip`` of
    the old value; ``clipped`` marks tokens where the clipped term was the larger (the active
    branch). Without clipping the loss is ``0.5 * (v - R)^2`` and nothing is clipped.
    ``error`` is the unclipped squared error."""
    mask = mask.float()
    error_tokens = (vpred - returns) ** 2
    if clip is None:
        loss_tokens = 0.5 * error_tokens
        clipped = torch.zeros_like(mask, dtype=torch.bool)
    else:
        # clamp with bounds, not old + clamp(v - old): inside the range it must return v
        # itself, or rounding makes the two errors differ and noise counts as clipping.
        v_clipped = torch.clamp(vpred, min=old_values - clip, max=old_values + clip)
        clipped_error = (v_clipped - returns) ** 2
        loss_tokens = 0.5 * torch.max(error_tokens, clipped_error)
        clipped = (clipped_error > error_tokens).detach()
    loss = masked_sum(loss_tokens, mask) / normaliser
    with torch.no_grad():
        stats = ValueStats(
            n_tokens=int(mask.sum().item()),
            loss=float(masked_mean(loss_tokens, mask)),
            error=float(masked_mean(error_tokens, mask)),
            vpred=float(masked_mean(vpred, mask)),
            value=float(masked_mean(old_values, mask)),
            mask=mask.detach().bool(),
            clipped=clipped,
        )
    return ValueLoss(loss, stats)
