"""rlpulse producer: log metrics from training workers without blocking or raising.

>>> from producer import Producer, Masked, Weighted, Fraction
>>> from producer import NullProducer, load_curve  # metrics off; CurveZMQ keys from files
>>> from producer import ProducerConfig  # buffers, timings, bounds
"""

from producer.client import Producer
from producer.config import ProducerConfig
from producer.env import ADDRESS_VAR, load_curve
from producer.null import NullProducer
from producer.values import Fraction, Masked, Weighted

__all__ = [
    "ADDRESS_VAR",
    "Fraction",
    "Masked",
    "NullProducer",
    "Producer",
    "ProducerConfig",
    "Weighted",
    "load_curve",
]
