"""The server's own metrics: counted per reporting window, streamed to a collector.

Handlers and the batcher record into :class:`ServeMetrics` (a lock, a few counters and the
window's latencies); :class:`Reporter` closes a window every ``interval_s`` and logs it through
a producer with role ``serve`` as one step: ``serve/requests``, ``serve/errors/{kind}`` (every
kind, zeros included), ``serve/tokens_generated``, ``serve/queue_depth``, ``serve/batch_size``
and the ``serve/latency`` histogram (``rlpulse.schemas.serving``). The collector merges replicas and
derives the latency quantiles and running totals.

Windows and batches share :attr:`Reporter.window_lock`: the batcher holds it while it
generates, inside a ``serve/generate`` phase logged under the current window (time and memory,
``time/serve/generate/...`` and ``memory/.../serve/generate/...``), so a window closes only
between batches and a phase is never logged for a window already reported.

>>> m = ServeMetrics()
>>> m.answered(0.012, tokens=5); m.answered(0.002, error="empty_prompt")
>>> payload = m.close_window()
>>> payload["serve/requests"], payload["serve/errors/empty_prompt"], payload["serve/tokens_generated"]
(2, 1, 5)
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any, Protocol

import numpy as np

from rlpulse.schemas import serving as S

log = logging.getLogger("rlpulse.serve")


class MetricsProducer(Protocol):
    """What the reporter needs of a producer (``rlpulse.producer.Producer`` or ``NullProducer``)."""

    def log(self, data: dict[str, Any], step: int) -> None: ...

    def phase(self, infix: str, *, step: int) -> Any: ...

    def close(self, timeout: float | None = None) -> None: ...


class ServeMetrics:
    """One reporting window's counts; thread-safe (handlers and the batcher record into it)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._reset()
        self.totals: Counter[str] = Counter()
        """Since start: answered requests and errors by kind (shown by ``/healthz``)."""

    def _reset(self) -> None:
        self._requests = 0
        self._errors: Counter[str] = Counter()
        self._latencies: list[float] = []
        self._tokens = 0
        self._queue_depth = 0
        self._batch_sizes: list[int] = []

    def answered(self, latency_s: float, *, error: str | None = None, tokens: int = 0) -> None:
        """A /generate request was answered after ``latency_s`` (with ``error``, a kind)."""
        with self._lock:
            self._requests += 1
            self._latencies.append(latency_s)
            self._tokens += tokens
            self.totals["requests"] += 1
            if error is not None:
                self._errors[error] += 1
                self.totals[error] += 1

    def queue_depth(self, depth: int) -> None:
        """The queue held ``depth`` requests just now."""
        with self._lock:
            self._queue_depth = max(self._queue_depth, depth)

    def batched(self, size: int) -> None:
        """A batch of ``size`` requests went to the model."""
        with self._lock:
            self._batch_sizes.append(size)

    def close_window(self, depth_now: int = 0) -> dict[str, Any]:
        """The window's metrics as one producer payload; the next window starts empty."""
        with self._lock:
            payload: dict[str, Any] = {
                S.SERVE_REQUESTS.name: self._requests,
                **{S.SERVE_ERRORS.format(kind=k): self._errors[k] for k in S.ERROR_KINDS},
                S.SERVE_TOKENS_GENERATED.name: self._tokens,
                S.SERVE_QUEUE_DEPTH.name: max(self._queue_depth, depth_now),
                **S.SERVE_LATENCY.observe(self._latencies),
            }
            if self._batch_sizes:
                payload[S.SERVE_BATCH_SIZE.name] = np.asarray(self._batch_sizes, dtype=np.float64)
            self._reset()
        return payload


class Reporter:
    """Closes a window every ``interval_s`` and logs it as step 0, 1, 2... of ``producer``.

    ``depth`` reads the queue depth at the window's end. ``close()`` reports the last
    (partial) window and closes the producer; safe to call twice.
    """

    def __init__(
        self,
        metrics: ServeMetrics,
        producer: MetricsProducer,
        *,
        interval_s: float,
        depth: Callable[[], int] = lambda: 0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.metrics = metrics
        self.producer = producer
        self.interval_s = interval_s
        self.window = 0
        """The window being counted now: the step its metrics are logged under."""
        self.window_lock = threading.Lock()
        self._depth = depth
        self._clock = clock
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._closed = False

    def start(self) -> None:
        """Start the reporting thread (idempotent)."""
        if self._thread is None and not self._closed:
            self._thread = threading.Thread(
                target=self._run, name="rlpulse-serve-report", daemon=True
            )
            self._thread.start()

    def _run(self) -> None:
        next_at = self._clock() + self.interval_s
        while not self._stop.wait(max(0.0, next_at - self._clock())):
            next_at += self.interval_s
            self.report()

    def report(self) -> None:
        """Log the current window and start the next (waits for a batch in progress)."""
        with self.window_lock:
            try:
                self.producer.log(self.metrics.close_window(self._depth()), step=self.window)
            except Exception:  # the producer never raises; a bug here must not stop serving
                log.exception("serve: reporting window %d failed", self.window)
            self.window += 1

    def close(self) -> None:
        """Report the last window, stop the thread and close the producer (idempotent)."""
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.interval_s + 30)
        self.report()
        self.producer.close()
