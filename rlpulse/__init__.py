"""rlpulse: exact, non-blocking metrics for distributed RL post-training of LLMs.

One import namespace. The public API a worker needs::

    from rlpulse import Producer, Masked, Weighted, Fraction, ProducerConfig
    from rlpulse.schemas import metrics as M

and the packages beneath it: ``rlpulse.producer`` (the library in every worker),
``rlpulse.collector`` (the daemon), ``rlpulse.schemas`` (the catalog and the wire protocol),
``rlpulse.runtools`` (report, compare), ``rlpulse.trainer`` (the demo PPO/GRPO trainer) and
``rlpulse.deploy`` (Prometheus rules, Grafana dashboards, compose). The command line is
``rlpulse`` (``rlpulse --help``).

In the repository those packages are the top-level folders ``producer/``, ``collector/``...;
an installed wheel holds them inside ``rlpulse/`` (``pyproject.toml`` maps them), and from a
source checkout this package looks for them beside itself.
"""

from __future__ import annotations

from pathlib import Path as _Path

if not (_Path(__file__).parent / "producer").is_dir():  # a source checkout, not a wheel
    __path__.append(str(_Path(__file__).resolve().parent.parent))

from rlpulse.producer import Fraction, Masked, NullProducer, Producer, Weighted
from rlpulse.producer.config import ProducerConfig

__all__ = ["Fraction", "Masked", "NullProducer", "Producer", "ProducerConfig", "Weighted"]
