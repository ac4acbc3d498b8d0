"""The collector's own counters: what it received, rejected, emitted and dropped.

Written by the daemon's main thread; read by any thread through :meth:`Health.snapshot`
(the Prometheus sink renders it on every scrape).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any


class Health:
    """Counters of the receive and aggregate path. ``sinks`` is filled in by the fan-out.

    >>> h = Health()
    >>> h.reject("bad_version")
    >>> h.snapshot()["malformed"]
    {'bad_version': 1}
    """

    def __init__(self) -> None:
        self.messages_received = 0
        self.events_received = 0
        self.malformed: Counter[str] = Counter()
        self.late = 0
        self.partial_steps = 0
        self.steps_emitted = 0
        self.unknown_producer = 0
        self.duplicates = 0
        self.out_of_order = 0
        self.handshake_failed = 0
        self.kind_mismatch = 0
        self.derived_logged = 0
        self.names_overflow = 0
        self.world_size_conflict = 0
        self.unapplied = 0
        """Entries held for a producer that never registered, lost at shutdown."""
        self.producers = 0
        self.producer_stats: dict[int, Mapping[str, int]] = {}
        self.sinks: Callable[[], Mapping[str, Mapping[str, float]]] = dict

    def reject(self, reason: str) -> None:
        self.malformed[reason] += 1

    def producer_dropped(self) -> int:
        """Log calls producers reported dropping (queue or buffer full, unacknowledged at close)."""
        keys = ("dropped_queue_full", "dropped_buffer_full", "dropped_send")
        return sum(s.get(k, 0) for s in list(self.producer_stats.values()) for k in keys)

    def snapshot(self) -> dict[str, Any]:
        return {
            "messages_received": self.messages_received,
            "events_received": self.events_received,
            "malformed": dict(self.malformed),
            "late": self.late,
            "partial_steps": self.partial_steps,
            "steps_emitted": self.steps_emitted,
            "unknown_producer": self.unknown_producer,
            "duplicates": self.duplicates,
            "out_of_order": self.out_of_order,
            "handshake_failed": self.handshake_failed,
            "kind_mismatch": self.kind_mismatch,
            "derived_logged": self.derived_logged,
            "names_overflow": self.names_overflow,
            "world_size_conflict": self.world_size_conflict,
            "unapplied": self.unapplied,
            "producers": self.producers,
            "producer_dropped": self.producer_dropped(),
            "sinks": {k: dict(v) for k, v in self.sinks().items()},
        }
