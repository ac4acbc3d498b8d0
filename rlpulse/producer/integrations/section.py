"""The fields every integration's settings section shares (verl's ``rlpulse.trainer.rlpulse``,
ROLL's ``tracker_kwargs``), read and checked once: each error names ``{section}.{field}``.

>>> worker_side({"worker_side": ["actor/pg_loss"]}, "s")
('actor/pg_loss',)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rlpulse.producer.config import ProducerConfig
from rlpulse.schemas.errors import ConfigError


def worker_side(section: Mapping[str, Any], prefix: str) -> tuple[str, ...]:
    """``worker_side``: metric names the workers log exactly (none when absent)."""
    names = section.get("worker_side") or ()
    if isinstance(names, str) or not all(isinstance(n, str) for n in names):
        raise ConfigError(f"{prefix}.worker_side", "must be a list of metric names", names)
    return tuple(names)


def config_dir(section: Mapping[str, Any], prefix: str, default: str | None) -> str | None:
    """``config_dir``: a path, or None."""
    value = section.get("config_dir", default)
    if value is not None and not isinstance(value, str):
        raise ConfigError(f"{prefix}.config_dir", "must be a path or null", value)
    return value


def producer_config(section: Mapping[str, Any], prefix: str) -> ProducerConfig:
    """``producer``: the producers' :class:`ProducerConfig`, its errors under ``prefix``."""
    producer = section.get("producer") or {}
    try:
        return ProducerConfig(**dict(producer))
    except ConfigError as exc:
        raise ConfigError(f"{prefix}.producer.{exc.field}", exc.problem, exc.value) from None
    except TypeError as exc:  # an unknown field
        raise ConfigError(f"{prefix}.producer", str(exc), dict(producer)) from None
