"""The producer's background thread: encodes queued ``log()`` calls and sends them.

Only this thread touches the ZeroMQ socket (sockets are not thread-safe). It wakes when the
caller queues work or a heartbeat is due, drains everything queued into as few messages as
possible (one frame carrying many entries is an order of magnitude cheaper than one frame
each), and sends without blocking: when ZeroMQ's queue is full the message is dropped and its
entries counted, never retried in a loop that could grow without bound.
"""

from __future__ import annotations

import array
import logging
import math
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

import zmq

from producer.reduce import Pending
from schemas import protocol
from schemas.catalog import Catalog
from schemas.reductions import Reduction

log = logging.getLogger("rlpulse.producer")

LOG, DONE, FLUSH = 0, 1, 2
INVALID = object()
"""Placed in a payload by ``log()`` for a value it could not read (already counted)."""
MAX_ENTRIES_PER_MESSAGE = 256
HELLO_EVERY = 5
"""Heartbeats between re-registrations, so a restarted collector learns who we are."""
CONNECT_GRACE_S = 0.5
"""At close, how long a connection still being set up may take before we stop waiting."""
_BIG_ENDIAN = sys.byteorder != "little"
_FLOAT = (float, int)


class SenderCounters:
    """Counters only the sender thread writes (the caller's live on the Producer)."""

    def __init__(self) -> None:
        self.sent_messages = 0
        self.dropped_send = 0
        self.nonfinite = 0
        self.invalid = 0
        self.errors = 0


