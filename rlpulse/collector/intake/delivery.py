"""Exactly-once application of each producer's data messages, and the acknowledgements.

Producers number their data messages (``metrics``, ``done``, ``bye``) 1, 2, 3... and resend
what the collector asks for. The collector applies message ``n`` of a producer only right after
``n - 1``: a repeat (``<= n - 1``) is a duplicate, re-acknowledged and dropped; a gap (a
message lost before later ones arrived) is dropped unacknowledged, and the producer is asked
to resend from the gap (``resend``), as it is when a heartbeat says it sent more than was
applied (a heartbeat's ``seq`` is one past the highest number its producer sent). Every
acknowledgement says the collector asks (``asks``), so producers never resend on a timer. A producer's ``hello`` says where its numbering
starts (its oldest unacknowledged message), so a collector without saved state picks up any
producer mid-stream. Messages from a producer not registered yet are held, bounded, until its
hello arrives. Every hello is acknowledged (with the producer's last applied number), so a
producer knows it is registered and stops repeating its hello.

A data message the receiver rejected but could still place (a ``protocol.Rejected``) takes
its number like any other, so the messages after it are not a gap forever; nothing of it is
applied, and its entries are counted in the producer's acknowledgements (``rejected``). A
hello's number is never behind what its producer knows was acknowledged: a collector that
restarted without the rejection (acknowledged, never in its write-ahead log) catches up there.

Flow control: a producer ahead of its run's ``max_open_steps`` window is held back. Its
refused message and the ones it sent after it are parked here (bounded, with the unregistered
producers' messages), it is told to hold, and once its run has room again (``release``) they
are applied in order and it is told to go on: ``go``, sending what it has not sent yet, or
``resend``, everything unacknowledged, when the bound made us drop some of what it sent.
Dropped instead, each release would have had the producer send its whole backlog again for
one window's room: 2,000 ``log()`` calls became about 13,000 messages when a run's first steps
waited ``settle_s`` for its other roles. A held-back producer whose goodbye is parked is
closing: its parked messages are released without waiting for room, admitted up to the run's
hard bound (``admit(msg, closing=True)``), so they are applied, made durable and acknowledged
while its ``close()`` still waits (a rank that finished far ahead lost everything it had not
had acknowledged when its close gave up).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Protocol

from rlpulse.collector.health import Health
from rlpulse.collector.intake.acktimes import AckTimes
from rlpulse.collector.ratelog import RateLimitedLog
from rlpulse.schemas import protocol

log = logging.getLogger("rlpulse.collector")
HELLOS = (protocol.Hello, protocol.RelayHello)
"""Registrations: a producer's, or a relay's (a relay is one producer to the collector above)."""
MAX_HELD = 10_000
"""Messages kept for producers whose hello has not arrived yet, and parked for held-back
producers (more are dropped, resent)."""
ACK_DELAY_S = 0.5
"""How late data may be acknowledged: acknowledgements are cumulative, so a producer gets at
most one per interval, not one per message (a send per message was most of the collector's
cost at training pace). Registrations, goodbyes, repeats, relays' deltas and producers
waiting in ``flush()``/``close()`` (a heartbeat with ``flush``) are acknowledged at once.
Well below the producers' ``resend_s``."""
URGENT = (protocol.Bye, protocol.Delta, protocol.Rejected)
"""Data messages acknowledged at once: a goodbye (``close()`` waits), a relay's delta (the
relay sends the next only then), a rejection (the producer counts it)."""
ASK_AGAIN_S = 5.0
"""A producer asked to resend from a number is not asked again for the same number sooner
(what it resent is on its way behind the messages and heartbeats that showed the gap)."""
MAX_HELD_BYTES = 64 * 1024 * 1024
"""Bytes kept for producers whose hello has not arrived yet and parked for held-back ones:
the bound that matters when their messages are large (60 messages of 8 MiB would be half a
gigabyte)."""
SEQUENCED = (*protocol.RELIABLE, protocol.Rejected)
"""What takes a number in a producer's sequence: data messages, and the rejected ones."""
Incoming = protocol.Message | protocol.Rejected


class Admit(Protocol):
    """Whether a data message may be applied now (``Aggregator.admits``); ``closing``: its
    producer has said goodbye, so only the run's hard bound holds it back."""

    def __call__(self, msg: protocol.Message, closing: bool = False) -> bool: ...


