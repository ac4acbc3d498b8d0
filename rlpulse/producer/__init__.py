"""rlpulse producer: log metrics from training workers without blocking or raising.

>>> from rlpulse.producer import Producer, Masked, Weighted, Fraction, Samples
>>> from rlpulse.producer import NullProducer, load_curve  # metrics off; CurveZMQ keys from files
>>> from rlpulse.producer import ProducerConfig  # buffers, timings, bounds
"""

from rlpulse.producer.client import Producer
from rlpulse.producer.config import ProducerConfig
from rlpulse.producer.env import ADDRESS_VAR
from rlpulse.producer.null import NullProducer
from rlpulse.producer.values import Fraction, Masked, Samples, Weighted
from rlpulse.wire.transport import load_curve

__all__ = [
    "ADDRESS_VAR",
    "Fraction",
    "Masked",
    "NullProducer",
    "Producer",
    "ProducerConfig",
    "Samples",
    "Weighted",
    "load_curve",
]
