"""ROLL's worker metrics as mergeable states: the maths of the exact hook, without ROLL.

Each function takes the tensors ROLL's ``loss_func`` of one training micro-batch works on and
returns, under ROLL's own metric names (reducer tags stripped), states that the collector pools
over every micro-batch of every data-parallel rank of the step: ``Weighted(mean, weight)``
and ``Fraction(part, whole)``. Tensors in, tensors out: nothing is read back from the device
(the producer does that later, off the training thread on a GPU). The hook that calls these is
``rlpulse.producer.integrations.roll_loss``.

What *exact* means here, for the step (every optimizer step of it pooled):

* a loss statistic aggregated by ``loss_agg_mode`` over the **loss tokens** (the response
  tokens of the samples that pass ROLL's sample filter and its train/infer filter): under
  ``token-mean`` the mean over the step's loss tokens; under ``seq-mean-token-mean`` /
  ``seq-mean-token-sum`` the mean over the step's non-empty sequences of each one's token mean /
  token sum; under ``seq-mean-token-sum-norm`` the mean over those sequences of each one's token
  sum divided by one constant width (``norm_width``: the padded response width,
  ``sequence_length - 1``), as Dr. GRPO defines it;
* a clip fraction: clipped loss tokens over loss tokens (``actor/clipfrac``: per sequence, then
  over sequences, under ``seq-mean-token-mean``, as the catalog defines it);
* a filter's pass rate: passing response tokens over response tokens;
* the critic's statistics: each sequence's token mean over its response tokens, averaged over
  the step's non-empty sequences (ROLL's definition for one micro-batch, pooled).

>>> import torch
>>> mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
>>> state = by_mode(torch.tensor([[1.0, 3.0, 9.0], [5.0, 7.0, 9.0]]), mask, "token-mean")
>>> float(state.value), int(state.weight)
(3.0, 3)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rlpulse.producer.integrations.roll_config import (
    ActorSettings,
    Correction,
    CriticSettings,
    actor_settings,
)
from rlpulse.producer.values import Fraction, Weighted
from rlpulse.schemas import metrics as M
from rlpulse.schemas.reductions import Stat

MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")
"""ROLL's ``loss_agg_mode`` values."""

GRANULARITIES = ("token", "geometric", "sequence", "segment")
"""The granularities of ROLL's train/infer ratio and difference."""

RATIO_MEAN = M.ACTOR_RATIO.output_names()[Stat.MEAN]
FINAL_MASK_MEAN = "actor/train_infer_final_mask_mean"
IS_WEIGHT_CLIPFRAC = "actor/is_weight_clipfrac"


def ratio_mask_mean(agg: str) -> str:
    """ROLL's name of the pass rate of a ratio filter at granularity ``agg``."""
    return f"actor/train_infer_{agg}_ratio_mask_mean"


def diff_mask_mean(agg: str) -> str:
    """ROLL's name of the pass rate of a difference filter at granularity ``agg``."""
    return f"actor/train_infer_{agg}_diff_mask_mean"


def ratio_mean(agg: str) -> str:
    return f"actor/train_infer_ratio_{agg}_mean"


def diff_mean(agg: str) -> str:
    return f"actor/train_infer_diff_{agg}_mean"


REDUCTIONS: dict[str, str] = {
    FINAL_MASK_MEAN: "fraction",
    IS_WEIGHT_CLIPFRAC: "fraction",
    **{ratio_mask_mean(a): "fraction" for a in GRANULARITIES},
    **{diff_mask_mean(a): "fraction" for a in GRANULARITIES},
    **{ratio_mean(a): "mean" for a in GRANULARITIES},
    **{diff_mean(a): "mean" for a in GRANULARITIES},
}
"""How the ROLL names outside rlpulse's catalog merge."""


@dataclass(frozen=True)
class ActorTensors:
    """One micro-batch's tensors, all ``[B, T]`` response-aligned (``T`` = the row width
    minus one) but ``sample_weights`` ``[B]``."""

    log_probs: Any
    old_log_probs: Any
    ref_log_probs: Any
    advantages: Any
    loss_mask: Any
    """The loss tokens: after ROLL's sample filter and its train/infer filter."""
    base_mask: Any
    """The response tokens before the train/infer filter (its pass rates are over these)."""
    infer_log_probs: Any = None
    is_weight: Any = None
    sample_weights: Any = None


def _torch() -> Any:
    import torch

    return torch


