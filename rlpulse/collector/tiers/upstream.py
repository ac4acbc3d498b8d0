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
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rlpulse.collector.config import CollectorConfig
from rlpulse.collector.sinks.base import Sink
from rlpulse.collector.tiers.relay import HEARTBEAT_S, RelayRecord
from rlpulse.schemas import protocol
from rlpulse.schemas.errors import SchemaError
from rlpulse.schemas.messages import Member, TableDecl


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

    def __init__(self, config: CollectorConfig, producer_id: int, timeout_s: float = 5.0) -> None:
        self.config = config
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
        """When anything last went up (``time.monotonic``)."""
        self._stamped_at = -HEARTBEAT_S
        """When a heartbeat last went up: one every ``HEARTBEAT_S`` also while deltas flow,
        so the collector above keeps measuring this relay's clock offset (its stamp)."""

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
        now = time.monotonic()
        if changed or now - self._beat_at >= HEARTBEAT_S or now - self._stamped_at >= HEARTBEAT_S:
            self._heartbeat()

    def _heartbeat(self) -> None:
        self._pump(0.0)
        if self._connected and self._answered:
            with self._state_lock:
                stats = dict(self._state)
            beat = protocol.Heartbeat(self.producer_id, 0, stats, False, time.time())
            self._link().send(protocol.encode(beat))
            self._beat_at = self._stamped_at = time.monotonic()
            self._told = stats

    def open(self) -> None:
        pass  # the socket is made on the sink's own thread, at the first write

    def _link(self) -> Any:
        if self._transport is None:
            from rlpulse.wire.transport import ZmqTransport, load_curve

            keys = self.config.upstream_curve
            curve = load_curve(keys["server_key"], keys["client_cert"]) if keys else None
            assert self.config.upstream is not None
            self._transport = ZmqTransport(self.config.upstream, sndhwm=1000, curve=curve)
        return self._transport

    def _pump(self, wait_s: float) -> None:
        """Connection events and acknowledgements, waiting up to ``wait_s`` for one."""
        from rlpulse.wire.transport import Link

        link = self._link()
        for event in link.events(wait_s if not self._connected else 0.0):
            if event is Link.CONNECTED:
                self._connected, self._answered = True, False
            elif event is Link.DISCONNECTED:
                self._connected, self._answered = False, False
        deadline = time.monotonic() + (wait_s if self._connected else 0.0)
        while True:
            payload = link.receive()
            if payload is None:
                if time.monotonic() >= deadline:
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
                self._acked = max(self._acked, msg.seq)
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
        after a reconnection) until ``done()``; raise after ``timeout_s``."""
        deadline = time.monotonic() + self.timeout_s
        sent_at = -1.0
        while not done():
            now = time.monotonic()
            if now >= deadline:
                raise TimeoutError(f"the collector above ({self.config.upstream}) did not answer")
            if not self._connected:
                self._pump(min(0.1, deadline - now))
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
