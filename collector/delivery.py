"""Exactly-once application of each producer's data messages, and the acknowledgements.

Producers number their data messages (``metrics``, ``done``, ``bye``) 1, 2, 3... and resend
whatever is unacknowledged. The collector applies message ``n`` of a producer only right after
``n - 1``: a repeat (``<= n - 1``) is a duplicate, re-acknowledged and dropped; a gap (a
message lost in a broken connection before later ones arrived) is dropped unacknowledged, and
the producer's resend fills it in order. A producer's ``hello`` says where its numbering
starts (its oldest unacknowledged message), so a collector without saved state picks up any
producer mid-stream. Messages from a producer not registered yet are held, bounded, until its
hello arrives. Every hello is acknowledged (with the producer's last applied number), so a
producer knows it is registered and stops repeating its hello.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from collector.health import Health
from collector.ratelog import RateLimitedLog
from schemas import protocol

log = logging.getLogger("rlpulse.collector")
HELLOS = (protocol.Hello, protocol.RelayHello)
"""Registrations: a producer's, or a relay's (a relay is one producer to the collector above)."""
MAX_HELD = 10_000
"""Messages kept for producers whose hello has not arrived yet (more are dropped, resent)."""


class Delivery:
    """Sequencing state per producer id. ``accept`` returns the messages to apply, in order."""

    def __init__(self, health: Health | None = None, max_held: int = MAX_HELD) -> None:
        self.health = health or Health()
        self.max_held = max_held
        self.last_seq: dict[int, int] = {}
        self.identity: dict[int, bytes] = {}
        self._held: dict[int, list[tuple[protocol.Message, bytes]]] = {}
        self._held_count = 0
        self._to_ack: set[int] = set()
        self._ratelog = RateLimitedLog(log)

    def accept(
        self, msg: protocol.Message, identity: bytes, raw: bytes = b""
    ) -> list[tuple[protocol.Message, bytes]]:
        """The messages to apply now, each with its raw bytes (for the write-ahead log)."""
        pid = msg.producer
        if isinstance(msg, HELLOS):
            self.identity[pid] = identity
            self._to_ack.add(pid)
            out = [(msg, raw)]
            if pid not in self.last_seq:
                self.last_seq[pid] = msg.seq - 1
                held = self._held.pop(pid, [])
                self._held_count -= len(held)
                for m, r in held:
                    out += self._sequenced(m, r)
            return out
        if pid not in self.last_seq:
            self._hold(msg, raw)
            return []
        self.identity[pid] = identity
        if isinstance(msg, protocol.RELIABLE):
            return self._sequenced(msg, raw)
        return [(msg, raw)]

    def _hold(self, msg: protocol.Message, raw: bytes) -> None:
        if not isinstance(msg, protocol.RELIABLE):
            return  # heartbeats of an unknown producer carry nothing to keep
        if self._held_count >= self.max_held:
            self.health.unknown_producer += 1
            self._ratelog.warn(
                "unknown",
                f"dropping messages from unregistered producer {msg.producer:x} (it will resend them)",
            )
            return
        self._held.setdefault(msg.producer, []).append((msg, raw))
        self._held_count += 1

    def _sequenced(self, msg: protocol.Message, raw: bytes) -> list[tuple[protocol.Message, bytes]]:
        pid = msg.producer
        last = self.last_seq[pid]
        if msg.seq <= last:
            self.health.duplicates += 1
            self._to_ack.add(pid)
            return []
        if msg.seq > last + 1:
            self.health.out_of_order += 1
            return []
        self.last_seq[pid] = msg.seq
        self._to_ack.add(pid)
        return [(msg, raw)]

    def unapplied(self) -> int:
        """``log()`` entries held for producers that never registered: at shutdown they are
        lost, and the daemon counts them."""
        return sum(
            len(m.entries)
            for held in self._held.values()
            for m, _ in held
            if isinstance(m, protocol.Metrics)
        )

    def note_replayed(self, msg: protocol.Message) -> None:
        """Recovery: a message read back from the write-ahead log was applied once already."""
        if isinstance(msg, protocol.RELIABLE):
            self.last_seq[msg.producer] = max(self.last_seq.get(msg.producer, 0), msg.seq)
        elif isinstance(msg, HELLOS) and msg.producer not in self.last_seq:
            self.last_seq[msg.producer] = msg.seq - 1

    def acks(self) -> list[tuple[bytes, bytes]]:
        """(identity, ack message) for every producer with newly applied or repeated data.
        Call only once what they acknowledge is in the write-ahead log."""
        out = []
        for pid in self._to_ack:
            identity = self.identity.get(pid)
            if identity is not None:
                out.append((identity, protocol.encode_ack(pid, self.last_seq[pid])))
        self._to_ack.clear()
        return out

    def snapshot(self) -> dict[str, int]:
        return {str(pid): seq for pid, seq in self.last_seq.items()}

    def restore(self, snapshot: Mapping[str, int]) -> None:
        self.last_seq.update({int(pid): int(seq) for pid, seq in snapshot.items()})
