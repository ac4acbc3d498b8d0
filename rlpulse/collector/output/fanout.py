"""Fan-out: every sink on its own thread, fed from its own queue or the durable outbox.

A sink that raises is retried with exponential backoff and jitter, its errors counted. A sink
that hangs delays only itself. Two feeds:

* in memory (no ``state_dir``): a bounded queue per sink; after ``retries`` failed attempts a
  step is dropped for that sink, and a full queue drops new steps for it (both counted);
* the outbox (with ``state_dir``): the sink reads emitted steps from disk at its own pace and
  keeps its cursor there, so a sink that is down for minutes catches up, in order and without
  loss, when it recovers; its lag is visible meanwhile. Nothing is dropped; steps that a
  damaged outbox lost before a sink wrote them are counted for that sink (``lost``), and a
  step rebuilt after such damage is never written to a sink twice.

At shutdown every worker writes what it has and closes its sink within ``close_s``; a worker
that cannot is abandoned with an error logged, so the daemon still exits (with the outbox, its
cursor says where to resume next time).
"""

from __future__ import annotations

import contextlib
import logging
import queue
import random
import threading
import time
from collections.abc import Callable, Mapping, Sequence

from rlpulse.collector.config import CollectorConfig
from rlpulse.collector.durability.durable import DurableState
from rlpulse.collector.durability.outbox import OutboxReader
from rlpulse.collector.ratelog import RateLimitedLog
from rlpulse.collector.sinks.base import Sink
from rlpulse.schemas.record import RunForgotten, StepRecord

log = logging.getLogger("rlpulse.collector.output.fanout")
_STOP = object()
_REOPEN = object()
"""Wakes a worker waiting on its queue to reopen its sink's files (SIGHUP)."""
BACKOFF_S = 0.1
"""First wait after a failed write; it doubles per attempt (with jitter) up to BACKOFF_MAX_S."""
BACKOFF_MAX_S = 5.0


