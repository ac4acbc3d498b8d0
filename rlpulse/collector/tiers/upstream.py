"""A relay's one sink: the collector above it (see ``rlpulse.collector.tiers.relay``).

Records go up in order, each acknowledged before the next; the relay's producer id is kept
in ``state_dir`` so a restarted relay is the same producer to the root, which applies each of
its numbered deltas once.

Heartbeats carry the relay's own state (``RELAY_STAT_KEYS``: its ``state_dir`` disk errors, and
whether it can write there), which the root shows on its /metrics. They are sent from the
sink's thread whenever nothing went up for ``HEARTBEAT_S`` (:meth:`UpstreamSink.idle`), not only
as records of the outbox: a relay whose ``state_dir`` is full emits nothing, and without them
the root presumed its ranks dead after ``liveness_s`` (149 of 250 steps partial for a 15 s
fill), with nothing on the root to say why.

The root may hold a relay back, as it holds a producer ahead of the others (its ranks are
ahead of a run's ``max_open_steps`` window: ``rlpulse.collector.tiers.watch.admits``): an
acknowledgement says ``hold``. The record then waits, with no time limit while the root
answers: the sink heartbeats meanwhile (asking for an answer, so the root keeps hearing of
the relay and the relay of the root), offers the record again every ``HEARTBEAT_S``, and goes
on at the ``go`` or ``resend`` that lets it. Records behind it wait in the outbox.

A collector above that answers but refuses the relay's handshake (CurveZMQ: the relay has no
keys, or a key it does not list) is said once in the relay's log, with why, and counted
(:attr:`UpstreamSink.refused`: in the relay's stop line and ``stopped.json``). A write then
fails at once (:class:`UpstreamRefused`) instead of waiting out ``timeout_s``; the fan-out
retries it with its backoff. ZeroMQ gives such a connection up, so the relay makes a new one
``REFUSED_RETRY_S`` later: once the collector above lets it in (restarted with the relay's key
allowed), forwarding goes on without a restart of the relay.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from rlpulse.collector.config import CollectorConfig
from rlpulse.collector.loopclock import LOOP_GAP_S
from rlpulse.collector.ratelog import RateLimitedLog
from rlpulse.collector.sinks.base import Sink
from rlpulse.collector.tiers.relay import HEARTBEAT_S, RelayRecord
from rlpulse.schemas import protocol
from rlpulse.schemas.errors import SchemaError
from rlpulse.schemas.messages import Member, TableDecl

log = logging.getLogger("rlpulse.collector.tiers.upstream")
REFUSED_RETRY_S = 5.0
"""After a refusal ZeroMQ gives up (a mechanism mismatch, a refused key), how long until the
relay tries a new connection to the collector above."""


class UpstreamRefused(ConnectionError):
    """The collector above answered and refused this relay's handshake (CurveZMQ)."""


def relay_id(state_dir: str | None) -> int:
    """This relay's producer id upstream: kept in ``state_dir`` so a restarted relay is the
    same producer to the root (which deduplicates by it); random without one."""
    if state_dir is None:
        return protocol.new_producer_id()
    path = Path(state_dir) / "relay_id"
    if path.exists():
        return int(path.read_text())
    path.parent.mkdir(parents=True, exist_ok=True)
    value = protocol.new_producer_id()
    tmp = path.with_suffix(".tmp")
    tmp.write_text(str(value))
    os.replace(tmp, path)
    return value