def by_mode(mat: Any, mask: Any, mode: str, norm_width: int | None = None) -> Weighted:
    """``mat`` aggregated by ``mode`` over ``mask`` in this micro-batch, as the state that
    pools to the step's value: a mean and its weight (tokens, or non-empty sequences)."""
    torch = _torch()
    mask = mask.bool()
    values = torch.where(mask, mat.detach().double(), 0.0)
    if mode == "token-mean":
        tokens = mask.sum()
        return Weighted(values.sum() / tokens.clamp(min=1), tokens)
    if mode not in MODES:
        raise ValueError(f"unknown loss_agg_mode {mode!r}; expected one of {MODES}")
    per_seq_tokens = mask.sum(-1)
    valid = per_seq_tokens > 0
    sequences = valid.sum()
    sums = values.sum(-1)
    if mode == "seq-mean-token-sum":
        per_seq = sums
    elif mode == "seq-mean-token-mean":
        per_seq = sums / per_seq_tokens.clamp(min=1)
    else:  # seq-mean-token-sum-norm: Dr. GRPO's constant width
        per_seq = sums / float(norm_width or mask.shape[-1])
    total = torch.where(valid, per_seq, 0.0).sum()
    return Weighted(total / sequences.clamp(min=1), sequences)


def share(indicator: Any, mask: Any) -> Fraction:
    """The tokens of ``mask`` where ``indicator`` holds, of all tokens of ``mask``."""
    mask = mask.bool()
    return Fraction((indicator.bool() & mask).sum(), mask.sum())


def seq_share(indicator: Any, mask: Any) -> Fraction:
    """Per non-empty sequence, the share of its tokens where ``indicator`` holds; summed
    over sequences, of the number of those sequences."""
    torch = _torch()
    mask = mask.bool()
    tokens = mask.sum(-1)
    hits = (indicator.bool() & mask).sum(-1).double()
    valid = tokens > 0
    return Fraction(torch.where(valid, hits / tokens.clamp(min=1), 0.0).sum(), valid.sum())


def masked_seq_mean(values: Any, mask: Any) -> Any:
    """Each row's mean over ``mask`` (0 for an empty row), ``[B]``."""
    torch = _torch()
    mask = mask.bool()
    total = torch.where(mask, values, 0.0).sum(-1)
    return total / mask.sum(-1).clamp(min=1)


def segment_mean(values: Any, mask: Any) -> Any:
    """At every position of ``mask``, the mean of ``values`` over the run of consecutive
    ``mask`` positions it belongs to (0 elsewhere), ``[B, T]``: agentic turns."""
    torch = _torch()
    mask = mask.bool()
    rows, width = mask.shape
    before = torch.zeros_like(mask)
    before[:, 1:] = mask[:, :-1]
    starts = mask & ~before
    segment = torch.cumsum(starts.long(), dim=-1) * mask  # 1.. within a row, 0 outside
    index = (segment + torch.arange(rows, device=mask.device).unsqueeze(-1) * (width + 1)).reshape(
        -1
    )
    flat = torch.where(mask, values, 0.0).reshape(-1)
    size = rows * (width + 1)
    sums = torch.zeros(size, dtype=flat.dtype, device=flat.device).scatter_add_(0, index, flat)
    counts = torch.zeros(size, dtype=flat.dtype, device=flat.device).scatter_add_(
        0, index, mask.reshape(-1).to(flat.dtype)
    )
    means = (sums / counts.clamp(min=1)).gather(0, index).reshape(rows, width)
    return torch.where(mask, means, 0.0)


def importance_ratio(log_ratio: Any, mask: Any, importance: str) -> Any:
    """ROLL's policy ratio: per token, per sequence (the exponentiated token mean of the
    log-ratio, broadcast), or per agentic segment."""
    if importance == "token":
        return log_ratio.exp()
    if importance == "seq":
        return masked_seq_mean(log_ratio, mask).exp().unsqueeze(-1).expand_as(log_ratio)
    if importance == "segment":
        return segment_mean(log_ratio, mask).exp()
    raise ValueError(f"unknown importance ratio {importance!r}; expected token, seq or segment")


