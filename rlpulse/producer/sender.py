"""The producer's background thread: takes queued ``log()`` calls in order, waits for their GPU
values, encodes, sends, resends until acknowledged, reads the GPUs, says goodbye.

Only this thread touches the transport (sockets are not thread-safe). It wakes when the caller
queues work, and at least every ``POLL_S`` (every ``GPU_POLL_S`` while a call waits for its
GPU values) to read acknowledgements and send heartbeats. Calls are drained into as few
messages as possible: one frame with many entries is an order of magnitude cheaper than one
frame each, up to ``MAX_ENTRIES_PER_MESSAGE`` entries and ``protocol.MAX_PAYLOAD_BYTES``
bytes (a collector refuses a larger message; a call larger than that alone is dropped and
counted, ``dropped_oversized``). Nothing a call holds may stop this thread: a call that
cannot be encoded is dropped and counted. A message the collector refused anyway is
acknowledged as rejected, and its calls are counted (``dropped_rejected``), not resent.
The link protocol (hello, registration, sending, acknowledgements, heartbeats) is
:class:`~rlpulse.producer.link.Session`'s; encoding is
:class:`~rlpulse.producer.encode.Encoder`'s; the items queued for this thread and its wake-up
are ``rlpulse.producer.handoff``'s.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from rlpulse.producer.buffers import Buffers
from rlpulse.producer.config import ProducerConfig, goodbye_share_s
from rlpulse.producer.copies import reduce_copies
from rlpulse.producer.encode import INVALID, Encoder
from rlpulse.producer.gpustate import GpuReadings, NvmlSampler
from rlpulse.producer.handoff import Call, CallerFirst, Done, Flush, Item, Wake
from rlpulse.producer.link import Session
from rlpulse.producer.outbox import Outbox, Registration
from rlpulse.producer.pending import MAX_INCOMPLETE, IncompleteSteps, RowBytes
from rlpulse.producer.stats import Counters
from rlpulse.schemas import protocol
from rlpulse.wire.transport import Transport

log = logging.getLogger("rlpulse.producer")


MAX_ENTRIES_PER_MESSAGE = 256
HELLO_EVERY = 5
"""Heartbeats between re-registrations, so a restarted collector learns who we are."""
POLL_S = 0.1
"""Longest sleep of the sender: acknowledgements and the connection are checked this often."""
GPU_POLL_S = 0.002
"""How often the sender looks at CUDA events while log() calls wait for their GPU values."""
YIELD_S = 0.002
"""Longest the sender waits for ``log()`` calls to end in one cycle (:class:`CallerFirst`)."""
COALESCE_S = 0.0005
"""After a wake-up, how long queued calls may gather before they are sent as one message."""
CYCLE_S = 0.005
"""Shortest time from one wake-up's work to the next: calls that come faster than one per
``CYCLE_S`` leave together (a wake-up and a cycle of the sender cost about 100 µs of CPU
whatever they carry), the later ones at most ``CYCLE_S`` late; a call after a pause goes
out after ``COALESCE_S``. Training calls ``log()`` a few times per step, seconds apart, so
this only gathers bursts: at one 60-scalar call a millisecond, 5 ms instead of 2 ms took the
process's CPU per call from 178-205 to 156-160 µs (the floor's: 103-124 µs)."""


class Sender(threading.Thread):
    """Drains ``queue`` into ``transport``; ``counters`` are this thread's own."""

    def __init__(
        self,
        *,
        config: ProducerConfig,
        registration: Registration,
        queue: deque[Item],
        wake: Wake,
        transport: Transport,
        encoder: Encoder,
        stats: Callable[[], dict[str, int]],
        warn_once: Callable[[str, str], None],
        nvml: NvmlSampler | None = None,
        buffers: Buffers | None = None,
        caller: CallerFirst | None = None,
        address: str = "",
    ) -> None:
        ident = registration.identity
        super().__init__(name=f"rlpulse-sender-{ident.role}-{ident.rank}", daemon=True)
        self.config = config
        self.registration = registration
        self.producer_id = registration.producer_id
        self.queue = queue
        self.wake = wake
        self.transport = transport
        self.encoder = encoder
        self.counters: Counters = encoder.counters
        self.stats = stats
        self.warn_once = warn_once
        self.gpus = GpuReadings(nvml, config.gpu_sample_s, self.counters, warn_once)
        self.buffers = buffers
        """Where the host copies' arrays go back once reduced (``log()`` reuses them)."""
        self.caller = caller or CallerFirst()
        self._yield_until = 0.0
        """Until when this cycle waits for ``log()`` calls (:class:`CallerFirst`)."""
        self._stopping = threading.Event()
        self._close_timeout_s = config.close_timeout_s
        self._deadline = math.inf
        """When ``close()`` must be over (``time.monotonic()``), from :meth:`stop`."""
        self.outbox = Outbox(
            max_messages=config.max_unacked,
            max_bytes=config.max_unacked_bytes,
            resend_s=config.resend_s,
        )
        self.link = Session(
            transport=transport,
            registration=registration,
            outbox=self.outbox,
            counters=self.counters,
            tables=lambda: encoder.tables,
            stats=stats,
            warn_once=warn_once,
            stopping=self._stopping,
            resend_s=config.resend_s,
            max_unacked=config.max_unacked,
            address=address,
        )
        """The link protocol: hello, registration, sending, acknowledgements, heartbeats."""
        self._waiting: deque[Item] = deque()
        """Queued calls in order, the oldest waiting for its GPU values to arrive."""
        self.released_bytes = 0
        """Host copies ``log()`` made (``Call.copied``) that this thread reduced and let go:
        written here only; the producer compares it with the bytes it copied."""
        self.released_pending = 0
        """Bytes of ``Samples`` rows (``Call.pending``) this thread reduced or dropped and let
        go, as ``released_bytes`` (``rlpulse.producer.pending``)."""
        self.incomplete = IncompleteSteps()
        """Steps that lost values here or in ``log()``: told to the collector."""
        self.row_bytes = RowBytes()
        """The size of each name's rows, learned here, for ``log()``'s estimates."""
        self._step: tuple[int, float] | None = None
        """The latest step a log() call reached the sender with, and that call's time."""
        self._done_through = -1

    @property
    def unacked(self) -> int:
        return self.outbox.unacked

    @property
    def recorded_run(self) -> str:
        """The run the collector records us under, when it says it is not ours (an attempt)."""
        return self.link.recorded_run

    def stop(self, timeout_s: float) -> None:
        """Ask the thread to send what is queued, say goodbye and end within ``timeout_s``
        seconds; the caller then joins it. ``Samples`` rows not reduced by the last share of
        that time (``config.goodbye_share_s``) are dropped, counted, and their
        steps told to the collector as incomplete."""
        self._close_timeout_s = timeout_s
        self._deadline = time.monotonic() + timeout_s
        self.encoder.samples.cutoff = self._deadline - goodbye_share_s(timeout_s)
        self._stopping.set()
        self.wake.set()

    # ------------------------------------------------------------------ the connection

    # ------------------------------------------------------------------ the queue

    def _drain(self) -> None:
        """Take every queued call in order: launch its GPU work, then encode the calls whose
        values are all there, stopping at the first that still waits (order is kept)."""
        queue, waiting = self.queue, self._waiting
        while queue:
            item = queue.popleft()
            if type(item) is Call:
                item = self._launch(item)
                if item.phase_end:  # read the GPUs now, near the phase's boundary
                    self._sample_gpus(item.step, item.time)
            waiting.append(item)
        entries: list[tuple] = []
        size = 0  # what the entries take in a message, at most (protocol.packed_bytes)
        while waiting:
            item = waiting[0]
            if type(item) is Call:
                ready = self._ready(item)
                if ready is None:
                    break
                waiting.popleft()
                self.caller.wait(self._yield_until)
                encoded = self._encode(ready)
                if encoded is not None:
                    entry, nbytes = encoded
                    if entries and (
                        len(entries) >= MAX_ENTRIES_PER_MESSAGE
                        or size + nbytes > protocol.MAX_PAYLOAD_BYTES
                    ):
                        self._flush_entries(entries)
                        entries, size = [], 0
                    entries.append(entry)
                    size += nbytes
                continue
            waiting.popleft()
            if type(item) is Done:
                self._done_through = max(self._done_through, item.step)
                self._flush_entries(entries, done=item.step)
            else:  # a Flush: set once everything before it is acknowledged
                assert type(item) is Flush  # the queue holds Call, Done and Flush only
                self._flush_entries(entries)
                self.outbox.when_acked(item.acked)
            entries, size = [], 0
        self._flush_entries(entries)

    def _flush_entries(self, entries: list[tuple], done: int = -1) -> None:
        """Number and keep one message of ``entries``; ``done`` >= 0 folds a ``done`` into it
        (or is a message of its own when there are no entries)."""
        if self.encoder.new_tables:  # entries refer to a table the collector has not seen
            self.encoder.new_tables = False
            self.registration.reset()  # no data until a hello with it has gone out
            self.link.say_hello()
        pid = self.producer_id
        # Steps that lost values ride in the next data message (the bye at the latest).
        if entries:
            batch, told = list(entries), self.incomplete.take(MAX_INCOMPLETE)
            self.link.enqueue(
                lambda seq: protocol.encode_metrics(pid, seq, batch, done, told),
                len(batch),
                step=max(entry[0] for entry in batch),  # the hello tells what went out
            )
        elif done >= 0:
            told = self.incomplete.take(MAX_INCOMPLETE)
            self.link.enqueue(lambda seq: protocol.encode_done(pid, seq, done, told), 0)

    def _launch(self, call: Call) -> Call:
        """Queue the device work of a call; a failure (a CUDA error) loses that call's
        values, counted, never raised."""
        for pending in call.waits:
            try:
                pending.launch()
            except Exception as exc:
                self._gpu_failed(exc)
                return call._replace(payload=None)
        return call

    def _ready(self, call: Call) -> Call | None:
        """``call`` once its GPU values are all there (without them, payload None, if reading
        them failed); None while the device is still behind."""
        if call.payload is None:
            return call
        try:
            return call if all(p.ready() for p in call.waits) else None
        except Exception as exc:
            self._gpu_failed(exc)
            return call._replace(payload=None)

    def _gpu_failed(self, exc: BaseException) -> None:
        self.counters.errors += 1
        self.warn_once(
            f"gpu:{type(exc).__name__}",
            f"a log() call's GPU values could not be read ({exc!r}); that call is dropped",
        )

    def _reduce_copies(self, payload: dict[Any, Any], copied: int) -> None:
        """Reduce the host copies of a call (``rlpulse.producer.copies``) and release their
        ``copied`` bytes."""
        for name, failure in reduce_copies(payload, self.buffers):
            payload[name] = INVALID  # counted here; the call's other values still go
            self.counters.invalid += 1
            self.warn_once(f"reduce:{name}", f"{name}: cannot reduce it ({failure.reason})")
        self.released_bytes += copied

    def _encode(self, call: Call) -> tuple[tuple, int] | None:
        """The wire entry of a call and its size in a message at most; None when nothing is
        left to send of it (dropped and counted, if it was too large). A call that lost
        values before they were sent makes its step incomplete (told to the collector)."""
        step, t, payload, waits, _, copied, held, incomplete = call
        if self._step is None or step >= self._step[0]:
            self._step = (step, t)
        encoded = None
        if payload is None:
            incomplete = True
        else:
            if held:
                self.row_bytes.learn(payload)
            if copied:
                self._reduce_copies(payload, copied)
            try:
                entry = self.encoder.entry(step, t, payload)
                if entry is not None:
                    encoded = (entry, protocol.packed_bytes(entry))
            except Exception as exc:  # never let one bad value kill the thread
                self.counters.errors += 1
                incomplete = True
                self.warn_once(
                    f"encode:{type(exc).__name__}", f"could not encode a log() call: {exc}"
                )
            if self.encoder.gave_up:
                self.encoder.gave_up, incomplete = False, True
        self.released_pending += held
        for pending in waits:
            try:
                pending.release()
            except Exception:  # giving back an event: nothing to lose, but count it
                self.counters.errors += 1
        if encoded is not None and encoded[1] > protocol.MAX_PAYLOAD_BYTES:
            self.incomplete.add(step)
            self.counters.dropped_oversized += 1
            self.warn_once(
                "oversized",
                f"a log() call at step {step} takes up to {encoded[1]} bytes, more than the "
                f"{protocol.MAX_PAYLOAD_BYTES} a message may hold: dropped (counted in stats() "
                "as dropped_oversized); log fewer names per call",
            )
            return None
        if incomplete:
            self.incomplete.add(step)
        return encoded

    # ------------------------------------------------------------------ GPU state

    def _sample_gpus(self, step: int, t: float) -> None:
        """Read the GPUs and log the readings at ``step`` with time ``t`` (the time of that
        step's own call, so a reading never moves the step's end)."""
        readings = self.gpus.read()
        if readings:
            self._waiting.append(Call(step, t, readings, (), False))

    def _sample_gpus_now(self) -> None:
        """The periodic reading, at the latest step this producer is still in."""
        step = self._step
        if step is not None and step[0] > self._done_through and self.gpus.due():
            self._sample_gpus(*step)

    # ------------------------------------------------------------------ the loop

    def _cycle(self) -> None:
        self._yield_until = time.monotonic() + YIELD_S
        self.caller.wait(self._yield_until)
        self.link.watch()
        self.link.read_acks()
        self.link.register()
        self._drain()
        self._sample_gpus_now()
        now = time.monotonic()
        self.link.warn_if_silent(now)
        if self.outbox.stalled(now):  # acknowledgements stall: ask for one (or resend, to
            if self.outbox.asking:  # a collector that does not ask for what it lacks)
                self.link.heartbeat(flush=True)
            else:
                self.counters.resent_messages += self.outbox.resend_all(now)
        self.link.pump()
        if self.outbox.awaited or self._stopping.is_set():
            self.link.ask_for_acks(now)
            self.link.read_acks()  # what came meanwhile: a flush or close ends the sooner
        # Otherwise acknowledgements wait for the next cycle's first read: one socket call
        # fewer a cycle, and an ack is rarely back within the cycle that sent its message.

    def run(self) -> None:
        try:
            beats = 0
            heartbeat_s = self.config.heartbeat_s
            next_beat = time.monotonic() + heartbeat_s
            cycled = 0.0
            while not self._stopping.is_set():
                longest = GPU_POLL_S if self._waiting else POLL_S
                if self.wake.wait(min(longest, max(0.0, next_beat - time.monotonic()))):
                    # Let a burst of log() calls gather so they leave as one message.
                    time.sleep(max(COALESCE_S, cycled + CYCLE_S - time.monotonic()))
                self.wake.clear()
                self._cycle()
                cycled = time.monotonic()
                if time.monotonic() >= next_beat:
                    beats += 1
                    if beats % HELLO_EVERY == 0 and self.link.connected:
                        self.link.say_hello()
                    self.link.heartbeat()
                    next_beat = time.monotonic() + heartbeat_s
            self._close()
        except Exception as exc:  # the thread must end cleanly, whatever happened
            self.counters.errors += 1
            log.error("rlpulse sender stopped on an unexpected error: %r", exc)
        finally:
            self.gpus.close()
            self.transport.close()
            self.outbox.release_waiters()
            for item in self._waiting:
                if type(item) is Flush:
                    item.acked.set()

    def _close(self) -> None:
        """Send what is queued, the goodbye, and wait for acknowledgements, until the
        deadline :meth:`stop` set."""
        deadline = self._deadline
        # Held back or not, send everything now: the collector parks what it cannot
        # apply yet, and once the goodbye is among it, applies it all and acknowledges
        # (``rlpulse.collector.intake.delivery``: a closing producer).
        self.outbox.go_on(time.monotonic())
        self._drain()
        # Keep a share of the time for the goodbye, even if the GPU never catches up.
        self._wait_for_gpu(deadline - goodbye_share_s(self._close_timeout_s))
        # Past a full buffer: without the bye the collector would wait for our last step.
        told = self.incomplete.take(MAX_INCOMPLETE)
        pid = self.producer_id
        self.link.enqueue(lambda seq: protocol.encode_bye(pid, seq, self.stats(), told), 0, False)
        self.link.pump()  # at once: sent, it tells the collector even if the time is up
        if self.incomplete.count:
            ident = self.registration.identity
            log.warning(
                "rlpulse producer %s/%s: %s",
                ident.role,
                ident.rank,
                self.incomplete.verdict(self.stats()),
            )
        self.link.finish(deadline, self._cycle, self._close_timeout_s)

    def _wait_for_gpu(self, deadline: float) -> None:
        """At close: let calls still waiting for their GPU values finish, until the deadline;
        what is still waiting then is dropped and counted (``dropped_send``)."""
        while self._waiting and time.monotonic() < deadline:
            time.sleep(GPU_POLL_S)
            self._drain()
        lost = 0
        for item in self._waiting:
            if type(item) is Call:
                lost += 1
                self.incomplete.add(item.step)
                self.released_pending += item.pending
        if lost:
            self.counters.dropped_send += lost
            log.warning(
                "rlpulse producer %s/%s closed with %d log() calls still waiting for the GPU",
                self.registration.identity.role,
                self.registration.identity.rank,
                lost,
            )
        for item in self._waiting:
            if type(item) is Flush:
                item.acked.set()
        self._waiting.clear()