class UpstreamSink(Sink):
    """Forwards a relay's records to the collector above, in order, each acknowledged before
    the next (a delta per step per run: a round trip each is plenty). It runs on its own
    sink thread (``rlpulse.collector.output.fanout``); a failure raises and the fan-out retries, so with
    ``state_dir`` nothing is skipped."""

    name = "upstream"

    def __init__(
        self,
        config: CollectorConfig,
        producer_id: int,
        timeout_s: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self._clock = clock
        self.producer_id = producer_id
        self.timeout_s = timeout_s
        self._transport: Any = None
        self._connected = False
        self._answered = False
        self._acked = 0
        self._tables: dict[int, TableDecl] = {}
        self._members: dict[int, Member] = {}
        self.member_late: dict[int, int] = {}
        """Per producer behind this relay, its entries the collector above left out as late
        (cumulative, from its acks): the relay's acks tell each producer."""
        self._state: dict[str, int] = {}
        self._state_lock = threading.Lock()
        self._told: dict[str, int] = {}
        """The state the root last heard."""
        self._beat_at = -HEARTBEAT_S
        """When anything last went up (``clock``)."""
        self.held = False
        """The collector above holds this relay back (an ack said ``hold``, none since said
        ``go`` or ``resend``)."""
        self._answer_at = 0.0
        """When the collector above last acknowledged anything (``clock``)."""
        self.refused = 0
        """Handshakes the collector above refused (CurveZMQ): the relay's stop line and
        ``stopped.json`` say how many."""
        self.refusal = ""
        """Why the collector above refuses this relay, as its last refusal said; "" once it
        answers (and before any refusal)."""
        self._given_up_at: float | None = None
        """When ZeroMQ gave the connection up after a refusal (``clock``): a new one is made
        ``REFUSED_RETRY_S`` later."""
        self._ratelog = RateLimitedLog(log, interval_s=60.0)
        self._stamped_at = -HEARTBEAT_S
        """When a heartbeat last went up (``clock``): one every ``HEARTBEAT_S`` also while
        deltas flow, so the collector above keeps measuring this relay's clock offset (its
        stamp)."""

    def report(self, state: Mapping[str, int]) -> None:
        """The relay's own state for its next heartbeats (``RELAY_STAT_KEYS``); any thread."""
        with self._state_lock:
            self._state = dict(state)

    def idle(self) -> None:
        """Called by the sink's thread while it has nothing to forward: a heartbeat when
        nothing went up for ``HEARTBEAT_S`` or the relay's state changed, so the root hears
        of this relay, and of its state, also while the relay emits nothing (its
        ``state_dir`` full)."""
        with self._state_lock:
            changed = self._state != self._told
        now = self._clock()
        if changed or now - self._beat_at >= HEARTBEAT_S or now - self._stamped_at >= HEARTBEAT_S:
            self._heartbeat()

    def _heartbeat(self, answer: bool = False) -> None:
        """A heartbeat with the relay's state; ``answer``: asking for an acknowledgement."""
        self._pump(0.0)
        if self._connected and self._answered:
            with self._state_lock:
                stats = dict(self._state)
            beat = protocol.Heartbeat(self.producer_id, 0, stats, answer, time.time())
            self._link().send(protocol.encode(beat))
            self._beat_at = self._stamped_at = self._clock()
            self._told = stats

    def open(self) -> None:
        pass  # the socket is made on the sink's own thread, at the first write

    def _link(self) -> Any:
        given_up = self._given_up_at
        if given_up is not None and self._clock() - given_up >= REFUSED_RETRY_S:
            self._given_up_at = None  # refused for good by ZeroMQ: a new connection, a new try
            self.close()
            self._connected = self._answered = self.held = False
        if self._transport is None:
            from rlpulse.wire.transport import RELAY, ZmqTransport, load_curve

            keys = self.config.upstream_curve
            curve = load_curve(keys["server_key"], keys["client_cert"]) if keys else None
            assert self.config.upstream is not None
            self._transport = ZmqTransport(
                self.config.upstream, sndhwm=1000, curve=curve, client=RELAY
            )
        return self._transport

    def _rejected(self, why: str, final: bool) -> None:
        """The collector above answered and refused our handshake: counted; said once (until
        it lets us in), with why; ``final``: ZeroMQ gave the connection up."""
        self.refused += 1
        self._connected = self._answered = False
        if final:
            self._given_up_at = self._clock()
        if not self.refusal:
            log.warning(
                "the collector above (%s) answered but refused this relay: %s. Records wait "
                "here meanwhile (in state_dir; without one, retried, then dropped and counted); "
                "the relay tries a new connection every %gs",
                self.config.upstream,
                why,
                REFUSED_RETRY_S,
            )
        self.refusal = why

    def _pump(self, wait_s: float) -> None:
        """Connection events and acknowledgements, waiting up to ``wait_s`` for one."""
        from rlpulse.wire.transport import Link, Rejected

        link = self._link()
        for event in link.events(wait_s if not self._connected else 0.0):
            if isinstance(event, Rejected):
                self._rejected(event.why, event.final)
            elif event is Link.CONNECTED:
                self._connected, self._answered, self.held = True, False, False
            elif event is Link.DISCONNECTED:
                self._connected, self._answered, self.held = False, False, False
        deadline = self._clock() + (wait_s if self._connected else 0.0)
        while True:
            payload = link.receive()
            if payload is None:
                if self._clock() >= deadline:
                    return
                time.sleep(0.0005)
                continue
            try:
                msg = protocol.decode(payload)
            except SchemaError:
                continue
            if isinstance(msg, protocol.Ack):
                self.member_late.update(msg.members)
                self._answered = True
                if self.refusal:
                    log.info("the collector above (%s) lets this relay in", self.config.upstream)
                    self.refusal = ""
                progressed, self._acked = msg.seq > self._acked, max(self._acked, msg.seq)
                self._answer_at = self._clock()
                if msg.hold and not self.held:
                    self._ratelog.warn(
                        "hold",
                        f"the collector above ({self.config.upstream}) holds this relay back: "
                        "its ranks are ahead of others their run waits for (max_open_steps); "
                        "forwarding goes on once it has room, meanwhile records wait here",
                    )
                if msg.hold or msg.go or msg.resend or progressed:  # it applied ours: let go
                    self.held = msg.hold
                return

    def _hello(self, base: int) -> None:
        hello = protocol.RelayHello(
            self.producer_id,
            base,
            os.uname().nodename,
            os.getpid(),
            list(self._tables.values()),
            list(self._members.values()),
            time.time(),  # our clock: the collector above measures its offset from it
        )
        self._link().send(protocol.encode(hello))

    def _until(self, done: Any, send: Any) -> None:
        """Send (again whenever the collector above has not answered within a second, or
        after a reconnection) until ``done()``; raise after ``timeout_s`` without an answer
        (this relay's own pauses left out, as ``rlpulse.collector.loopclock`` leaves them out).
        While the collector above holds this relay back, heartbeat and offer it again every
        ``HEARTBEAT_S`` instead, for as long as it answers (see the module docstring). Raise
        :class:`UpstreamRefused` at once when the collector above refuses our handshake."""
        deadline = last = self._clock()
        deadline += self.timeout_s
        sent_at = -1.0
        self._link()  # a new connection if the last one was refused long enough ago
        refused = self.refused
        while not done():
            if self.refused > refused or self._given_up_at is not None:
                raise UpstreamRefused(  # why: in the warning logged once (_rejected)
                    f"the collector above ({self.config.upstream}) refuses this relay's handshake"
                )
            now = self._clock()
            if now - last > LOOP_GAP_S:  # this relay did not run (frozen): not the root's delay
                deadline += now - last
            last = now
            if self.held:  # flow control: the root answers (each heartbeat), lets us go later
                deadline = max(deadline, self._answer_at + HEARTBEAT_S + self.timeout_s)
            if now >= deadline:
                raise TimeoutError(f"the collector above ({self.config.upstream}) did not answer")
            if not self._connected:
                self._pump(min(0.1, deadline - now))
                continue
            if self.held:
                if now - self._beat_at >= HEARTBEAT_S:
                    self._heartbeat(answer=True)  # alive to the root, and asks for an answer
                    if self.held and not done():
                        send()  # taken if there is room now; kept there, once, if not
                    sent_at = now
                self._pump(0.05)
                if not self.held:
                    sent_at = -1.0  # let go: at once
                continue
            if now - sent_at >= 1.0 or not self._answered:
                send()
                sent_at = self._beat_at = now
            self._pump(0.05)

    def write(self, record: Any) -> None:
        if not isinstance(record, RelayRecord):
            raise TypeError(f"a relay forwards relay records, not {type(record).__name__}")
        self.idle()  # a change of state goes up before the record, even while records flow
        if record.kind == "heartbeat":
            self._heartbeat()
            return
        if record.kind == "forget":  # their run was forgotten here: not in our hellos
            for member in record.members:
                self._members.pop(member.producer, None)
                self.member_late.pop(member.producer, None)
            return
        if record.kind == "announce":
            self._tables.update((t.id, t) for t in record.tables)
            self._members.update((m.producer, m) for m in record.members)
            self._answered = False
            self._until(lambda: self._answered, lambda: self._hello(self._acked + 1))
            return
        if record.seq <= self._acked:
            return  # the root has it already (a resend after our restart)

        def send() -> None:
            if not self._answered:
                self._hello(record.seq)
            self._link().send(record.message)

        self._until(lambda: self._acked >= record.seq, send)

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()
            self._transport = None