def _granular(per_token: Any, mask: Any, agg: str, log: bool) -> Any:
    """``per_token`` at granularity ``agg``: the log-ratio exponentiated (``log``) or the
    difference as it is."""
    torch = _torch()
    if agg == "token":
        out = per_token
    elif agg == "geometric":
        out = masked_seq_mean(per_token, mask).unsqueeze(-1).expand_as(per_token)
    elif agg == "sequence":
        out = torch.where(mask.bool(), per_token, 0.0).sum(-1).unsqueeze(-1).expand_as(per_token)
    elif agg == "segment":
        out = segment_mean(per_token, mask)
    else:
        raise ValueError(f"unknown train/infer granularity {agg!r}; expected {GRANULARITIES}")
    return out.exp() if log else out


def correction_states(
    correction: Correction, old_log_probs: Any, infer_log_probs: Any, base: Any
) -> tuple[dict[str, Any], Any, Any]:
    """The train/infer statistics of one micro-batch over its response tokens ``base``, the
    filters' pass mask (``[B, T]``, true where every enabled filter passes) and the importance
    weight the policy loss is multiplied by (None when ROLL's ``is_weight`` is off)."""
    torch = _torch()
    base = base.bool()
    old, infer = old_log_probs.detach(), infer_log_probs.detach()
    log_ratio = old - infer
    diff = old.exp() - infer.exp()
    ratios = {a: _granular(log_ratio, base, a, log=True) for a in GRANULARITIES}
    diffs = {a: _granular(diff, base, a, log=False) for a in GRANULARITIES}
    out: dict[str, Any] = {}
    for agg in GRANULARITIES:
        out[ratio_mean(agg)] = by_mode(ratios[agg], base, "seq-mean-token-mean")
        out[diff_mean(agg)] = by_mode(diffs[agg], base, "seq-mean-token-mean")
    weight = None
    if correction.is_weight:
        weight = ratios[correction.weight_type]
        if correction.upper_bound is not None:
            out[IS_WEIGHT_CLIPFRAC] = share(weight > correction.upper_bound, base)
            weight = weight.clamp(min=0.0, max=correction.upper_bound)
    passed = torch.ones_like(base)
    for f in correction.filters:
        if f.ratio is not None:
            ok = (ratios[f.agg] >= f.ratio[0]) & (ratios[f.agg] <= f.ratio[1])
            out[ratio_mask_mean(f.agg)] = share(ok, base)
            passed = passed & ok
        if f.diff is not None:
            ok = (diffs[f.agg] >= f.diff[0]) & (diffs[f.agg] <= f.diff[1])
            out[diff_mask_mean(f.agg)] = share(ok, base)
            passed = passed & ok
    if correction.has_filters:
        out[FINAL_MASK_MEAN] = share(passed, base)
    return out, passed, weight


def k3(log_probs: Any, base: Any) -> Any:
    """The k3 estimator of KL(current || base) per token, clamped to [-10, 10] (ROLL's)."""
    torch = _torch()
    kl = base - log_probs
    return torch.clamp(kl.exp() - kl - 1, min=-10, max=10)


def actor_states(t: ActorTensors, s: ActorSettings) -> dict[str, Any]:
    """The actor's statistics of one micro-batch (see the module docstring)."""
    torch = _torch()
    mode, width = s.loss_agg_mode, s.norm_width
    mask = t.loss_mask.bool()
    logp = t.log_probs.detach()
    old = t.old_log_probs.detach()
    adv = t.advantages.detach()
    log_ratio = logp - old
    ratio = importance_ratio(log_ratio, mask, s.importance)
    surr1 = ratio * adv
    surr2 = ratio.clamp(1 - s.clip_low, 1 + s.clip_high) * adv
    pg = -torch.min(surr1, surr2)
    if s.dual_clip:
        pg = torch.where(adv < 0, -torch.max(-pg, (1 + s.pg_clip * 2) * adv), pg)
    if t.is_weight is not None:
        pg = pg * t.is_weight.detach()
    kl = k3(logp, t.ref_log_probs.detach())
    low = ratio < 1 - s.clip_low
    high = ratio > 1 + s.clip_high
    clipped_branch = surr2 < surr1
    out: dict[str, Any] = {
        M.ACTOR_PG_LOSS.name: by_mode(pg, mask, mode, width),
        M.ACTOR_KL_LOSS.name: by_mode(kl, mask, mode, width),
        M.ACTOR_APPROXKL.name: by_mode(0.5 * log_ratio.square(), mask, mode, width),
        M.ACTOR_POLICYKL.name: by_mode(log_ratio, mask, mode, width),
        M.ACTOR_PPO_RATIO_HIGH_CLIPFRAC.name: share(high, mask),
        M.ACTOR_PPO_RATIO_LOW_CLIPFRAC.name: share(low, mask),
        M.ACTOR_PPO_RATIO_CLIPFRAC.name: share(low | high, mask),
        M.ACTOR_CLIPFRAC.name: (
            seq_share(clipped_branch, mask)
            if mode == "seq-mean-token-mean"
            else share(clipped_branch, mask)
        ),
        RATIO_MEAN: by_mode(ratio, mask, "seq-mean-token-mean"),
    }
    weights = t.sample_weights
    weighted_pg = pg if weights is None else pg * weights.detach().unsqueeze(-1)
    if s.weighted:
        out[M.ACTOR_WEIGHTED_PG_LOSS.name] = by_mode(weighted_pg, mask, mode, width)
    if total_loss_exact(s):  # with an entropy bonus ROLL's value stays (see total_loss_exact)
        total = (weighted_pg + (kl * s.kl_loss_coef if s.use_kl_loss else 0.0)) * s.rl_loss_coef
        out[M.ACTOR_TOTAL_LOSS.name] = by_mode(total, mask, mode, width)
    return out