class SinkWorker:
    """Feeds one sink. ``clock`` is injectable for tests."""

    def __init__(
        self,
        name: str,
        sink: Sink,
        config: CollectorConfig,
        *,
        backoff_s: float = BACKOFF_S,
        backoff_max_s: float = BACKOFF_MAX_S,
        reader: OutboxReader | None = None,
        rng: random.Random | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.name = name
        self.sink = sink
        self.retries = config.sink_retries
        self.backoff_s = backoff_s
        self.backoff_max_s = backoff_max_s
        self.reader = reader
        self._rng = rng or random.Random()
        self._clock = clock
        self._queue: queue.Queue = queue.Queue(maxsize=config.sink_queue)
        self._notify = threading.Event()
        self._stopping = threading.Event()
        self._busy_since: float | None = None
        self._reopen = False
        """SIGHUP asked the sink to reopen its files, before its next step."""
        self._ratelog = RateLimitedLog(log)
        self._skip: dict[str, int] = {}
        self.written = 0
        self.errors = 0
        self.dropped = 0
        self.thread = threading.Thread(target=self._run, name=f"rlpulse-sink-{name}", daemon=True)

    def start(self) -> None:
        if self.reader is not None and self.reader.state.next_record_seq > 1:
            # What the sink's own output already holds is not written again (a crash between
            # a write and its cursor update would otherwise duplicate one step). Only when the
            # outbox has a history (a restart): a new state_dir's steps are all new, even if
            # the file holds an earlier job's steps under the same run name.
            self._skip = dict(self.sink.written_through())
        self.thread.start()

    def put(self, record: StepRecord) -> None:
        """Queue a step (in-memory feed) or say the outbox has more; never blocks."""
        if self.reader is not None:
            self.wake()
            return
        try:
            self._queue.put_nowait((self._clock(), record))
        except queue.Full:
            if isinstance(record, RunForgotten):
                return  # a stuck sink keeps the run's state a while longer: no step is lost
            self.dropped += 1
            self._ratelog.warn(
                "full",
                f"sink {self.name}: queue full (sink slow or stuck); dropped step {record.step} of run {record.run!r}",
            )

    def reopen(self) -> None:
        """Have the sink reopen its files (SIGHUP), on its own thread, between two steps."""
        self._reopen = True
        self._notify.set()
        if self.reader is None:
            with contextlib.suppress(queue.Full):  # busy: it reopens before its next step
                self._queue.put_nowait((0.0, _REOPEN))

    def _reopened(self) -> None:
        if not self._reopen:
            return
        self._reopen = False
        reopen = getattr(self.sink, "reopen", None)  # sinks made outside rlpulse may lack it
        if reopen is None:
            return
        try:
            reopen()
        except Exception as exc:  # it writes where it is, or tries again at its next step
            self.errors += 1
            self._ratelog.warn("reopen", f"sink {self.name}: reopen failed: {exc!r}")

    def wake(self) -> None:
        """The outbox has new steps: read them now instead of at the next poll."""
        self._notify.set()

    def backlog(self) -> int:
        """Steps not yet written: queued, or in the outbox past this sink's cursor."""
        reader = self.reader
        if reader is None:
            return self._queue.qsize()
        return max(0, reader.state.next_record_seq - 1 - reader.last_seq)

    def stats(self) -> dict[str, float]:
        oldest = self._busy_since
        if oldest is None and self.reader is None:
            try:
                oldest = self._queue.queue[0][0]
            except IndexError:
                oldest = None
        lag = 0.0 if oldest is None else max(0.0, self._clock() - oldest)
        return {
            "queue_depth": self.backlog(),
            "written": self.written,
            "errors": self.errors,
            "dropped": self.dropped,
            "lost": self.reader.lost if self.reader is not None else 0,
            "lag_seconds": lag,
            # A tracker that could not write a step's samples wrote its numbers (the sink
            # counts the failure; sinks without samples report none).
            "samples_failed": getattr(self.sink, "samples_failed", 0),
        }

    def _backoff(self, attempt: int) -> float:
        base = min(self.backoff_max_s, self.backoff_s * 2**attempt)
        return base * self._rng.uniform(0.5, 1.5)

    def _write(self, record: StepRecord, forever: bool) -> bool:
        """Write with retries; True once written. ``forever``: keep trying until stopped."""
        attempt = 0
        while True:
            try:
                self.sink.write(record)
                self.written += 1
                return True
            except Exception as exc:
                self.errors += 1
                give_up = attempt >= self.retries and (not forever or self._stopping.is_set())
                if give_up:
                    if not forever:
                        self.dropped += 1
                    self._ratelog.warn(
                        "gave-up",
                        f"sink {self.name}: gave up on step {record.step} after {attempt + 1} attempts: {exc!r}",
                    )
                    return False
                self._ratelog.warn("error", f"sink {self.name}: write failed ({exc!r}); retrying")
                # While stopping, retry without waiting: close_s bounds the whole drain.
                if not self._stopping.is_set():
                    self._stopping.wait(self._backoff(min(attempt, 30)))
                attempt += 1

    def _run_queue(self) -> None:
        while True:
            item = self._queue.get()
            if item is _STOP:
                return
            enqueued, record = item
            self._reopened()
            if record is _REOPEN:
                continue
            if isinstance(record, RunForgotten):
                self._forget(record.run)
                continue
            self._busy_since = enqueued
            self._write(record, forever=False)
            self._busy_since = None

    def _run_outbox(self) -> None:
        reader = self.reader
        assert reader is not None
        offset = time.time() - self._clock()  # outbox times are wall-clock
        while True:
            self._reopened()
            batch = reader.read() if reader.available() else []
            if not batch:
                if reader.unsaved:
                    reader.save()  # a cursor the disk refused earlier
                if self._stopping.is_set():
                    return
                self._idle()
                self._notify.wait(0.1)
                self._notify.clear()
                continue
            for position, emitted_at, record in batch:
                if isinstance(record, RunForgotten):
                    self._forget(record.run)
                    reader.commit(position, record)
                    continue
                skip = self._skip.get(record.run)
                if (skip is None or record.step > skip) and not reader.done(record):
                    self._busy_since = emitted_at - offset
                    if not self._write(record, forever=True):
                        return  # stopping with a sink that still fails: resume here next start
                reader.commit(position, record)
                self._busy_since = None

    def _forget(self, run: str) -> None:
        """The collector forgot ``run`` (``RunForgotten``): so does the sink; a failure is
        counted and logged, never fatal (the sink keeps the run's state, nothing else)."""
        self._skip.pop(run, None)
        forget = getattr(self.sink, "forget", None)  # sinks made outside rlpulse may not have it
        if forget is None:
            return
        try:
            forget(run)
        except Exception as exc:
            self.errors += 1
            self._ratelog.warn("forget", f"sink {self.name}: forget({run!r}) failed: {exc!r}")

    def _idle(self) -> None:
        """A sink's ``idle()``, where it has one (a relay's upstream: its heartbeats), while
        there is nothing to write; a failure is counted and logged, never fatal."""
        idle = getattr(self.sink, "idle", None)
        if idle is None:
            return
        try:
            idle()
        except Exception as exc:
            self.errors += 1
            self._ratelog.warn("idle", f"sink {self.name}: idle() failed: {exc!r}")

    def _run(self) -> None:
        try:
            self._run_outbox() if self.reader is not None else self._run_queue()
        except Exception as exc:
            self.errors += 1
            log.error("sink %s: worker stopped on an unexpected error: %r", self.name, exc)
        try:
            self.sink.close()
        except Exception as exc:
            self.errors += 1
            log.error("sink %s: close failed: %r", self.name, exc)

    def stop(self) -> None:
        """Ask the worker to write what is pending and close; queued steps go first."""
        self._stopping.set()
        self._notify.set()
        if self.reader is not None:
            return
        while True:
            try:
                self._queue.put(_STOP, timeout=0.1)
                return
            except queue.Full:
                if not self.thread.is_alive():
                    return
                # Stuck sink with a full queue: shed the oldest step to make room for the marker.
                try:
                    self._queue.get_nowait()
                    self.dropped += 1
                except queue.Empty:
                    pass


class FanOut:
    """Hands each emitted step to every sink's worker.

    >>> # fan = FanOut({"jsonl": JsonlSink(...), "stdout": StdoutSink()}); fan.start()
    >>> # fan.put(record); fan.close()
    """

    def __init__(
        self,
        sinks: Mapping[str, Sink],
        config: CollectorConfig,
        *,
        backoff_s: float = BACKOFF_S,
        durable: DurableState | None = None,
    ) -> None:
        self.close_s = config.sink_close_s
        self.workers: Sequence[SinkWorker] = [
            SinkWorker(
                name,
                sink,
                config,
                backoff_s=backoff_s,
                reader=OutboxReader(durable, name) if durable is not None else None,
            )
            for name, sink in sinks.items()
        ]
        self._closed = False

    def start(self) -> None:
        for worker in self.workers:
            worker.start()

    def put(self, record: StepRecord) -> None:
        for worker in self.workers:
            worker.put(record)

    def reopen(self) -> None:
        """Every sink reopens its files before its next step (SIGHUP)."""
        for worker in self.workers:
            worker.reopen()

    def notify(self) -> None:
        """The outbox has new steps (after a commit)."""
        for worker in self.workers:
            worker.wake()

    def stats(self) -> dict[str, dict[str, float]]:
        return {w.name: w.stats() for w in self.workers}

    def close(self) -> list[str]:
        """Drain and close every sink within ``close_s`` in all; return the abandoned ones."""
        if self._closed:
            return []
        self._closed = True
        deadline = time.monotonic() + self.close_s
        for worker in self.workers:
            worker.stop()
        abandoned = []
        for worker in self.workers:
            worker.thread.join(max(0.0, deadline - time.monotonic()))
            if worker.thread.is_alive():
                abandoned.append(worker.name)
                log.error(
                    "sink %s did not flush and close within %.1fs; abandoned",
                    worker.name,
                    self.close_s,
                )
        return abandoned
