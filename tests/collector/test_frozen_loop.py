"""A gap in the collector's own loop does not count against its producers (issue 38, item 2).

The daemon on a real loopback socket with real producers, driven pass by pass with a clock the
test moves: a freeze is the clock jumping between two passes while nothing was received, as
when SIGSTOP lands while the collector is busy and the pass it wakes in settles before it reads
what the producers sent meanwhile (the end-to-end version, with a real SIGSTOP, is
tests/integration/test_frozen_collector.py)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from rlpulse.collector.config import CollectorConfig
from rlpulse.collector.daemon import BATCH, Collector
from rlpulse.collector.loopclock import LOOP_GAP_S
from rlpulse.producer import Producer
from rlpulse.producer.config import ProducerConfig
from rlpulse.schemas.record import StepRecord

LIVENESS_S = 10.0


class Recorder:
    name = "recorder"

    def __init__(self) -> None:
        self.records: list[StepRecord] = []

    def open(self) -> None:
        pass

    def write(self, record: StepRecord) -> None:
        self.records.append(record)

    def close(self) -> None:
        pass


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def passes(collector: Collector, clock: Clock, until: Callable[[], bool]) -> None:
    """Run the daemon's passes (receive, settle) in real time, the clock a little each pass."""
    deadline = time.monotonic() + 20
    while not until():
        assert time.monotonic() < deadline, "timed out"
        clock.t += 0.01
        collector._receive(BATCH)
        collector._settle()
        time.sleep(0.01)


def test_a_freeze_longer_than_liveness_presumes_no_producer_dead() -> None:
    clock, recorder = Clock(), Recorder()
    config = CollectorConfig.from_mapping(
        {"bind": "tcp://127.0.0.1:*", "settle_s": 0, "grace_s": 30, "liveness_s": LIVENESS_S}
    )
    collector = Collector(config, sinks={"recorder": recorder}, clock=clock)
    collector.fanout.start()
    producers = [
        Producer(
            collector.address,
            run="frozen",
            role="actor_train",
            rank=rank,
            world_size=2,
            config=ProducerConfig(gpu_sample_s=0, close_timeout_s=10),
        )
        for rank in range(2)
    ]
    try:
        for step in range(2):
            for rank, p in enumerate(producers):
                p.log({"x": 10.0 * step + rank}, step=step)
        passes(collector, clock, lambda: collector.health.steps_emitted >= 1)
        passes(collector, clock, lambda: all(p.stats()["unacked"] == 0 for p in producers))

        clock.t += 3 * LIVENESS_S  # frozen: nothing received, the producers ran on
        collector._settle()  # the pass it wakes in settles before it reads anything
        assert collector.health.partial_steps == 0, "step 1 flagged partial: ranks presumed dead"

        for rank, p in enumerate(producers):
            p.log({"x": 20.0 + rank}, step=2)
        passes(collector, clock, lambda: collector.health.steps_emitted >= 2)
        closing = [threading.Thread(target=p.close) for p in producers]
        for thread in closing:
            thread.start()
        passes(collector, clock, lambda: not any(t.is_alive() for t in closing))
        passes(collector, clock, lambda: collector.health.steps_emitted >= 3)
    finally:
        for p in producers:
            p.close(timeout=0)
        collector.stop()
        collector.close()
    assert collector.health.partial_steps == 0 and collector.health.late == 0
    assert collector.health.paused_seconds >= 3 * LIVENESS_S - LOOP_GAP_S
