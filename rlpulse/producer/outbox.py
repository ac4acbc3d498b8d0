"""Delivery bookkeeping without I/O: sequence numbers, acknowledgements, resends, and the
registration handshake.

Delivery is at least once, made exactly once by the collector's deduplication: every data
message (``metrics``, ``done``, ``bye``) gets the next sequence number and stays in a bounded
*unacknowledged* buffer until the collector acknowledges it (cumulatively, once it is in its
write-ahead log). What goes out again is what the collector lacks: after a reconnection,
what its first acknowledgement does not cover; and what it asks for (``resend``: a gap it
saw in our messages or heartbeats, or messages it could not park while holding us back).
A collector that says it asks (``Ack.asks``) is never resent to on a timer: when its
acknowledgements stall it is only asked for one (a heartbeat), after ``resend_s``, then
twice as long each time (up to ``MAX_BACKOFF`` times); while it is silent (frozen, busy,
restarting) nothing is sent twice. Only a collector that predates asking gets everything
again at those times. When the buffer is full, new messages are refused and the
sender counts them (``dropped_buffer_full``), never silently; the bye alone is kept past the
bound.

Registration: on each connection the hello goes out before any data, and is repeated every
``HELLO_RETRY_S`` until the collector answers (any ``ack``): right after a TCP connection is
up ZeroMQ may still be handshaking and refuse the first send.

>>> box = Outbox(max_messages=10, max_bytes=1000, resend_s=2.0)
>>> box.add(lambda seq: b"m%d" % seq, entries=1), box.next_unsent().seq
(True, 1)
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from rlpulse.schemas import protocol
from rlpulse.schemas.errors import SchemaError
from rlpulse.schemas.messages import TableDecl

HOLD_LIMIT = 10
"""Resend periods a producer the collector holds back waits for its wake-up before it
sends again anyway."""
HELLO_RETRY_S = 0.2
"""Until the collector acknowledges our hello, it is sent again this often."""
MAX_BACKOFF = 16
"""A collector that does not ask for resends gets everything again after ``resend_s`` of
stalled acknowledgements, then after twice that, and so on up to this many times
``resend_s``: a frozen collector is not flooded with the whole buffer every ``resend_s``."""


class Outgoing:
    """One data message: its number, bytes, how many ``log()`` calls it carries and the
    highest step among them (-1: none), and whether it went out at least once (then the
    collector may hold it, acknowledged or not)."""

    __slots__ = ("entries", "payload", "seq", "size", "step", "went_out")

    def __init__(self, seq: int, payload: bytes, entries: int, step: int = -1) -> None:
        self.seq = seq
        self.payload = payload
        self.entries = entries
        self.step = step
        self.size = len(payload)
        self.went_out = False


class Outbox:
    """The data messages of one producer, from numbering to acknowledgement. Time is passed
    in (monotonic seconds), so tests drive it without sleeping."""

    def __init__(self, *, max_messages: int, max_bytes: int, resend_s: float) -> None:
        self.max_messages = max_messages
        self.max_bytes = max_bytes
        self.resend_s = resend_s
        self.next_seq = 1
        self.acked = 0
        self._unacked: deque[Outgoing] = deque()
        self._unacked_bytes = 0
        self._unsent: deque[Outgoing] = deque()
        self._progress_at = 0.0
        self._backoff = 1
        """The stall that triggers the next timed resend, in ``resend_s``."""
        self.asking = False
        """The collector asks for what it misses (``Ack.asks``): no timed resends."""
        self.sent_seq = 0
        """The highest number that went out (heartbeats tell it: the collector sees gaps)."""
        self._went_out = (0, -1)
        """What the hello says went out (:meth:`went_out`)."""
        self._acked_step = -1
        """The highest step of a ``log()`` call in a message acknowledged."""
        self._disclaimed = False
        """A stopping collector's last acknowledgement came (:meth:`stopping`) and no new
        connection since: what goes out meanwhile is applied by no collector."""
        self._held_at: float | None = None
        """When the collector told us to hold (None: sending freely)."""
        self._flush_waiters: list[tuple[int, threading.Event]] = []

    # ------------------------------------------------------------------ numbering

    def add(
        self, encode: Callable[[int], bytes], entries: int, *, bounded: bool = True, step: int = -1
    ) -> bool:
        """Number a message and keep it until acknowledged; False when the buffer is full.
        ``bounded=False``: kept past the bound (the bye: one small message, and the only one
        that tells the collector this producer's last step is done). ``step``: the highest
        step of its ``log()`` calls (-1: none)."""
        if bounded and (
            len(self._unacked) >= self.max_messages or self._unacked_bytes >= self.max_bytes
        ):
            return False
        item = Outgoing(self.next_seq, encode(self.next_seq), entries, step)
        self.next_seq += 1
        self._unacked.append(item)
        self._unacked_bytes += item.size
        self._unsent.append(item)
        return True

    @property
    def unacked(self) -> int:
        return len(self._unacked)

    def base(self) -> int:
        """The oldest unacknowledged number (the next one when none is pending): the hello
        tells a collector without saved state that everything below is acknowledged."""
        return self._unacked[0].seq if self._unacked else self.next_seq

    def went_out(self) -> tuple[int, int]:
        """``(seq, step)``: the highest number, and the highest ``log()`` step, of what
        went out so far and a collector may have applied (the hello says it:
        ``rlpulse.schemas.messages.Hello.went_out``); not what a stopping collector said it
        did not apply (:meth:`stopping`)."""
        return self._went_out

    def stopping(self) -> None:
        """The collector's last acknowledgement (``Ack.stopping``): it applied nothing after
        it, and applies nothing more. What went out unacknowledged was not applied, nor is
        what goes out before the next connection (:meth:`new_connection`)."""
        self._disclaimed = True
        self._went_out = (self.acked, self._acked_step)

    def new_connection(self) -> None:
        """A new connection is up: what goes out may be applied again."""
        self._disclaimed = False

    def lost_entries(self) -> tuple[int, int]:
        """What a close now would leave behind, in ``log()`` calls: those in messages that
        never went out (lost for certain), and those in messages sent but not acknowledged
        (the collector may well have merged them: its acknowledgement is what is missing)."""
        unsent = unconfirmed = 0
        for item in self._unacked:
            if item.went_out:
                unconfirmed += item.entries
            else:
                unsent += item.entries
        return unsent, unconfirmed

    def unsent_steps(self) -> list[int]:
        """The steps of the ``log()`` calls in messages that never went out (a close names
        them), read back from the messages."""
        steps: set[int] = set()
        for item in self._unacked:
            if not item.went_out:
                try:
                    msg = protocol.decode(item.payload)
                except SchemaError:  # ours, so never; but a warning must not fail
                    continue
                if isinstance(msg, protocol.Metrics):
                    steps.update(e[0] for e in msg.entries)
        return sorted(steps)

    # ------------------------------------------------------------------ sending

    def next_unsent(self, now: float | None = None) -> Outgoing | None:
        """The next message to send; None while the collector holds us back (for at most
        ``HOLD_LIMIT`` resend periods: a lost wake-up must not stop us for good)."""
        if self._held_at is not None:
            if now is not None and now - self._held_at < HOLD_LIMIT * self.resend_s:
                return None
            self._held_at = None
            if not self.asking:  # an older collector dropped what we sent after the held one
                self._unsent = deque(self._unacked)
        return self._unsent[0] if self._unsent else None

    def hold(self, now: float) -> None:
        """The collector applied nothing after the last acknowledged message and asks us to
        wait (flow control) until it says ``resend``."""
        self._held_at = now

    def sent(self) -> None:
        """The message :meth:`next_unsent` returned went out."""
        item = self._unsent.popleft()
        item.went_out = True
        if item.seq > self.sent_seq:
            self.sent_seq = item.seq
        if not self._disclaimed:
            seq, step = self._went_out
            self._went_out = (max(seq, item.seq), max(step, item.step))

    def resend_all(self, now: float) -> int:
        """Send everything unacknowledged again, in order; return how many are repeats."""
        self._held_at = None
        repeats = len(self._unacked) - len(self._unsent)
        if self._unacked:
            self._unsent = deque(self._unacked)
        self._progress_at = now
        return repeats

    def go_on(self, now: float) -> None:
        """The collector has room again and kept everything we sent while held: send what
        we have not sent yet (nothing twice)."""
        self._held_at = None
        self._progress_at = now

    def stalled(self, now: float) -> bool:
        """Everything went out and the collector is not holding us back, yet nothing was
        acknowledged for the current backoff (``resend_s`` times 1, 2, 4...
        :data:`MAX_BACKOFF`), which this doubles. Then a collector that asks (:attr:`asking`)
        is asked for an acknowledgement (a heartbeat, not the data again: it says what it
        lacks); one that does not is sent everything again."""
        if self._held_at is not None or self._unsent or not self._unacked:
            return False
        if now - self._progress_at <= self.resend_s * self._backoff:
            return False
        self._backoff = min(2 * self._backoff, MAX_BACKOFF)
        self._progress_at = now  # the next stall is measured from here
        return True

    # ------------------------------------------------------------------ acknowledgements

    def ack(self, seq: int, now: float) -> None:
        """The collector has every message up to ``seq``."""
        if seq > self.acked:
            self.acked = seq
            self._progress_at = now
            self._backoff = 1
        unacked = self._unacked
        while unacked and unacked[0].seq <= seq:
            item = unacked.popleft()
            self._unacked_bytes -= item.size
            if item.step > self._acked_step:
                self._acked_step = item.step
        while self._unsent and self._unsent[0].seq <= seq:
            self._unsent.popleft()
        if self._flush_waiters:
            waiting = []
            for target, event in self._flush_waiters:
                if self.acked >= target:
                    event.set()
                else:
                    waiting.append((target, event))
            self._flush_waiters = waiting

    def when_acked(self, event: threading.Event) -> None:
        """Set ``event`` once everything numbered so far is acknowledged."""
        target = self.next_seq - 1
        if self.acked >= target:
            event.set()
        else:
            self._flush_waiters.append((target, event))

    @property
    def awaited(self) -> bool:
        """A ``flush()`` waits for acknowledgements."""
        return bool(self._flush_waiters)

    def release_waiters(self) -> None:
        """Closing: wake every flush, acknowledged or not."""
        for _, event in self._flush_waiters:
            event.set()
        self._flush_waiters = []


@dataclass(frozen=True)
class Identity:
    """Who a producer is: what its hello says."""

    run: str
    role: str
    rank: int = 0
    world_size: int = 1
    expected: Mapping[str, int] = field(default_factory=dict)
    """The run's whole topology (role -> world size), when the producer knows it."""
    metrics_url: str = ""
    """The Prometheus endpoint this process serves, registered for discovery ("" for none)."""
    logs: bool = True
    """False: registers ``metrics_url`` only; the collector does not count it as a rank."""
    resume: bool = False
    """Continue the run even if it has ended on the collector (``rlpulse.schemas.messages.Hello``)."""


class Registration:
    """What the hello says, and whether the collector knows this producer on the current
    connection."""

    def __init__(self, identity: Identity, producer_id: int) -> None:
        self.identity = identity
        self.producer_id = producer_id
        self.sent_at: float | None = None
        """When the hello last went out on this connection (None: not yet)."""
        self.answered = False
        self.config = b""
        """The run's configuration (``rlpulse.schemas.runconfig``, encoded), every hello's: set
        by ``Producer.run_config`` on the caller's thread (one reference, replaced whole)."""
        self._config_said = b""
        """The configuration the last hello carried (the sender's thread only)."""

    def reset(self) -> None:
        """A new (or lost) connection: say hello again."""
        self.sent_at = None
        self.answered = False

    def due(self, now: float) -> bool:
        """Send the hello now: not yet on this connection, unanswered for a while, or with a
        configuration the last one did not carry."""
        if self.config is not self._config_said:
            return True
        if self.answered:
            return False
        return self.sent_at is None or now - self.sent_at >= HELLO_RETRY_S

    def hello(
        self, base: int, tables: Sequence[TableDecl] = (), went_out: tuple[int, int] = (0, -1)
    ) -> bytes:
        """The registration message; ``base`` is the outbox's oldest unacknowledged number,
        ``tables`` every name table the producer's entries refer to, ``went_out`` what of its
        data went out so far (:meth:`Outbox.went_out`)."""
        ident = self.identity
        config = self._config_said = self.config
        return protocol.encode_hello(
            self.producer_id,
            base,
            run=ident.run,
            role=ident.role,
            rank=ident.rank,
            world_size=ident.world_size,
            expected=ident.expected,
            tables=tables,
            metrics_url=ident.metrics_url,
            logs=ident.logs,
            resume=ident.resume,
            config=config,
            went_out=went_out,
            sent=time.time(),  # our clock, for the collector to measure its offset
        )

    @property
    def data_may_follow(self) -> bool:
        """Data goes out only after the hello has, on the same connection."""
        return self.sent_at is not None
