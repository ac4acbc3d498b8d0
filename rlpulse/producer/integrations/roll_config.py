"""ROLL's pipeline config, read into what the exact statistics depend on.

``rlpulse.producer.integrations.roll_states`` computes the statistics under these settings;
the worker hook (``roll_worker``) and the driver (``roll_states.worker_side``) read them from
the same config, an object (ROLL's dataclasses) or a mapping (its YAML resolved), with ROLL's
own defaults for what the config leaves out.

>>> actor_settings({"loss_agg_mode": "token-mean", "pg_clip": 0.3}, agentic=False).clip_high
0.3
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Filter:
    """One of ROLL's train/infer filters (``train_infer_correction.filters[i]``), enabled."""

    agg: str
    ratio: tuple[float, float] | None = None
    diff: tuple[float, float] | None = None


@dataclass(frozen=True)
class Correction:
    """ROLL's ``train_infer_correction`` as the worker applies it (only when
    ``enable_old_logprobs_recompute`` is off: else the driver applied it to the batch)."""

    is_weight: bool = False
    weight_type: str = "token"
    upper_bound: float | None = None
    filters: tuple[Filter, ...] = ()
    has_filters: bool = False
    """Whether any filter is configured, enabled or not (ROLL then reports the final mask)."""


@dataclass(frozen=True)
class ActorSettings:
    """What of ROLL's pipeline config the actor statistics depend on."""

    loss_agg_mode: str = "seq-mean-token-sum"
    clip_low: float = 0.2
    clip_high: float = 0.2
    dual_clip: bool = False
    pg_clip: float = 0.2
    importance: str = "token"
    """``token``, ``seq`` (rlvr's ``importance_sampling``) or ``segment`` (agentic's ``ratio_type``)."""
    use_kl_loss: bool = False
    kl_loss_coef: float = 0.0
    entropy_coef: float = 0.0
    rl_loss_coef: float = 1.0
    weighted: bool = False
    """rlvr: ROLL reports ``actor/weighted_pg_loss`` (sample weights) beside ``actor/pg_loss``."""
    norm_width: int | None = None
    correction: Correction | None = field(default=None)


@dataclass(frozen=True)
class CriticSettings:
    value_clip: float | None = None


def actor_settings(config: Any, agentic: bool) -> ActorSettings:
    """The actor settings from ROLL's pipeline config (an object or a mapping)."""
    get = _getter(config)
    use_range = bool(get("use_pg_clip_range", False))
    pg_clip = float(get("pg_clip", 0.2))
    seq_len = get("sequence_length", None)
    if agentic:
        importance = "segment" if get("ratio_type", "token") == "segment" else "token"
    else:
        importance = str(get("importance_sampling", "token"))
    recompute = bool(get("enable_old_logprobs_recompute", False))
    return ActorSettings(
        loss_agg_mode=str(get("loss_agg_mode", "seq-mean-token-sum")),
        clip_low=float(get("pg_clip_low", pg_clip)) if use_range else pg_clip,
        clip_high=float(get("pg_clip_high", pg_clip)) if use_range else pg_clip,
        dual_clip=bool(get("dual_clip_loss", False)),
        pg_clip=pg_clip,
        importance=importance,
        use_kl_loss=bool(get("use_kl_loss", False)),
        kl_loss_coef=float(get("kl_loss_coef", 0.0) or 0.0),
        entropy_coef=float(get("entropy_loss_coef", 0.0) or 0.0),
        rl_loss_coef=1.0 if agentic else float(get("rl_loss_coef", 1.0)),
        weighted=not agentic,
        norm_width=int(seq_len) - 1 if seq_len else None,
        correction=None if recompute else correction(get("train_infer_correction", None)),
    )


def correction(config: Any) -> Correction:
    """ROLL's ``train_infer_correction`` (object or mapping; None: ROLL's defaults, off)."""
    if config is None:
        return Correction()
    get = _getter(config)
    weight = get("is_weight", None)
    wget = _getter(weight) if weight is not None else (lambda key, default: default)
    filters = list(get("filters", None) or ())
    enabled: list[Filter] = []
    for f in filters:
        fget = _getter(f)
        if not fget("enabled", False):
            continue
        enabled.append(
            Filter(
                agg=str(fget("agg_type", "token")),
                ratio=(float(fget("ratio_low", 0.0)), float(fget("ratio_high", 0.0)))
                if fget("ratio_enabled", False)
                else None,
                diff=(float(fget("diff_low", 0.0)), float(fget("diff_high", 0.0)))
                if fget("diff_enabled", False)
                else None,
            )
        )
    upper = wget("upper_bound", None)
    return Correction(
        is_weight=bool(wget("enabled", False)),
        weight_type=str(wget("weight_type", "token")),
        upper_bound=None if upper is None else float(upper),
        filters=tuple(enabled),
        has_filters=bool(filters),
    )


def critic_settings(config: Any) -> CriticSettings:
    value_clip = _getter(config)("value_clip", None)
    return CriticSettings(value_clip=None if value_clip is None else float(value_clip))


def _getter(config: Any) -> Any:
    if isinstance(config, Mapping):
        return lambda key, default: config.get(key, default)
    return lambda key, default: getattr(config, key, default)
