"""Dynamic batching: requests wait in a bounded queue; one thread takes what is queued (up to
``max_batch_size``) and generates for all of it in one model call.

While the model works on a batch, new requests queue up, and the next batch takes them all:
under load batches grow by themselves, and a lone request waits for no one
(``batch_wait_ms`` can trade latency for larger batches). A full queue refuses at once
(``overloaded``, HTTP 503) instead of letting latency grow without bound. Generation runs on
this thread, never on the server's event loop, so ``/healthz`` and input checks stay fast.

>>> # batcher = Batcher(engine, reporter, max_batch_size=32, max_queue=256, batch_wait_s=0)
>>> # batcher.start(); answer = await asyncio.wrap_future(batcher.submit(job))
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Protocol

from rlpulse.schemas import serving as S
from rlpulse.schemas.topology import GENERATE, SERVE
from rlpulse.trainer.serve.engine import Answer, Job
from rlpulse.trainer.serve.requests import RequestError
from rlpulse.trainer.serve.telemetry import Reporter

log = logging.getLogger("rlpulse.serve")
PHASE = f"{SERVE}/{GENERATE}"
"""The producer phase each batch runs in: time/serve/generate/... and memory/.../serve/generate/..."""


class Generator(Protocol):
    """What the batcher needs of the model (``rlpulse.trainer.serve.engine.Engine``)."""

    def generate(self, jobs: Sequence[Job]) -> list[Answer]: ...


class Batcher:
    """The queue and the thread that drains it into model calls."""

    def __init__(
        self,
        engine: Generator,
        reporter: Reporter,
        *,
        max_batch_size: int,
        max_queue: int,
        batch_wait_s: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.engine = engine
        self.reporter = reporter
        self.max_batch_size = max_batch_size
        self.batch_wait_s = batch_wait_s
        self._queue: queue.Queue[Job] = queue.Queue(maxsize=max_queue)
        self._clock = clock
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.batches = 0

    def depth(self) -> int:
        """Requests waiting now."""
        return self._queue.qsize()

    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> None:
        """Start the generation thread (idempotent)."""
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._run, name="rlpulse-serve-batcher", daemon=True
            )
            self._thread.start()

    def submit(self, job: Job) -> Future[Answer]:
        """Queue ``job``; its future gets the answer. RequestError(overloaded) when full."""
        if self._stop.is_set():
            raise RequestError(
                S.OVERLOADED, "the server is shutting down; retry on another replica"
            )
        job.queued_at = self._clock()
        try:
            self._queue.put_nowait(job)
        except queue.Full:
            raise RequestError(
                S.OVERLOADED,
                f"{self._queue.maxsize} requests are already waiting; retry later",
            ) from None
        self.reporter.metrics.queue_depth(self._queue.qsize())
        return job.future

    def _take(self) -> list[Job]:
        """The next batch: the first request (waiting for one), then whatever else is queued,
        for up to ``batch_wait_s`` more."""
        try:
            batch = [self._queue.get(timeout=0.05)]
        except queue.Empty:
            return []
        self.reporter.metrics.queue_depth(self._queue.qsize() + 1)
        deadline = self._clock() + self.batch_wait_s
        while len(batch) < self.max_batch_size:
            wait = deadline - self._clock()
            try:
                batch.append(
                    self._queue.get(timeout=wait) if wait > 0 else self._queue.get_nowait()
                )
            except queue.Empty:
                break
        return batch

    def _run(self) -> None:
        while not self._stop.is_set():
            batch = self._take()
            if batch:
                self._generate(batch)

    def _generate(self, batch: list[Job]) -> None:
        reporter = self.reporter
        reporter.metrics.batched(len(batch))
        self.batches += 1
        try:
            with reporter.window_lock, reporter.producer.phase(PHASE, step=reporter.window):
                answers = self.engine.generate(batch)
        except Exception as exc:  # a failed batch fails its requests, never the server
            log.exception("serve: generation failed for a batch of %d", len(batch))
            error = RequestError(
                S.INTERNAL, f"generation failed on the server: {type(exc).__name__}: {exc}"
            )
            for job in batch:
                _settle(job.future, exception=error)
            return
        for job, answer in zip(batch, answers, strict=True):
            _settle(job.future, result=answer)

    def close(self) -> None:
        """Stop taking batches; requests still queued are refused (overloaded). Idempotent."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=60)
        while True:
            try:
                job = self._queue.get_nowait()
            except queue.Empty:
                break
            _settle(job.future, exception=RequestError(S.OVERLOADED, "the server is shutting down"))


def _settle(
    future: Future[Answer], *, result: Answer | None = None, exception: Exception | None = None
) -> None:
    """Set a future that nobody may still be waiting for (a client that went away)."""
    if future.done():
        return
    if exception is not None:
        future.set_exception(exception)
    else:
        future.set_result(result)  # type: ignore[arg-type]
