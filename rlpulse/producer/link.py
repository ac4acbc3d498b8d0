"""The producer's link to its collector: one :class:`Session` over the transport, the
registration and the outbox, driven by the sender thread (``rlpulse.producer.sender``).

It owns the link protocol: on (re)connect say hello and resend what the collector lacks
(:meth:`Session.watch`); send the hello again when due (:meth:`Session.register`); send unsent
messages in order (:meth:`Session.pump`); read acknowledgements and what they say: flow
control, resends asked for, what the collector left out (:meth:`Session.read_acks`);
heartbeats, and asking for an acknowledgement while a flush or close waits. Numbering,
acknowledgements and resends are :class:`~rlpulse.producer.outbox.Outbox`'s; bytes go through
a :class:`~rlpulse.wire.transport.Transport`. Only the sender thread calls it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from rlpulse.producer.outbox import Outbox, Registration
from rlpulse.producer.pending import IncompleteSteps
from rlpulse.producer.stats import Counters
from rlpulse.schemas import protocol
from rlpulse.schemas.errors import SchemaError
from rlpulse.schemas.messages import TableDecl
from rlpulse.wire.transport import Link, Rejected, Transport, TransportError

log = logging.getLogger("rlpulse.producer")

SILENT_WARN_S = 5.0
"""A producer no collector has answered (any ack, a hello's included) this long after it
started warns once, naming its address: a wrong address is otherwise silent until
``close()`` drops what was logged."""
ASK_ACK_S = 0.05
"""While a ``flush()`` or ``close()`` waits, how often to ask the collector to acknowledge at
once (it otherwise may wait ``collector.delivery.ACK_DELAY_S``)."""


class Session:
    """The link to the collector, as the sender thread sees it.

    >>> # session = Session(transport=t, registration=r, outbox=o, counters=c, ...)
    >>> # session.watch(); session.read_acks(); session.register(); session.pump()
    """

    def __init__(
        self,
        *,
        transport: Transport,
        registration: Registration,
        outbox: Outbox,
        counters: Counters,
        tables: Callable[[], list[TableDecl]],
        stats: Callable[[], dict[str, int]],
        warn_once: Callable[[str, str], None],
        stopping: threading.Event,
        resend_s: float,
        max_unacked: int,
        address: str = "",
    ) -> None:
        self.transport = transport
        self.registration = registration
        self.producer_id = registration.producer_id
        self.outbox = outbox
        self.counters = counters
        self.tables = tables
        """The name tables declared so far (what the hello says)."""
        self.stats = stats
        self.warn_once = warn_once
        self.stopping = stopping
        """Set once the producer closes: the collector may no longer hold us back."""
        self.resend_s = resend_s
        self.max_unacked = max_unacked
        self.address = address
        """Where the transport connects (named in warnings)."""
        self.connected = self.ever_connected = self.refused = False
        self.rejected = ""
        """Why a collector refused our handshake (it answered: not a wrong address), until a
        connection succeeds."""
        self.silent_since: float | None = time.monotonic()
        """When this producer started, until a collector first answers (then None)."""
        self.recorded_run = ""
        """The run the collector records us under, when it says it is not ours (an attempt)."""
        self.held = False
        """The collector holds us back (flow control) and has not let us go on since."""
        self.resync = False
        """Reconnected with messages sent before: nothing goes out until the collector's first
        answer says what it has (:meth:`_resend` from there)."""
        self._resent: int | None = None
        self._resent_at = 0.0
        """The last resend: after which number, and when."""
        self._told = dict.fromkeys(protocol.COLLECTOR_DROP_KEYS, 0)
        """The collector's cumulative counts of our entries it left out, as last told."""
        self._next_ask = 0.0

    def watch(self, wait_s: float = 0.0) -> None:
        """Apply connection events; on (re)connect say hello and resend everything unacked.
        With ``wait_s``, wait that long for a connection, unless one is refused (nobody
        listening) or rejected (a collector refused the handshake) first."""
        deadline = time.monotonic() + wait_s
        while True:
            left = deadline - time.monotonic()
            waiting = (
                wait_s > 0 and left > 0 and not (self.connected or self.refused or self.rejected)
            )
            events = self.transport.events(left if waiting else 0.0)
            for event in events:
                if isinstance(event, Rejected):
                    self._rejected(event)
                    continue
                if event is Link.REFUSED:
                    self.refused = True  # nobody listening there right now
                    continue
                was, self.connected = self.connected, event is Link.CONNECTED
                self.refused = False
                self.ever_connected |= self.connected
                if self.connected != was:
                    self.registration.reset()
                if self.connected and not was:
                    self.outbox.new_connection()
                    self.say_hello()
                    # Sent before, unacknowledged: resent once the collector's first answer
                    # says what it has (not all of it blindly: it may hold most).
                    box = self.outbox
                    self.resync = box.sent_seq > box.acked
                    self._resent = None
            if not (waiting and events):
                return  # no wait asked, or the wait ran out with nothing

    def _rejected(self, event: Rejected) -> None:
        """A collector answered and refused the handshake: say so once, and why (the silence
        warning would tell a wrong story: it is not a wrong address)."""
        self.rejected = event.why
        self.silent_since = None
        ident = self.registration.identity
        then = (
            "ZeroMQ does not try such a connection again: fix it and restart this process"
            if event.final
            else "ZeroMQ keeps trying"
        )
        self.warn_once(
            "rejected",
            f"a collector at {self.address or 'its address'} answered but refused this "
            f"producer (run {ident.run!r}): {event.why}. {then}; log() calls are kept "
            f"meanwhile, up to max_unacked={self.max_unacked} messages, and those still unsent "
            "at close() are dropped (counted in stats() as dropped_send)",
        )

    def send(self, payload: bytes) -> bool:
        try:
            sent = self.transport.send(payload)
        except TransportError as exc:
            self.counters.errors += 1
            self.warn_once("send-error", f"send failed: {exc}")
            return False
        if sent:
            self.counters.sent_messages += 1
        return sent

    def say_hello(self) -> None:
        try:
            box = self.outbox
            hello = self.registration.hello(box.base(), self.tables(), box.went_out())
        except Exception as exc:  # the encoder keeps tables encodable: a bug, counted
            self.counters.errors += 1
            self.warn_once("hello", f"could not encode the hello ({exc!r}); nothing is sent")
            return
        if self.send(hello):
            self.registration.sent_at = time.monotonic()

    def register(self) -> None:
        """Send the hello if it is due (see :class:`~rlpulse.producer.outbox.Registration`)."""
        if self.connected and self.registration.due(time.monotonic()):
            self.say_hello()

    def pump(self) -> None:
        """Send unsent messages in order until the transport refuses one. Nothing goes out
        before the hello has on this connection."""
        box = self.outbox
        while self.connected and self.registration.data_may_follow and not self.resync:
            item = box.next_unsent(time.monotonic())
            if item is None or not self.send(item.payload):
                return
            box.sent()

    def read_acks(self) -> None:
        while (payload := self.transport.receive()) is not None:
            try:
                msg = protocol.decode(payload)
            except SchemaError as exc:
                self.counters.errors += 1
                self.warn_once("bad-ack", f"unreadable reply from the collector: {exc}")
                continue
            if isinstance(msg, protocol.Ack):
                self.registration.answered = True  # any ack, a hello's answer included
                self.silent_since = None
                self.rejected = ""
                self.outbox.ack(msg.seq, time.monotonic())
                self.outbox.asking |= msg.asks
                if msg.stopping:  # its last word: what it has not acknowledged, it never will
                    self.outbox.stopping()
                if self.resync:  # a new connection's first answer: it lacks what is after it
                    self.resync = False
                    self._resend(msg.seq)
                if msg.hold and not self.stopping.is_set():
                    # Ahead of the other ranks: wait until the collector has room. Not at
                    # close: the goodbye must reach it, and it takes a closing producer's data.
                    self.held = True
                    self.outbox.hold(time.monotonic())
                if msg.resend:  # the collector lacks what is after msg.seq: it asks for it
                    self.held = False
                    self._resend(msg.seq)
                elif msg.go:  # the collector has room again, and kept all we sent
                    self.held = False
                    self.outbox.go_on(time.monotonic())
                if msg.late or msg.conflict or msg.rejected or msg.run or msg.names:
                    self._feedback(msg)

    def _resend(self, after: int) -> None:
        """Send again what is unacknowledged, everything after ``after``, unless all of it
        has just been resent (within ``resend_s``: the collector asked again, seeing a
        message or heartbeat we sent before that resend reached it)."""
        now = time.monotonic()
        recent = now - self._resent_at < self.resend_s
        if recent and self._resent is not None and after >= self._resent:
            return
        self._resent, self._resent_at = after, now
        self.counters.resent_messages += self.outbox.resend_all(now)

    def _feedback(self, ack: protocol.Ack) -> None:
        """Count what the collector says it left out, and the run it records us under."""
        ident = self.registration.identity
        for key, told in (
            ("dropped_late", ack.late),
            ("dropped_conflict", ack.conflict),
            ("dropped_rejected", ack.rejected),
            ("dropped_names", ack.names),
        ):
            last, self._told[key] = self._told[key], told
            # Less than before: a collector that restarted without its state counts afresh.
            new = told - last if told >= last else told
            if new > 0:
                setattr(self.counters, key, getattr(self.counters, key) + new)
                if key == "dropped_late":
                    why = (
                        "their step had already been emitted: a rank far behind the others, "
                        "or a run name reused with resume=True"
                    )
                elif key == "dropped_conflict":
                    why = (
                        f"another process registered as {ident.role}/{ident.rank} of this run "
                        "after this one"
                    )
                elif key == "dropped_names":
                    why = (
                        "names it does not take: beyond its run's max_names_per_run, or "
                        "computed by the collector itself (system/tps...): its log names them"
                    )
                else:
                    why = "it rejected their message as malformed: its log says why"
                self.warn_once(
                    key,
                    f"the collector left out log() calls of this producer ({why}); counted in "
                    f"stats()[{key!r}]",
                )
        if ack.run and ack.run != self.recorded_run:
            self.recorded_run = ack.run
            self.warn_once(
                "attempt",
                f"run {ident.run!r} had already ended on the collector: this process is "
                f"recorded as a new attempt, {ack.run!r} (pass resume=True, or set "
                "RLPULSE_RESUME=1, to continue the run instead)",
            )

    def enqueue(
        self, encode: Callable[[int], bytes], entries: int, bounded: bool = True, step: int = -1
    ) -> None:
        """Number and keep a message of ``entries`` ``log()`` calls (``step``: the highest
        step among them), counting it as dropped when the buffer is full."""
        try:
            added = self.outbox.add(encode, entries, bounded=bounded, step=step)
        except Exception as exc:  # a value the wire cannot carry must not end this thread
            self.counters.errors += max(entries, 1)
            self.warn_once(
                f"encode-message:{type(exc).__name__}",
                f"could not encode a message ({exc!r}); its {entries} log() calls are dropped "
                "(counted in stats() as errors)",
            )
            return
        if not added:
            self.counters.dropped_buffer_full += max(entries, 1)
            self.warn_once(
                "buffer-full",
                f"{self.outbox.unacked} messages await acknowledgement; dropping new ones "
                "(counted in stats())",
            )

    def ask_for_acks(self, now: float) -> None:
        """A flush or close waits: a heartbeat asking for the acknowledgement now."""
        box = self.outbox
        if box.unacked and self.connected and now >= self._next_ask:
            self._next_ask = now + ASK_ACK_S
            self.heartbeat(flush=True)

    def heartbeat(self, flush: bool = False) -> None:
        self.send(
            # seq: past the highest number sent, so the collector sees what it lacks; stamped
            # with our clock (that of log() times) for the collector to measure its offset
            protocol.encode_heartbeat(
                self.producer_id, self.outbox.sent_seq + 1, self.stats(), flush, time.time()
            )
        )

    def warn_if_silent(self, now: float) -> None:
        """No collector has answered in :data:`SILENT_WARN_S` since start-up: say so once,
        naming the address."""
        if self.silent_since is None or now - self.silent_since < SILENT_WARN_S:
            return
        silent_s = now - self.silent_since
        self.silent_since = None  # once
        where = (
            "connected, but no collector answered"
            if self.ever_connected
            else "nobody is listening there"
        )
        self.warn_once(
            "silent",
            f"no collector has answered at {self.address or 'its address'} in {silent_s:.0f} s "
            f"({where}: a wrong address, or a collector not started?); log() calls are kept "
            f"until one answers, up to max_unacked={self.max_unacked} messages, and "
            "those still unsent at close() are dropped (counted in stats() as dropped_send)",
        )

    def finish(self, deadline: float, cycle: Callable[[], None], timeout_s: float) -> None:
        """Until the deadline, send what is unacked and wait for the acknowledgements. A
        producer that has been connected waits for a restarting collector to come back; one
        that never reached a collector waits for a connection still being set up, but stops
        as soon as one is refused (nobody listening), and so does one whose handshake a
        collector refused (:attr:`rejected`: it will not be let in). ``cycle`` is the sender's cycle (which
        reads acknowledgements and sends); ``timeout_s`` the close's (``deadline`` is that long
        after the close began): the warning names it beside the time the close took."""
        began = deadline - timeout_s
        while self.outbox.unacked and time.monotonic() < deadline:
            if not self.connected:
                self.refused = False
                if not self.rejected:
                    self.watch(wait_s=deadline - time.monotonic())
                if not self.connected and (not self.ever_connected or self.rejected):
                    break  # nobody there, or a collector that refused us: no use waiting
            cycle()
            if self.outbox.unacked:
                time.sleep(0.005)
        unsent, unconfirmed = self.outbox.lost_entries()
        self.counters.dropped_send += unsent
        self.counters.unconfirmed += unconfirmed
        if unsent or unconfirmed:
            if self.connected:  # the collector's producer_dropped_total counts it too
                self.heartbeat()
            ident = self.registration.identity
            log.warning(
                "rlpulse producer %s/%s closed after %.1fs (timeout %.1fs): %s",
                ident.role,
                ident.rank,
                time.monotonic() - began,
                timeout_s,
                self.close_verdict(unsent, unconfirmed),
            )

    def close_verdict(self, unsent: int, unconfirmed: int) -> str:
        """What a close that gave up left behind, and why, in words."""
        parts = []
        if unsent:
            if self.rejected:
                why = f"a collector answered but refused this producer ({self.rejected})"
            else:
                why = "no collector answered" if not self.ever_connected else "not connected"
            steps = IncompleteSteps()
            for step in self.outbox.unsent_steps():
                steps.add(step)
            parts.append(
                f"{unsent} log() calls never sent, lost (stats() dropped_send): {why}"
                + (f", of steps {steps.describe()}" if steps.count else "")
            )
        if unconfirmed:
            why = (
                "the collector holds this producer back (flow control: it is ahead of its "
                "run's other ranks by the collector's max_open_steps) and keeps them to merge "
                "as the others catch up"
                if self.held
                else "the collector may hold them"
            )
            parts.append(
                f"{unconfirmed} log() calls sent but not acknowledged in time (stats() "
                f"unconfirmed): {why}; a step that misses them is flagged partial naming "
                "this rank"
            )
        return "; ".join(parts)
