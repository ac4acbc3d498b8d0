"""The producer's background thread: encodes queued ``log()`` calls, sends, resends until
acknowledged.

Only this thread touches the ZeroMQ socket (sockets are not thread-safe). It wakes when the
caller queues work, and at least every ``POLL_S`` to read acknowledgements and send
heartbeats. Everything queued is drained into as few messages as possible (one frame with
many entries is an order of magnitude cheaper than one frame each).

Delivery is at least once, made exactly once by the collector's deduplication: every data
message (``metrics``, ``done``, ``bye``) gets the next sequence number and stays in a bounded
*unacked* buffer until the collector acknowledges it (cumulatively, once it is in its
write-ahead log). Messages are resent, in order, after a reconnection or when
acknowledgements stall for ``resend_s``. Sends never block: with ``ZMQ_IMMEDIATE`` nothing is
queued to a collector that is not connected, so a message waits in our buffer instead. When
the buffer is full, new messages are dropped and counted (``dropped_buffer_full``), never
silently; the counts travel with every heartbeat.
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
from dataclasses import dataclass
from typing import Any

import zmq

from producer.gpustate import NvmlSampler
from producer.reduce import InvalidValue
from schemas import protocol
from schemas.catalog import Catalog
from schemas.errors import SchemaError
from schemas.reductions import Reduction

log = logging.getLogger("rlpulse.producer")

LOG, DONE, FLUSH = 0, 1, 2
INVALID = object()
"""Placed in a payload by ``log()`` for a value it could not read (already counted)."""
MAX_ENTRIES_PER_MESSAGE = 256
HELLO_EVERY = 5
"""Heartbeats between re-registrations, so a restarted collector learns who we are."""
HELLO_RETRY_S = 0.2
"""Until the collector acknowledges our hello, it is sent again this often."""
POLL_S = 0.1
"""Longest sleep of the sender: acknowledgements and the connection are checked this often."""
GPU_POLL_S = 0.002
"""How often the sender looks at CUDA events while log() calls wait for their GPU values."""
COALESCE_S = 0.002
"""After a wake-up, how long queued calls may gather before they are sent as one message."""
_BIG_ENDIAN = sys.byteorder != "little"
_FLOAT = (float, int)


@dataclass(frozen=True)
class CurveKeys:
    """CurveZMQ keys (Z85 bytes): the collector's public key and this client's key pair."""

    server_public: bytes
    public: bytes
    secret: bytes


class SenderCounters:
    """Counters only the sender thread writes (the caller's live on the Producer)."""

    def __init__(self) -> None:
        self.sent_messages = 0
        self.resent_messages = 0
        self.dropped_buffer_full = 0
        self.dropped_send = 0
        self.nonfinite = 0
        self.invalid = 0
        self.errors = 0


class _Outgoing:
    __slots__ = ("entries", "payload", "seq", "size")

    def __init__(self, seq: int, payload: bytes, entries: int) -> None:
        self.seq = seq
        self.payload = payload
        self.entries = entries
        self.size = len(payload)


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
        max_unacked: int = 10_000,
        max_unacked_bytes: int = 256 * 1024 * 1024,
        resend_s: float = 2.0,
        curve: CurveKeys | None = None,
        nvml: NvmlSampler | None = None,
        gpu_sample_s: float = 1.0,
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
        self.max_unacked = max_unacked
        self.max_unacked_bytes = max_unacked_bytes
        self.resend_s = resend_s
        self.counters = SenderCounters()
        self.stopping = threading.Event()
        self.close_timeout_s = 2.0
        self._next_seq = 1
        self._acked = 0
        self._unacked: deque[_Outgoing] = deque()
        self._unacked_bytes = 0
        self._unsent: deque[_Outgoing] = deque()
        self._progress_at = time.monotonic()
        self._flush_waiters: list[tuple[int, threading.Event]] = []
        self._kinds: dict[str, int] = {}
        self._waiting: deque[tuple] = deque()
        """Queued calls in order, the oldest waiting for its GPU values to arrive."""
        self._nvml = nvml
        self._gpu_sample_s = gpu_sample_s
        self._next_gpu_sample = 0.0
        self._step: tuple[int, float] | None = None
        """The latest step a log() call reached the sender with, and that call's time."""
        self._done_through = -1
        self._socket = context.socket(zmq.DEALER)
        self._socket.setsockopt(zmq.LINGER, 0)
        self._socket.setsockopt(zmq.SNDHWM, sndhwm)
        self._socket.setsockopt(zmq.IMMEDIATE, 1)
        if curve is not None:
            self._socket.curve_serverkey = curve.server_public
            self._socket.curve_publickey = curve.public
            self._socket.curve_secretkey = curve.secret
        self._monitor = self._socket.get_monitor_socket(
            zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED | zmq.EVENT_CONNECT_RETRIED
        )
        self._connected = False
        self._ever_connected = False
        self._refused = False
        self._hello_sent_at: float | None = None
        """When the hello last went out on the current connection (None: not yet)."""
        self._registered = False
        """The collector has answered a hello on the current connection."""
        self._socket.connect(address)
        self._context = context

    @property
    def unacked(self) -> int:
        return len(self._unacked)

    # ------------------------------------------------------------------ the connection

    def _watch_connection(self, wait_s: float = 0.0) -> None:
        """Track whether a collector is connected; resend everything unacked on (re)connect.
        With ``wait_s``, wait that long for a connection, unless one is refused first."""
        deadline = time.monotonic() + wait_s
        while True:
            waiting = not self._connected and not self._refused
            if waiting and wait_s > 0:
                if not self._monitor.poll(max(0, int((deadline - time.monotonic()) * 1000))):
                    return
            elif not self._monitor.getsockopt(zmq.EVENTS) & zmq.POLLIN:
                return  # the cheap check: no exception, no poll
            frames = self._monitor.recv_multipart()
            event = int.from_bytes(frames[0][:2], "little")
            if event == zmq.EVENT_CONNECT_RETRIED:
                self._refused = True  # nobody listening there right now
                continue
            was = self._connected
            self._connected = event == zmq.EVENT_CONNECTED
            self._refused = False
            self._ever_connected |= self._connected
            if self._connected != was:
                self._hello_sent_at = None
                self._registered = False
            if self._connected and not was:
                self._hello()
                self._resend_all()

    def _send_raw(self, payload: bytes) -> bool:
        try:
            self._socket.send(payload, zmq.NOBLOCK)
        except zmq.Again:
            return False
        except zmq.ZMQError as exc:
            self.counters.errors += 1
            self.warn_once("send-error", f"send failed: {exc}")
            return False
        self.counters.sent_messages += 1
        return True

    def _hello(self) -> None:
        """Send the registration. Right after a TCP connection is up, ZeroMQ may still be
        handshaking and refuse the send: nothing else goes out until a hello has, and it is
        repeated until the collector answers (see ``_register``)."""
        ident = self.identity
        base = self._unacked[0].seq if self._unacked else self._next_seq
        sent = self._send_raw(
            protocol.encode_hello(
                self.producer_id,
                base,
                run=ident["run"],
                role=ident["role"],
                rank=ident["rank"],
                world_size=ident["world_size"],
                expected=ident["expected"],
            )
        )
        if sent:
            self._hello_sent_at = time.monotonic()

    def _register(self) -> None:
        """Send the hello again if it has not gone out on this connection, or if the
        collector has not answered it within ``HELLO_RETRY_S``."""
        if not self._connected or self._registered:
            return
        sent_at = self._hello_sent_at
        if sent_at is None or time.monotonic() - sent_at >= HELLO_RETRY_S:
            self._hello()

    # ------------------------------------------------------------------ reliable delivery

    def _enqueue(self, encode: Callable[[int], bytes], entries: int) -> None:
        """Give the next sequence number to a data message and keep it until acknowledged."""
        if len(self._unacked) >= self.max_unacked or self._unacked_bytes >= self.max_unacked_bytes:
            self.counters.dropped_buffer_full += max(entries, 1)
            self.warn_once(
                "buffer-full",
                f"{len(self._unacked)} messages await acknowledgement from {self.address}; dropping new ones (counted in stats())",
            )
            return
        item = _Outgoing(self._next_seq, encode(self._next_seq), entries)
        self._next_seq += 1
        self._unacked.append(item)
        self._unacked_bytes += item.size
        self._unsent.append(item)

    def _pump(self) -> None:
        """Send unsent messages in order until ZeroMQ refuses one (full). Nothing goes out
        before the hello has on this connection, so the collector always learns who we are
        before it sees our data."""
        unsent = self._unsent
        while unsent and self._connected and self._hello_sent_at is not None:
            if not self._send_raw(unsent[0].payload):
                return
            unsent.popleft()

    def _resend_all(self) -> None:
        if self._unacked:
            self.counters.resent_messages += len(self._unacked) - len(self._unsent)
            self._unsent = deque(self._unacked)
        self._progress_at = time.monotonic()

    def _read_acks(self) -> None:
        while self._socket.getsockopt(zmq.EVENTS) & zmq.POLLIN:
            try:
                payload = self._socket.recv(zmq.NOBLOCK)
            except zmq.Again:
                break
            try:
                msg = protocol.decode(payload)
            except SchemaError as exc:
                self.counters.errors += 1
                self.warn_once("bad-ack", f"unreadable reply from the collector: {exc}")
                continue
            if not isinstance(msg, protocol.Ack):
                continue
            self._registered = True  # every ack, a hello's answer included, says it knows us
            if msg.seq > self._acked:
                self._acked = msg.seq
                self._progress_at = time.monotonic()
        unacked = self._unacked
        while unacked and unacked[0].seq <= self._acked:
            self._unacked_bytes -= unacked.popleft().size
        while self._unsent and self._unsent[0].seq <= self._acked:
            self._unsent.popleft()
        if self._flush_waiters:
            waiting = []
            for target, event in self._flush_waiters:
                if self._acked >= target:
                    event.set()
                else:
                    waiting.append((target, event))
            self._flush_waiters = waiting

    def _check_stall(self) -> None:
        if (
            self._unacked
            and not self._unsent
            and time.monotonic() - self._progress_at > self.resend_s
        ):
            self._resend_all()

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
                if type(v) is not tuple:
                    try:
                        v = v.state()  # a GPU value, ready by now
                    except InvalidValue as exc:
                        c.invalid += 1
                        self.warn_once(f"value:{name}", f"{name}: {exc}; that metric is dropped")
                        continue
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
        """Take every queued call in order: launch its GPU work, then encode the calls whose
        values are all there, stopping at the first that still waits (order is kept)."""
        queue, waiting = self.queue, self._waiting
        while queue:
            item = queue.popleft()
            if item[0] == LOG:
                item = self._launch(item)
                if item[5]:  # the end of a phase: read the GPUs now, near the boundary
                    self._sample_gpus(item[1], item[2])
            waiting.append(item)
        entries: list[list] = []
        while waiting:
            item = waiting[0]
            kind = item[0]
            if kind == LOG:
                item = self._ready(item)
                if item is None:
                    break
                waiting.popleft()
                entry = self._encode(item)
                if entry is not None:
                    entries.append(entry)
                    if len(entries) >= MAX_ENTRIES_PER_MESSAGE:
                        self._flush_entries(entries)
                        entries = []
                continue
            waiting.popleft()
            self._flush_entries(entries)
            entries = []
            if kind == DONE:
                step = item[1]
                self._done_through = max(self._done_through, step)
                self._enqueue(
                    lambda seq, step=step: protocol.encode_done(self.producer_id, seq, step), 0
                )
            else:  # FLUSH marker: set once everything before it is acknowledged
                self._flush_waiters.append((self._next_seq - 1, item[1]))
        self._flush_entries(entries)

    def _launch(self, item: tuple) -> tuple:
        """Queue the device work of a call; a failure (a CUDA error) loses that call's
        values, counted, never raised."""
        for pending in item[4]:
            try:
                pending.launch()
            except Exception as exc:
                self._gpu_failed(item, exc)
                return (LOG, item[1], item[2], None, item[4], item[5])
        return item

    def _ready(self, item: tuple) -> tuple | None:
        """``item`` once its GPU values are all there (without them, payload None, if reading
        them failed); None while the device is still behind."""
        if item[3] is None:
            return item
        try:
            if all(p.ready() for p in item[4]):
                return item
            return None
        except Exception as exc:
            self._gpu_failed(item, exc)
            return (LOG, item[1], item[2], None, item[4], item[5])

    def _gpu_failed(self, item: tuple, exc: BaseException) -> None:
        self.counters.errors += 1
        self.warn_once(
            f"gpu:{type(exc).__name__}",
            f"a log() call's GPU values could not be read ({exc!r}); that call is dropped",
        )

    def _encode(self, item: tuple) -> list | None:
        _, step, t, payload, waits, _ = item
        if self._step is None or step >= self._step[0]:
            self._step = (step, t)
        if payload is None:
            entry = None
        else:
            try:
                entry = self._entry(step, t, payload)
            except Exception as exc:  # never let one bad value kill the thread
                self.counters.errors += 1
                self.warn_once(
                    f"encode:{type(exc).__name__}", f"could not encode a log() call: {exc}"
                )
                entry = None
        for pending in waits:
            try:
                pending.release()
            except Exception:  # releasing an event cannot fail in a way that matters
                self.counters.errors += 1
        return entry

    # ------------------------------------------------------------------ GPU state

    def _sample_gpus(self, step: int, t: float) -> None:
        """Read the GPUs through NVML and log the readings at ``step`` with time ``t`` (the
        time of that step's own call, so a reading never moves the step's end)."""
        nvml = self._nvml
        if nvml is None or self._gpu_sample_s <= 0 or not nvml.start():
            return
        try:
            readings = nvml.sample()
        except Exception as exc:
            self.counters.errors += 1
            self.warn_once("nvml", f"reading the GPUs through NVML failed: {exc!r}")
            return
        self._next_gpu_sample = time.monotonic() + self._gpu_sample_s
        if readings:
            self._waiting.append((LOG, step, t, readings, (), False))

    def _sample_gpus_now(self) -> None:
        """The periodic reading, at the latest step this producer is still in."""
        if (
            self._gpu_sample_s > 0
            and self._step is not None
            and self._step[0] > self._done_through
            and time.monotonic() >= self._next_gpu_sample
        ):
            self._sample_gpus(*self._step)

    def _flush_entries(self, entries: list[list]) -> None:
        if entries:
            batch = list(entries)
            self._enqueue(
                lambda seq: protocol.encode_metrics(self.producer_id, seq, batch), len(batch)
            )

    def _cycle(self) -> None:
        self._watch_connection()
        self._read_acks()
        self._register()
        self._drain()
        self._sample_gpus_now()
        self._check_stall()
        self._pump()
        self._read_acks()

    # ------------------------------------------------------------------ the loop

    def run(self) -> None:
        try:
            beats = 0
            next_beat = time.monotonic() + self.heartbeat_s
            while not self.stopping.is_set():
                longest = GPU_POLL_S if self._waiting else POLL_S
                if self.wake.wait(min(longest, max(0.0, next_beat - time.monotonic()))):
                    # Let a burst of log() calls gather so they leave as one message.
                    time.sleep(COALESCE_S)
                self.wake.clear()
                self._cycle()
                if time.monotonic() >= next_beat:
                    beats += 1
                    if beats % HELLO_EVERY == 0:
                        self._hello()
                    self._send_raw(
                        protocol.encode_heartbeat(self.producer_id, self._next_seq, self.stats())
                    )
                    next_beat = time.monotonic() + self.heartbeat_s
            deadline = time.monotonic() + self.close_timeout_s
            self._drain()
            # Keep a share of the time for the goodbye, even if the GPU never catches up.
            self._wait_for_gpu(deadline - min(0.5, self.close_timeout_s / 4))
            self._enqueue(lambda seq: protocol.encode_bye(self.producer_id, seq, self.stats()), 0)
            self._finish(deadline)
        except Exception as exc:  # the thread must end cleanly, whatever happened
            self.counters.errors += 1
            log.error("rlpulse sender stopped on an unexpected error: %r", exc)
        finally:
            if self._nvml is not None:
                self._nvml.close()
            self._monitor.close(linger=0)
            self._socket.close(linger=0)
            self._context.term()
            for _, event in self._flush_waiters:
                event.set()

    def _wait_for_gpu(self, deadline: float) -> None:
        """At close: let calls still waiting for their GPU values finish, until the deadline;
        what is still waiting then is dropped and counted (``dropped_send``)."""
        while self._waiting and time.monotonic() < deadline:
            time.sleep(GPU_POLL_S)
            self._drain()
        lost = sum(1 for item in self._waiting if item[0] == LOG)
        if lost:
            self.counters.dropped_send += lost
            log.warning(
                "rlpulse producer %s/%s closed with %d log() calls still waiting for the GPU",
                self.identity["role"],
                self.identity["rank"],
                lost,
            )
        for item in self._waiting:
            if item[0] == FLUSH:
                item[1].set()
        self._waiting.clear()

    def _finish(self, deadline: float) -> None:
        """Until the deadline, send what is unacked and wait for the acknowledgements. A
        producer that has been connected waits for a restarting collector to come back; one
        that never reached a collector waits for a connection still being set up, but stops
        as soon as one is refused (nobody listening)."""
        while self._unacked and time.monotonic() < deadline:
            if not self._connected:
                self._refused = False
                self._watch_connection(wait_s=deadline - time.monotonic())
                if not self._connected and not self._ever_connected:
                    break
            self._cycle()
            if self._unacked:
                time.sleep(0.005)
        self._socket.disable_monitor()
        if self._unacked:
            lost = sum(item.entries for item in self._unacked)
            if lost:
                self.counters.dropped_send += lost
                log.warning(
                    "rlpulse producer %s/%s closed with %d unacknowledged log() calls (no collector answered in time)",
                    self.identity["role"],
                    self.identity["rank"],
                    lost,
                )
