"""The exact loss hook's maths, without verl: which of verl's loss metrics the workers log
exactly under a configuration (:func:`exact_names`), and each micro-batch's mergeable states
(:func:`loss_state`, :func:`vanilla_states`, :func:`value_states`), computed from the tensors
verl's loss functions see, as verl 0.9 computes them. Tensors in, tensors out: nothing is
read back from the device. The hook that calls these is
``rlpulse.producer.integrations.verl_loss``. Per micro-batch:

* ``actor/pg_loss``, ``critic/vf_loss``: ``Weighted(mean, weight)`` from the very loss tensor verl
  back-propagates, un-normalised from the global mini-batch to the micro-batch: weighted by
  tokens (``loss_agg_mode`` ``token-mean``) or sequences (the ``seq-mean-*`` modes); not sent
  (verl's value stays) under ``token-sum``, a sum rather than a mean;
* ``actor/pg_clipfrac``, ``actor/pg_clipfrac_lower``: ``Fraction(clipped tokens, tokens)``, and
  ``actor/ppo_kl``: ``Weighted(token mean, tokens)``, recomputed from the tensors verl passes to
  its ``vanilla`` policy loss (verl reads its own values back with ``.item()``; the hook reads
  nothing back);
* ``critic/vf_clipfrac`` (``Fraction``) and ``critic/vpred_mean`` (``Weighted``): from the
  tensor ``compute_value_loss`` returns, before ``value_loss`` reads it back, and its inputs.

>>> exact_names({"critic": {"strategy": "megatron"}})[:1]
('actor/pg_loss',)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rlpulse.producer.values import Fraction, Weighted
from rlpulse.schemas import frameworks as F, metrics as M

ACTOR_ROLE = "actor"
CRITIC_ROLE = "critic"
"""The roles the hooked workers log as (rank and world size: the worker's ``RANK``, ``WORLD_SIZE``)."""


# verl's names (rlpulse.schemas.frameworks), two of them the catalog's.
PG_LOSS = M.ACTOR_PG_LOSS.name
PG_CLIPFRAC = F.VERL_PG_CLIPFRAC
PG_CLIPFRAC_LOWER = M.ACTOR_PG_CLIPFRAC_LOWER.name
PPO_KL = F.VERL_PPO_KL
VF_LOSS = F.VERL_VF_LOSS
VF_CLIPFRAC = F.VERL_VF_CLIPFRAC
VPRED_MEAN = F.VERL_VPRED_MEAN


REDUCTIONS = {
    PG_CLIPFRAC: "fraction",
    PPO_KL: "mean",
    VF_LOSS: "mean",
    VF_CLIPFRAC: "fraction",
    VPRED_MEAN: "mean",
}
"""How the hook's names outside rlpulse's catalog merge (``actor/pg_loss`` and
``actor/pg_clipfrac_lower`` are catalog entries)."""


POLICY_LOSSES = ("vanilla",)
"""verl policy losses whose clip fractions and KL the hook recomputes."""


MEAN_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")
"""``loss_agg_mode`` values under which verl's loss is a mean (``token-sum`` is a sum)."""


DATA_PARALLEL = ("fsdp", "fsdp2")
"""Strategies where every worker is its own data-parallel rank (no tensor, pipeline or sequence
parallel group holding the same micro-batch twice)."""


def actor_names(loss_mode: str, loss_agg_mode: str, strategy: str, sp_size: int) -> tuple[str, ...]:
    """The actor metrics the hook logs exactly under this configuration (none where it cannot:
    another policy loss, model or sequence parallelism)."""
    if loss_mode not in POLICY_LOSSES or strategy not in DATA_PARALLEL or sp_size > 1:
        return ()
    ratios = (PG_CLIPFRAC, PG_CLIPFRAC_LOWER, PPO_KL)
    return (PG_LOSS, *ratios) if loss_agg_mode in MEAN_MODES else ratios


def critic_names(loss_agg_mode: str, strategy: str, sp_size: int) -> tuple[str, ...]:
    """The critic metrics the hook logs exactly under this configuration."""
    if strategy not in DATA_PARALLEL or sp_size > 1:
        return ()
    ratios = (VF_CLIPFRAC, VPRED_MEAN)
    return (VF_LOSS, *ratios) if loss_agg_mode in MEAN_MODES else ratios


def _sp_size(section: Mapping[str, Any]) -> int:
    fsdp = section.get("fsdp_config") or {}
    return max(
        int(section.get("ulysses_sequence_parallel_size") or 1),
        int(fsdp.get("ulysses_sequence_parallel_size") or 1) if isinstance(fsdp, Mapping) else 1,
    )


def exact_names(config: Mapping[str, Any]) -> tuple[str, ...]:
    """The names the workers log exactly for verl's (resolved) ``config``: the driver leaves its
    own values of them out. The workers decide the same from the same configuration."""
    # With distillation, verl's distillation loss calls ppo_loss (the wrapped one) for the
    # policy-gradient part; without it neither verl nor the hook has these metrics.
    section = (config.get("actor_rollout_ref") or {}).get("actor") or {}
    policy = section.get("policy_loss") or {}
    actor = actor_names(
        policy.get("loss_mode", "vanilla"),
        section.get("loss_agg_mode", "token-mean"),
        section.get("strategy", "fsdp"),
        _sp_size(section),
    )
    critic = config.get("critic") or {}
    return actor + critic_names(
        critic.get("loss_agg_mode", "token-mean"),
        critic.get("strategy", "fsdp"),
        _sp_size(critic),
    )


def loss_state(
    loss: Any,
    loss_agg_mode: str,
    mask: Any,
    dp_size: int,
    batch_num_tokens: Any,
    global_batch_size: Any,
) -> Weighted | None:
    """The micro-batch's own mean loss and its weight, from verl's ``agg_loss`` result, which is
    normalised by the global mini-batch (``batch_num_tokens`` tokens or ``global_batch_size``
    sequences over ``dp_size`` ranks): ``Weighted`` pools them to the tokens' (or sequences')
    mean. None under ``token-sum`` (a sum, not a mean). Tensors in, tensors out: nothing read."""
    loss = loss.detach().double()
    if loss_agg_mode == "token-mean":
        tokens = mask.sum()
        if batch_num_tokens is None:  # verl normalised by this micro-batch's tokens
            return Weighted(loss, tokens)
        return Weighted(loss * (batch_num_tokens / dp_size) / tokens.clamp(min=1), tokens)
    if loss_agg_mode in MEAN_MODES:
        if global_batch_size is None:  # verl normalised by this micro-batch's sequences
            return Weighted(loss, (mask.sum(-1) > 0).sum())
        sequences = mask.shape[0]
        return Weighted(loss * (global_batch_size / dp_size / sequences), sequences)
    return None


def vanilla_states(
    old_log_prob: Any, log_prob: Any, advantages: Any, response_mask: Any, config: Any
) -> dict[str, Any]:
    """``actor/ppo_kl``, ``actor/pg_clipfrac`` and ``actor/pg_clipfrac_lower`` of one micro-batch
    as mergeable states, computed as verl 0.9's ``compute_policy_loss_vanilla`` does."""
    import torch

    clip = config.clip_ratio
    low = config.clip_ratio_low if config.clip_ratio_low is not None else clip
    high = config.clip_ratio_high if config.clip_ratio_high is not None else clip
    clip_c = config.get("clip_ratio_c", 3.0)
    mask = response_mask.detach().bool()
    tokens = mask.sum()
    log_ratio = torch.clamp(log_prob.detach() - old_log_prob, min=-20.0, max=20.0)
    ratio = torch.exp(log_ratio)
    advantages = advantages.detach()
    loss1 = -advantages * ratio
    loss2 = -advantages * torch.clamp(ratio, 1 - low, 1 + high)
    clipped = torch.gt(loss2, loss1) & mask
    lower = torch.gt(torch.maximum(loss1, loss2), -advantages * clip_c) & (advantages < 0) & mask
    kl_sum = torch.where(mask, -log_ratio, 0.0).double().sum()
    return {
        PPO_KL: Weighted(kl_sum / tokens.clamp(min=1), tokens),
        PG_CLIPFRAC: Fraction(clipped.sum(), tokens),
        PG_CLIPFRAC_LOWER: Fraction(lower.sum(), tokens),
    }


def value_states(vpreds: Any, vf_clipfrac: Any, mask: Any) -> dict[str, Any]:
    """``critic/vf_clipfrac`` and ``critic/vpred_mean`` of one micro-batch as mergeable states,
    from the clip fraction verl's ``compute_value_loss`` returns, its predictions and the
    (boolean) response ``mask``."""
    import torch

    tokens = mask.sum()
    # verl's masked mean: sum / (tokens + 1e-8); the clipped count, back.
    clipped = vf_clipfrac.detach().double() * (tokens.double() + 1e-8)
    vpred_sum = torch.where(mask, vpreds.detach(), 0.0).double().sum()
    return {
        VF_CLIPFRAC: Fraction(torch.round(clipped), tokens),
        VPRED_MEAN: Weighted(vpred_sum / tokens.clamp(min=1), tokens),
    }