def total_loss_exact(s: ActorSettings) -> bool:
    """Whether ``actor/total_loss`` is logged worker-side: not with an entropy bonus, which
    rlvr aggregates over other tokens (every response token) and with other denominators than
    the policy loss, so that no one state pools the sum of the terms."""
    return s.entropy_coef == 0


def critic_states(
    values: Any, old_values: Any, returns: Any, mask: Any, s: CriticSettings
) -> dict[str, Any]:
    """The critic's statistics of one micro-batch over its response tokens ``mask``."""
    torch = _torch()
    mask = mask.bool()
    v, old, ret = values.detach(), old_values.detach(), returns.detach()
    error = (v - ret) ** 2
    if s.value_clip is not None:
        clipped = torch.clip(v, old - s.value_clip, old + s.value_clip)
        clipped_error = (clipped - ret) ** 2
        loss = torch.max(error, clipped_error)
        clipfrac = seq_share(clipped_error > error, mask)
    else:
        loss = error
        clipfrac = Fraction(0.0, (mask.sum(-1) > 0).sum())
    seq_mean = "seq-mean-token-mean"
    return {
        M.CRITIC_LOSS.name: by_mode(0.5 * loss, mask, seq_mean),
        M.CRITIC_VALUE.name: by_mode(old, mask, seq_mean),
        M.CRITIC_VPRED.name: by_mode(v, mask, seq_mean),
        M.CRITIC_ERROR.name: by_mode(error, mask, seq_mean),
        M.CRITIC_CLIPFRAC.name: clipfrac,
    }


ACTOR_NAMES = (
    M.ACTOR_PG_LOSS.name,
    M.ACTOR_WEIGHTED_PG_LOSS.name,
    M.ACTOR_KL_LOSS.name,
    M.ACTOR_TOTAL_LOSS.name,
    M.ACTOR_APPROXKL.name,
    M.ACTOR_POLICYKL.name,
    M.ACTOR_PPO_RATIO_HIGH_CLIPFRAC.name,
    M.ACTOR_PPO_RATIO_LOW_CLIPFRAC.name,
    M.ACTOR_PPO_RATIO_CLIPFRAC.name,
    M.ACTOR_CLIPFRAC.name,
    RATIO_MEAN,
)
CRITIC_NAMES = (
    M.CRITIC_LOSS.name,
    M.CRITIC_VALUE.name,
    M.CRITIC_VPRED.name,
    M.CRITIC_ERROR.name,
    M.CRITIC_CLIPFRAC.name,
)


def worker_side(
    config: Mapping[str, Any] | Any, roles: Sequence[str] = ("actor", "critic")
) -> tuple[str, ...]:
    """The names the hooked workers log exactly under ROLL's (resolved) pipeline ``config``:
    the driver leaves ROLL's values of them out. The workers decide the same from the same
    config (:func:`actor_settings`)."""
    names: list[str] = []
    if "actor" in roles:
        s = actor_settings(config, agentic=False)
        names += [n for n in ACTOR_NAMES if n != M.ACTOR_TOTAL_LOSS.name or total_loss_exact(s)]
        if s.correction is not None:
            names += [n for n in REDUCTIONS]
    if "critic" in roles:
        names += list(CRITIC_NAMES)
    return tuple(names)
