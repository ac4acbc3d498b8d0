"""rlpulse: exact, non-blocking metrics for distributed RL post-training of LLMs.

One import namespace. The public API a worker needs::

    from rlpulse import Producer, Masked, Weighted, Fraction, Samples, ProducerConfig
    from rlpulse.schemas import metrics as M

and the packages beneath it: ``rlpulse.producer`` (the library in every worker),
``rlpulse.collector`` (the daemon), ``rlpulse.schemas`` (the catalog and the wire protocol),
``rlpulse.wire`` (transports), ``rlpulse.runtools`` (report, compare), ``rlpulse.trainer``
(the demo PPO/GRPO trainer) and ``rlpulse.deploy`` (Prometheus rules, Grafana dashboards,
compose). The command line is ``rlpulse`` (``rlpulse --help``).

The packages live here, in ``rlpulse/``, as the wheel holds them, so a static reader (mypy,
an IDE, an import-graph tool) resolves every ``rlpulse.*`` import in a plain checkout; the
repository's top-level ``producer/``, ``collector/``... are relative symlinks to them.

The root is lazy (PEP 562): ``import rlpulse.schemas`` or ``import rlpulse.collector`` loads
no producer code; the names below are imported on first use.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rlpulse.producer import Fraction, Masked, NullProducer, Producer, Samples, Weighted
    from rlpulse.producer.config import ProducerConfig

# Public name -> the module that owns it.
_EXPORTS = {
    "Fraction": "rlpulse.producer.values",
    "Masked": "rlpulse.producer.values",
    "NullProducer": "rlpulse.producer",
    "Producer": "rlpulse.producer",
    "ProducerConfig": "rlpulse.producer.config",
    "Samples": "rlpulse.producer.values",
    "Weighted": "rlpulse.producer.values",
}

__all__ = [
    "Fraction",
    "Masked",
    "NullProducer",
    "Producer",
    "ProducerConfig",
    "Samples",
    "Weighted",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'rlpulse' has no attribute {name!r}")
    value = getattr(import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})
