"""The messages of the wire protocol as the decoder returns them, the producer counters they
carry, and the decoder's limits. Encoding and decoding are ``schemas.protocol``'s.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

STAT_KEYS = (
    "logged",
    "sent_messages",
    "resent_messages",
    "unacked",
    "dropped_queue_full",
    "dropped_buffer_full",
    "dropped_send",
    "invalid",
    "nonfinite",
    "errors",
)
"""Producer counters carried by heartbeats and the goodbye (see ``producer.stats()``)."""
DROP_KEYS = ("dropped_queue_full", "dropped_buffer_full", "dropped_send")
"""The counters of ``log()`` calls a producer dropped: its queue full, its unacknowledged
buffer full, or still unacknowledged when it closed."""


@dataclass(frozen=True)
class Limits:
    """Bounds the decoder enforces on one message."""

    max_bytes: int = 8 * 1024 * 1024
    max_entries: int = 4096
    max_names: int = 10_000
    max_name_length: int = 256
    max_label_length: int = 128


@dataclass(frozen=True, slots=True)
class Hello:
    """Registration. ``seq`` is the producer's oldest unacknowledged sequence number: every
    reliable message below it has been acknowledged."""

    producer: int
    seq: int
    run: str
    role: str
    rank: int
    world_size: int
    host: str
    pid: int
    expected: Mapping[str, int] = field(default_factory=dict)
    """The run's whole topology, role -> world size, when the producer knows it: the
    collector then waits for roles that have not registered yet."""


@dataclass(frozen=True, slots=True)
class Entry:
    """One ``log()`` call: its step, wall-clock time and the states of its metrics."""

    step: int
    time: float
    names: tuple[str, ...]
    kinds: bytes
    values: np.ndarray
    """float64, shape (len(names), 4): sum, weight, min, max per name."""
    nonfinite: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Metrics:
    producer: int
    seq: int
    entries: tuple[Entry, ...]


@dataclass(frozen=True, slots=True)
class Done:
    """The producer has finished every step up to and including ``step``."""

    producer: int
    seq: int
    step: int


@dataclass(frozen=True, slots=True)
class Heartbeat:
    producer: int
    seq: int
    stats: Mapping[str, int]


@dataclass(frozen=True, slots=True)
class Bye:
    """The producer is closing: it has finished every step it will log."""

    producer: int
    seq: int
    stats: Mapping[str, int]


@dataclass(frozen=True, slots=True)
class Ack:
    """Collector to producer: every reliable message up to ``seq`` is durably accepted."""

    producer: int
    seq: int


Message = Hello | Metrics | Done | Heartbeat | Bye | Ack
RELIABLE = (Metrics, Done, Bye)
"""Messages that carry data: sequenced, acknowledged, resent until acknowledged."""


DEFAULT_LIMITS = Limits()
"""The decoder's bounds unless a collector configures its own (``collector.config``)."""
