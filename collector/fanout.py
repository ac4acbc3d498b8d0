"""Fan-out: every sink on its own thread with its own bounded queue.

A sink that raises is retried with exponential backoff and jitter, its errors counted; after
``retries`` failed attempts the step is dropped for that sink (counted, logged). A sink that
hangs fills its own queue and then drops its own steps; nobody else waits for it. At shutdown
every worker drains its queue and closes its sink within ``close_s``; a worker that cannot is
abandoned with an error logged, so the daemon still exits.
"""

from __future__ import annotations

import logging
import queue
import random
import threading
import time
from collections.abc import Callable, Mapping, Sequence

from collector.ratelog import RateLimitedLog
from collector.sinks.base import Sink
from schemas.record import StepRecord

log = logging.getLogger("rlpulse.collector.fanout")
_STOP = object()


class SinkWorker:
    """Feeds one sink from its queue. ``sleep`` and ``clock`` are injectable for tests."""

    def __init__(
        self,
        name: str,
        sink: Sink,
        *,
        queue_size: int = 1024,
        retries: int = 5,
        backoff_s: float = 0.1,
        backoff_max_s: float = 5.0,
        rng: random.Random | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.name = name
        self.sink = sink
        self.retries = retries
        self.backoff_s = backoff_s
        self.backoff_max_s = backoff_max_s
        self._rng = rng or random.Random()
        self._clock = clock
        self._queue: queue.Queue = queue.Queue(maxsize=queue_size)
        self._stopping = threading.Event()
        self._busy_since: float | None = None
        self._ratelog = RateLimitedLog(log)
        self.written = 0
        self.errors = 0
        self.dropped = 0
        self.thread = threading.Thread(target=self._run, name=f"rlpulse-sink-{name}", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def put(self, record: StepRecord) -> None:
        """Queue a step; never blocks. A full queue drops the step for this sink only."""
        try:
            self._queue.put_nowait((self._clock(), record))
        except queue.Full:
            self.dropped += 1
            self._ratelog.warn(
                "full",
                f"sink {self.name}: queue full (sink slow or stuck); dropped step {record.step} of run {record.run!r}",
            )

    def stats(self) -> dict[str, float]:
        oldest = self._busy_since
        if oldest is None:
            try:
                oldest = self._queue.queue[0][0]
            except IndexError:
                oldest = None
        lag = 0.0 if oldest is None else max(0.0, self._clock() - oldest)
        return {
            "queue_depth": self._queue.qsize(),
            "written": self.written,
            "errors": self.errors,
            "dropped": self.dropped,
            "lag_seconds": lag,
        }

    def _backoff(self, attempt: int) -> float:
        base = min(self.backoff_max_s, self.backoff_s * 2**attempt)
        return base * self._rng.uniform(0.5, 1.5)

    def _write(self, record: StepRecord) -> None:
        for attempt in range(self.retries + 1):
            try:
                self.sink.write(record)
                self.written += 1
                return
            except Exception as exc:
                self.errors += 1
                if attempt == self.retries:
                    self.dropped += 1
                    self._ratelog.warn(
                        "gave-up",
                        f"sink {self.name}: gave up on step {record.step} after {attempt + 1} attempts: {exc!r}",
                    )
                    return
                self._ratelog.warn("error", f"sink {self.name}: write failed ({exc!r}); retrying")
                # While stopping, retry without waiting: close_s bounds the whole drain.
                if not self._stopping.is_set():
                    self._stopping.wait(self._backoff(attempt))

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is _STOP:
                break
            enqueued, record = item
            self._busy_since = enqueued
            self._write(record)
            self._busy_since = None
        try:
            self.sink.close()
        except Exception as exc:
            self.errors += 1
            log.error("sink %s: close failed: %r", self.name, exc)

    def stop(self) -> None:
        """Ask the worker to drain and close; the stop marker waits behind queued steps."""
        self._stopping.set()
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
        *,
        queue_size: int = 1024,
        retries: int = 5,
        close_s: float = 10.0,
        backoff_s: float = 0.1,
    ) -> None:
        self.close_s = close_s
        self.workers: Sequence[SinkWorker] = [
            SinkWorker(name, sink, queue_size=queue_size, retries=retries, backoff_s=backoff_s)
            for name, sink in sinks.items()
        ]
        self._closed = False

    def start(self) -> None:
        for worker in self.workers:
            worker.start()

    def put(self, record: StepRecord) -> None:
        for worker in self.workers:
            worker.put(record)

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
                    "sink %s did not flush and close within %.1fs; abandoned (its pending steps are lost)",
                    worker.name,
                    self.close_s,
                )
        return abandoned
