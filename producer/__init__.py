"""rlpulse producer: log metrics from training workers without blocking or raising.

>>> from producer import Producer, Masked, Weighted, Fraction
"""

from producer.client import Producer
from producer.env import ADDRESS_VAR
from producer.null import NullProducer
from producer.values import Fraction, Masked, Weighted

__all__ = ["ADDRESS_VAR", "Fraction", "Masked", "NullProducer", "Producer", "Weighted"]