class Delivery:
    """Sequencing state per producer id. ``accept`` returns the messages to apply, in order."""

    def __init__(
        self,
        health: Health | None = None,
        max_held: int = MAX_HELD,
        max_held_bytes: int = MAX_HELD_BYTES,
        clock: Callable[[], float] = time.monotonic,
        ack_delay_s: float = ACK_DELAY_S,
        ask_again_s: float = ASK_AGAIN_S,
    ) -> None:
        self.health = health or Health()
        self.ask_again_s = ask_again_s
        self._asked: dict[int, tuple[int, float]] = {}
        """Per producer asked to resend: after which number, and when."""
        self._asking: set[int] = set()
        """Producers to ask for a resend at the next :meth:`acks`, unless filled by then."""
        self._received: dict[int, int] = {}
        """Per producer, the highest number that reached us (applied, parked or dropped)."""
        self.clock = clock
        self.ack_delay_s = ack_delay_s
        self.max_held = max_held
        self.max_held_bytes = max_held_bytes
        self._held_bytes = 0
        self._held_back: set[int] = set()
        """Producers whose next message waits for room in their run (``admit`` said no)."""
        self._tell_hold: set[int] = set()
        """Held-back producers not yet told to stop sending."""
        self._wake: dict[int, bool] = {}
        """Producers released since the last acknowledgements, to be told to go on: to
        resend (True: some of what they sent while held was dropped) or to send what they
        have not sent yet (False)."""
        self._closing: set[int] = set()
        """Held-back producers whose goodbye is parked: released without waiting for room."""
        self._overflowed: set[int] = set()
        """Held-back producers some of whose messages did not fit where they are parked."""
        self._parked: dict[int, dict[int, tuple[Incoming, bytes]]] = {}
        """Per held-back producer, its messages from the refused one on, by number."""
        self.last_seq: dict[int, int] = {}
        self.identity: dict[int, bytes] = {}
        self._held: dict[int, list[tuple[Incoming, bytes]]] = {}
        self._held_count = 0
        self._owed = AckTimes(clock, ack_delay_s)
        """Who is owed an acknowledgement at the next :meth:`acks`, and by when."""
        self.rejected: dict[int, int] = {}
        """Per producer, entries of its messages that were rejected (told in its acks)."""
        self._ratelog = RateLimitedLog(log)

    def accept(
        self,
        msg: Incoming,
        identity: bytes,
        raw: bytes = b"",
        admit: Admit | None = None,
    ) -> list[tuple[protocol.Message, bytes]]:
        """The messages to apply now, each with its raw bytes (for the write-ahead log).
        ``admit`` (``Aggregator.admits``) may hold a data message back: it is then neither
        applied nor acknowledged, nor is anything after it, until :meth:`acks` asks its
        producer to resend (flow control: a producer ahead of the others waits)."""
        pid = msg.producer
        if isinstance(msg, HELLOS):
            self.identity[pid] = identity
            self._owed.now(pid)
            out: list[tuple[protocol.Message, bytes]] = [(msg, raw)]
            if pid not in self.last_seq:
                self.last_seq[pid] = msg.seq - 1
                held = self._held.pop(pid, [])
                self._held_count -= len(held)
                self._held_bytes -= sum(len(r) for _, r in held)
                for m, r in held:
                    out += self._sequenced(m, r, admit)
            elif msg.seq - 1 > self.last_seq[pid]:  # acknowledged, but not remembered
                self.last_seq[pid] = msg.seq - 1
            return out
        if pid not in self.last_seq:
            self._hold(msg, raw)
            return []
        self.identity[pid] = identity
        if isinstance(msg, SEQUENCED):
            return self._sequenced(msg, raw, admit)
        if type(msg) is protocol.Heartbeat:
            if msg.flush:
                self._owed.now(pid)
            # It sent more than ever reached us: lost on the way. Asked for an ack (its
            # acknowledgements stall), more than we applied: what we dropped, or our ask, lost.
            have = self.last_seq[pid] if msg.flush else self._received.get(pid, 0)
            if msg.seq - 1 > max(have, self.last_seq[pid]) and pid not in self._held_back:
                self._ask_resend(pid)
        return [(msg, raw)]

    def _ask_resend(self, pid: int) -> None:
        """Ask producer ``pid`` for everything after its last applied message, unless it was
        asked for the same within ``ask_again_s``."""
        last, now = self.last_seq[pid], self.clock()
        asked = self._asked.get(pid)
        if asked is not None and asked[0] == last and now - asked[1] < self.ask_again_s:
            return
        self._asked[pid] = (last, now)
        self._asking.add(pid)

    def _room(self, nbytes: int) -> bool:
        """Whether one more message of ``nbytes`` fits in what is kept for unregistered and
        held-back producers."""
        return self._held_count < self.max_held and self._held_bytes + nbytes <= self.max_held_bytes

    def screen(self, producer: int, nbytes: int) -> bool:
        """Whether a data message of ``nbytes`` from ``producer`` is worth decoding: always
        for a registered producer; for one not registered yet only if :meth:`_hold` would
        keep it. Otherwise it is counted and dropped as there, before it is decoded, so a
        flood of large messages from producers that never register goes as fast as it comes
        instead of queueing in ZeroMQ (``rlpulse.collector.intake.receiver``)."""
        if producer in self.last_seq or self._room(nbytes):
            return True
        self._drop_unknown(producer)
        return False

    def _drop_unknown(self, producer: int) -> None:
        self.health.unknown_producer += 1
        self._ratelog.warn(
            "unknown",
            f"dropping messages from unregistered producer {producer:x} (it will resend them)",
        )

    def _hold(self, msg: Incoming, raw: bytes) -> None:
        if not isinstance(msg, SEQUENCED):
            return  # heartbeats of an unknown producer carry nothing to keep
        if not self._room(len(raw)):
            self._drop_unknown(msg.producer)
            return
        self._held.setdefault(msg.producer, []).append((msg, raw))
        self._held_count += 1
        self._held_bytes += len(raw)

    def _park(self, msg: Incoming, raw: bytes) -> None:
        """Keep a held-back producer's message until its run has room (a repeat of one
        already kept is dropped; past the bound, it is dropped as out of order and the
        producer resends it once released)."""
        parked = self._parked.setdefault(msg.producer, {})
        if msg.seq in parked:
            return
        if type(msg) is protocol.Bye:  # kept past the bound: it says the producer is closing
            self._closing.add(msg.producer)
            parked[msg.seq] = (msg, raw)
            self._held_count += 1
            self._held_bytes += len(raw)
            return
        if not self._room(len(raw)):
            self.health.out_of_order += 1
            self._overflowed.add(msg.producer)
            return
        parked[msg.seq] = (msg, raw)
        self._held_count += 1
        self._held_bytes += len(raw)

    def _unpark(self, pid: int) -> bool:
        """Forget what is parked for ``pid`` (its producer sends it again); whether anything
        was (or was dropped)."""
        dropped = pid in self._overflowed
        self._overflowed.discard(pid)
        self._closing.discard(pid)
        for _, raw in self._parked.pop(pid, {}).values():
            self._held_count -= 1
            self._held_bytes -= len(raw)
            dropped = True
        return dropped

    def _sequenced(
        self,
        msg: Incoming,
        raw: bytes,
        admit: Admit | None = None,
    ) -> list[tuple[protocol.Message, bytes]]:
        pid = msg.producer
        last = self.last_seq[pid]
        if msg.seq > self._received.get(pid, 0):
            self._received[pid] = msg.seq
        if msg.seq <= last:
            self.health.duplicates += 1
            self._owed.now(pid)  # a resend: it waits for this
            return []
        if msg.seq > last + 1:
            if pid in self._held_back:  # behind a held-back message: parked with it
                self._park(msg, raw)
            else:
                self.health.out_of_order += 1
                self._ask_resend(pid)
            return []
        if admit is not None and not isinstance(msg, protocol.Rejected) and not admit(msg):
            if pid not in self._held_back:
                self._held_back.add(pid)
                self._tell_hold.add(pid)
                self.health.held_back += 1
            self._park(msg, raw)
            return []
        if pid in self._held_back:  # it sent again before we asked, and there is room
            self._held_back.discard(pid)
            self._tell_hold.discard(pid)
            self._unpark(pid)
        return self._apply(msg, raw)

    def _apply(self, msg: Incoming, raw: bytes) -> list[tuple[protocol.Message, bytes]]:
        """``msg`` is next in its producer's sequence and admitted: take its number."""
        pid = msg.producer
        self.last_seq[pid] = msg.seq
        if isinstance(msg, URGENT):
            self._owed.now(pid)
        else:
            self._owed.later(pid)
        if isinstance(msg, protocol.Rejected):  # its number is used up; nothing to apply
            self.rejected[pid] = self.rejected.get(pid, 0) + msg.entries
            return []
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

    def release(
        self, has_room: Callable[[int], bool], admit: Admit
    ) -> Iterator[tuple[protocol.Message, bytes]]:
        """The parked messages to apply now, in order: those of held-back producers whose
        run has room again (``Aggregator.has_room``), or that are closing, up to the first
        ``admit`` refuses. Apply each before taking the next (``admit`` must see it). A
        producer whose parked messages all went in is told to go on by its next
        acknowledgement; one refused again stays held back, its rest parked."""
        for pid in [p for p in self._held_back if p in self._closing or has_room(p)]:
            parked = self._parked.get(pid, {})
            closing = pid in self._closing
            while (item := parked.get(self.last_seq[pid] + 1)) is not None:
                msg, raw = item
                if not isinstance(msg, protocol.Rejected) and not (
                    admit(msg, closing=True) if closing else admit(msg)
                ):
                    break
                del parked[msg.seq]
                self._held_count -= 1
                self._held_bytes -= len(raw)
                yield from self._apply(msg, raw)
            else:  # all in, or a gap (dropped past the bound): the producer resends the rest
                self._held_back.discard(pid)
                self._wake[pid] = self._unpark(pid)
                if self._wake[pid]:  # asked to resend: not again for the same soon
                    self._asked[pid] = (self.last_seq[pid], self.clock())

    def acks(
        self,
        feedback: Callable[[int], tuple[int, int, str, int, list[tuple[int, int]]]] | None = None,
        everything: bool = False,
        stopping: bool = False,
    ) -> list[tuple[bytes, bytes]]:
        """(identity, ack message) for every producer whose acknowledgement is due (all of
        them with ``everything``: at shutdown). Call only once what they acknowledge is in
        the write-ahead log. ``stopping``: the last acknowledgements, to every producer known,
        saying nothing after them was or will be applied (``Ack.stopping``). ``feedback`` gives what each ack also tells its producer: its
        entries left out as late and as conflicts, and the run it is recorded under
        (``Aggregator.feedback``). Producers released since the last call (:meth:`release`)
        are told to go on; those newly held back, to hold."""
        wake, self._wake = self._wake, {}
        for pid in self._asking:  # a gap not filled meanwhile (by what was on its way)
            if self._asked[pid][0] == self.last_seq.get(pid):
                wake.setdefault(pid, True)
        self._asking.clear()
        hold, self._tell_hold = self._tell_hold - wake.keys(), set()
        due = self._owed.due(everything)
        if stopping:
            due += self.identity.keys()
        out = []
        for pid in {*due, *wake, *hold}:
            identity = self.identity.get(pid)
            if identity is not None:
                late, conflict, run, names, members = (
                    feedback(pid) if feedback is not None else (0, 0, "", 0, [])
                )
                rejected = self.rejected.get(pid, 0)
                ack = protocol.encode_ack(
                    pid,
                    self.last_seq[pid],
                    late,
                    conflict,
                    run,
                    rejected,
                    resend=wake.get(pid) is True,
                    hold=pid in hold,
                    go=wake.get(pid) is False,
                    asks=True,
                    names=names,
                    members=members,
                    stopping=stopping,
                )
                out.append((identity, ack))
        return out

    def forget(self, pids: list[int]) -> None:
        """Producers forgotten (their run ended long ago, ``runs.retention``): their numbering
        goes; one that comes back starts again from its hello."""
        for pid in pids:
            self._unpark(pid)
            for kept in (self.last_seq, self.identity, self._received, self.rejected, self._asked):
                kept.pop(pid, None)
            for flags in (self._held_back, self._tell_hold, self._asking):
                flags.discard(pid)
            self._wake.pop(pid, None)
            self._owed.forget(pid)

    def snapshot(self) -> dict[str, int]:
        return {str(pid): seq for pid, seq in self.last_seq.items()}

    def restore(self, snapshot: Mapping[str, int]) -> None:
        self.last_seq.update({int(pid): int(seq) for pid, seq in snapshot.items()})
