"""A sink that raises or hangs never holds up the others, and shutdown stays bounded."""

from __future__ import annotations

import threading
import time

from rlpulse.collector.config import CollectorConfig
from rlpulse.collector.output.fanout import FanOut, SinkWorker
from rlpulse.schemas.record import StepRecord


class Recording:
    def __init__(self) -> None:
        self.records: list[tuple[float, StepRecord]] = []
        self.closed = False

    def open(self) -> None:
        pass

    def write(self, record: StepRecord) -> None:
        self.records.append((time.monotonic(), record))

    def close(self) -> None:
        self.closed = True


class Flaky(Recording):
    def __init__(self, failures: int) -> None:
        super().__init__()
        self.failures = failures

    def write(self, record: StepRecord) -> None:
        if self.failures:
            self.failures -= 1
            raise OSError("backend unavailable")
        super().write(record)


class Hanging(Recording):
    def __init__(self) -> None:
        super().__init__()
        self.release = threading.Event()

    def write(self, record: StepRecord) -> None:
        self.release.wait()


class AlwaysFails(Recording):
    def write(self, record: StepRecord) -> None:
        raise RuntimeError("broken")


def rec(step: int) -> StepRecord:
    return StepRecord(run="r", step=step, metrics={"x": float(step)})


def test_failing_and_hanging_sinks_do_not_delay_a_healthy_one() -> None:
    good, hang, bad = Recording(), Hanging(), AlwaysFails()
    fan = FanOut(
        {"good": good, "hang": hang, "bad": bad},
        CollectorConfig(sink_queue=4, sink_retries=2, sink_close_s=1.0),
        backoff_s=0.001,
    )
    fan.start()
    emitted = []
    for step in range(20):
        emitted.append(time.monotonic())
        fan.put(rec(step))
        time.sleep(0.005)
    time.sleep(0.2)
    assert [r.step for _, r in good.records] == list(range(20))
    delays = [t - e for (t, _), e in zip(good.records, emitted, strict=True)]
    assert max(delays) < 0.1
    stats = fan.stats()
    assert (
        stats["hang"]["dropped"] > 0
        and stats["hang"]["queue_depth"] == 4
        and stats["hang"]["lag_seconds"] > 0.1
    )
    assert stats["bad"]["errors"] == 60 and stats["bad"]["dropped"] == 20
    started = time.monotonic()
    abandoned = fan.close()
    assert abandoned == ["hang"] and time.monotonic() - started < 2.0
    assert good.closed and bad.closed
    hang.release.set()


def test_transient_failures_are_retried_with_backoff_and_nothing_is_lost() -> None:
    sink = Flaky(failures=3)
    waits: list[float] = []
    worker = SinkWorker("flaky", sink, CollectorConfig(sink_retries=5), backoff_s=0.01)
    original = worker._backoff
    worker._backoff = lambda attempt: waits.append(original(attempt)) or 0.0  # type: ignore[method-assign]
    worker.start()
    worker.put(rec(0))
    worker.put(rec(1))
    deadline = time.monotonic() + 5
    while len(sink.records) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    worker.stop()
    worker.thread.join(2)
    assert [r.step for _, r in sink.records] == [0, 1]
    assert worker.errors == 3 and worker.dropped == 0
    # exponential with jitter in [0.5, 1.5) of 0.01 * 2**attempt
    assert 0.005 <= waits[0] < 0.015 and 0.01 <= waits[1] < 0.03 and 0.02 <= waits[2] < 0.06


def test_close_drains_queued_steps_first() -> None:
    sink = Recording()
    fan = FanOut({"s": sink}, CollectorConfig(sink_close_s=5))
    fan.start()
    for step in range(100):
        fan.put(rec(step))
    assert fan.close() == []
    assert len(sink.records) == 100 and sink.closed
    assert fan.close() == []  # idempotent


def test_backlog_with_the_outbox_is_what_the_sink_has_not_written(tmp_path) -> None:
    from rlpulse.collector.durability.durable import DurableState

    config = CollectorConfig(sink_close_s=5)
    durable = DurableState(tmp_path / "state", config)
    hang = Hanging()
    fan = FanOut({"hang": hang}, config, durable=durable)
    (worker,) = fan.workers
    fan.start()
    assert worker.backlog() == 0
    for step in range(3):
        durable.emit(rec(step))
    durable.commit()
    fan.notify()
    assert worker.backlog() == 3 and fan.stats()["hang"]["queue_depth"] == 3
    hang.release.set()
    deadline = time.monotonic() + 5
    while worker.backlog() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert worker.backlog() == 0
    assert fan.close() == []
    durable.close()


class SamplesFailing(Recording):
    """A tracker that wrote the numbers of two steps but not their samples."""

    samples_failed = 2


def test_a_sinks_samples_failures_are_counted_on_metrics() -> None:
    from rlpulse.collector.health import Health
    from rlpulse.collector.sinks.base import SinkContext
    from rlpulse.collector.sinks.prometheus import PrometheusSink
    from tests.support.prom import scrape_registry

    fan = FanOut({"tb": SamplesFailing(), "plain": Recording()}, CollectorConfig(sink_close_s=5))
    fan.start()
    health = Health(sinks=fan.stats)
    prom = PrometheusSink.from_kwargs({"port": 0}, SinkContext(health=health.snapshot))
    try:
        got = scrape_registry(prom.registry)
    finally:
        prom.close()
        fan.close()
    assert got[("rlpulse_sink_samples_failed_total", frozenset({("sink", "tb")}))] == 2
    assert got[("rlpulse_sink_samples_failed_total", frozenset({("sink", "plain")}))] == 0