class Sender(threading.Thread):
    """Drains ``queue`` into a DEALER socket connected to ``address``."""

    def __init__(
        self,
        *,
        address: str,
        identity: Mapping[str, Any],
        producer_id: int,
        queue: deque,
        wake: threading.Event,
        catalog: Catalog,
        declared: Mapping[str, Reduction],
        stats: Callable[[], dict[str, int]],
        warn_once: Callable[[str, str], None],
        heartbeat_s: float,
        sndhwm: int,
        context: zmq.Context,
    ) -> None:
        super().__init__(name=f"rlpulse-sender-{identity['role']}-{identity['rank']}", daemon=True)
        self.address = address
        self.identity = dict(identity)
        self.producer_id = producer_id
        self.queue = queue
        self.wake = wake
        self.catalog = catalog
        self.declared = declared
        self.stats = stats
        self.warn_once = warn_once
        self.heartbeat_s = heartbeat_s
        self.counters = SenderCounters()
        self.stopping = threading.Event()
        self.close_timeout_s = 2.0
        self._seq = 0
        self._kinds: dict[str, int] = {}
        self._socket = context.socket(zmq.DEALER)
        self._socket.setsockopt(zmq.LINGER, 0)
        self._socket.setsockopt(zmq.SNDHWM, sndhwm)
        self._monitor = self._socket.get_monitor_socket(
            zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED
        )
        self._connected = False
        self._socket.connect(address)
        self._context = context

    # ------------------------------------------------------------------ sending

    def _next_seq(self) -> int:
        seq = self._seq
        self._seq += 1
        return seq

    def _send(self, payload: bytes, entries: int = 0) -> bool:
        try:
            self._socket.send(payload, zmq.NOBLOCK)
        except zmq.Again:
            self.counters.dropped_send += entries
            self.warn_once(
                "send",
                f"collector at {self.address} is not keeping up or not reachable; dropping (counted in stats())",
            )
            return False
        except zmq.ZMQError as exc:
            self.counters.errors += 1
            self.counters.dropped_send += entries
            self.warn_once("send-error", f"send failed: {exc}")
            return False
        self.counters.sent_messages += 1
        return True

    def _hello(self) -> None:
        ident = self.identity
        self._send(
            protocol.encode_hello(
                self.producer_id,
                self._next_seq(),
                run=ident["run"],
                role=ident["role"],
                rank=ident["rank"],
                world_size=ident["world_size"],
            )
        )

    def _watch_connection(self, wait_s: float = 0.0) -> None:
        """Track whether a collector is connected, so close() need not linger for nobody.
        With ``wait_s``, give a connection still being set up that long to complete."""
        deadline = time.monotonic() + wait_s
        while True:
            timeout_ms = 0 if self._connected else max(0, int((deadline - time.monotonic()) * 1000))
            if not self._monitor.poll(timeout_ms):
                return
            frames = self._monitor.recv_multipart()
            event = int.from_bytes(frames[0][:2], "little")
            self._connected = event == zmq.EVENT_CONNECTED

    # ------------------------------------------------------------------ encoding

    def _kind(self, name: str) -> int:
        code = self._kinds.get(name)
        if code is None:
            code = int(self.catalog.resolve(name, self.declared.get(name)).reduction)
            self._kinds[name] = code
        return code

    def _entry(self, step: int, t: float, payload: Mapping[Any, Any]) -> list | None:
        names: list[str] = []
        kinds = bytearray()
        vals = array.array("d")
        nonfinite: dict[str, int] = {}
        c = self.counters
        for name, v in payload.items():
            if type(name) is not str or not name:
                c.invalid += 1
                self.warn_once(
                    f"name:{name!r}", f"metric names must be non-empty strings, got {name!r}"
                )
                continue
            if v is INVALID:
                continue
            code = self._kind(name)
            if type(v) in _FLOAT:
                x = float(v)
                if math.isfinite(x):
                    vals.extend((x, 1.0, x, x))
                else:
                    nonfinite[name] = 1
                    c.nonfinite += 1
                    continue
            else:
                if type(v) is Pending:
                    v = v.resolve()
                s, w, mn, mx, nf = v
                if nf:
                    nonfinite[name] = nf
                    c.nonfinite += nf
                if code == Reduction.LAST and w != 1.0:
                    if w:
                        c.invalid += 1
                        self.warn_once(
                            f"last:{name}",
                            f"{name} keeps the last value: log a single number, not {w:g} samples",
                        )
                    continue
                vals.extend((s, w, mn, mx))
            names.append(name)
            kinds.append(code)
        if not names and not nonfinite:
            return None
        if _BIG_ENDIAN:
            vals.byteswap()
        return protocol.pack_entry(step, t, names, bytes(kinds), vals.tobytes(), nonfinite)

    def _drain(self) -> None:
        entries: list[list] = []
        queue = self.queue
        while queue:
            item = queue.popleft()
            kind = item[0]
            if kind == LOG:
                try:
                    entry = self._entry(item[1], item[2], item[3])
                except Exception as exc:  # never let one bad value kill the thread
                    self.counters.errors += 1
                    self.warn_once(
                        f"encode:{type(exc).__name__}", f"could not encode a log() call: {exc}"
                    )
                    continue
                if entry is not None:
                    entries.append(entry)
                    if len(entries) >= MAX_ENTRIES_PER_MESSAGE:
                        self._flush_entries(entries)
                        entries = []
            elif kind == DONE:
                self._flush_entries(entries)
                entries = []
                self._send(protocol.encode_done(self.producer_id, self._next_seq(), item[1]))
            else:  # FLUSH marker: everything before it is handed to ZeroMQ
                self._flush_entries(entries)
                entries = []
                item[1].set()
        self._flush_entries(entries)

    def _flush_entries(self, entries: list[list]) -> None:
        if entries:
            self._send(
                protocol.encode_metrics(self.producer_id, self._next_seq(), entries), len(entries)
            )

    # ------------------------------------------------------------------ the loop

    def run(self) -> None:
        try:
            self._hello()
            beats = 0
            next_beat = time.monotonic() + self.heartbeat_s
            while not self.stopping.is_set():
                self.wake.wait(max(0.0, next_beat - time.monotonic()))
                self.wake.clear()
                self._watch_connection()
                self._drain()
                if time.monotonic() >= next_beat:
                    beats += 1
                    if beats % HELLO_EVERY == 0:
                        self._hello()
                    self._send(
                        protocol.encode_heartbeat(self.producer_id, self._next_seq(), self.stats())
                    )
                    next_beat = time.monotonic() + self.heartbeat_s
            self._drain()
            self._send(protocol.encode_bye(self.producer_id, self._next_seq(), self.stats()))
        except Exception as exc:  # the thread must end cleanly, whatever happened
            self.counters.errors += 1
            log.error("rlpulse sender stopped on an unexpected error: %r", exc)
        finally:
            # Bounded: pyzmq's default LINGER of -1 would hang here with messages unsent.
            # With no collector connected there is nobody to linger for.
            self._watch_connection(wait_s=min(self.close_timeout_s, CONNECT_GRACE_S))
            linger = int(self.close_timeout_s * 1000) if self._connected else 0
            self._socket.setsockopt(zmq.LINGER, linger)
            self._socket.disable_monitor()
            self._monitor.close(linger=0)
            self._socket.close()
            self._context.term()
