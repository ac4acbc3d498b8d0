"""One bad call never wedges a producer (issue 22, items 4 to 6).

A real collector (the in-process daemon on a ZeroMQ socket, with a sink that records what it
emits) and a real producer. Each test logs something the wire cannot carry as it is, then
ordinary steps, and checks that the ordinary steps arrive and are emitted, that the producer
is not left resending (``flush()`` returns, nothing is unacknowledged), and that every call
that was dropped is counted in ``Producer.stats()``.
"""

from __future__ import annotations

import struct
import sys
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

import zmq

from rlpulse.collector.config import CollectorConfig
from rlpulse.collector.daemon import Collector
from rlpulse.producer import Producer
from rlpulse.producer.config import ProducerConfig
from rlpulse.schemas import protocol
from rlpulse.schemas.messages import DEFAULT_LIMITS, DROP_KEYS, MAX_STEP
from rlpulse.schemas.record import StepRecord

CONFIG = ProducerConfig(resend_s=0.5, close_timeout_s=5.0, gpu_sample_s=0)
WIDE = [f"wide/m{i:05d}" for i in range(10_000)]
"""As many names as one entry may hold: a call of them is 320 kB of states."""


class Recorder:
    """A sink that keeps every emitted step, by run and step."""

    name = "recorder"

    def __init__(self) -> None:
        self.records: dict[tuple[str, int], StepRecord] = {}
        self._lock = threading.Lock()

    def open(self) -> None:
        pass

    def write(self, record: StepRecord) -> None:
        with self._lock:
            self.records[(record.run, record.step)] = record

    def close(self) -> None:
        pass

    def steps(self, run: str) -> set[int]:
        with self._lock:
            return {step for r, step in self.records if r == run}

    def wait(self, run: str, steps: Iterable[int], timeout_s: float = 15.0) -> set[int]:
        """The steps of ``run`` still missing once all of ``steps`` arrived or time ran out."""
        wanted = set(steps)
        deadline = time.monotonic() + timeout_s
        while wanted - self.steps(run) and time.monotonic() < deadline:
            time.sleep(0.02)
        return wanted - self.steps(run)


@contextmanager
def serving(**settings: object) -> Iterator[tuple[Collector, Recorder]]:
    recorder = Recorder()
    config = CollectorConfig.from_mapping(
        {
            "bind": "tcp://127.0.0.1:*",
            "settle_s": 0,
            "grace_s": 30,
            "max_names_per_run": 50_000,
            **settings,
        }
    )
    collector = Collector(config, sinks={"recorder": recorder})
    server = threading.Thread(target=collector.run, daemon=True)
    server.start()
    try:
        yield collector, recorder
    finally:
        collector.stop()
        server.join(30)


@contextmanager
def busy_caller() -> Iterator[None]:
    """The training thread keeps the GIL through a burst of ``log()`` calls (as a busy loop
    does), so the sender drains them all at once into as few messages as it may."""
    interval = sys.getswitchinterval()
    sys.setswitchinterval(2.0)
    try:
        yield
    finally:
        sys.setswitchinterval(interval)


def ordinary_steps(p: Producer, steps: range) -> None:
    for step in steps:
        p.log({"loss": float(step)}, step=step)
    p.step_done(steps[-1])


def assert_not_wedged(p: Producer, recorder: Recorder, run: str, steps: Iterable[int]) -> None:
    assert p.flush(20), "the producer is still waiting for acknowledgements: wedged"
    assert p.stats()["unacked"] == 0
    assert recorder.wait(run, steps) == set(), "later steps were not emitted"


def dropped(stats: dict[str, int]) -> dict[str, int]:
    return {k: stats[k] for k in DROP_KEYS if stats[k]}


# ---------------------------------------------------------------------------- item 4


def test_a_step_beyond_the_wire_range_is_refused_by_log_and_counted() -> None:
    run = "step-2-63"
    with serving() as (collector, recorder):
        p = Producer(collector.address, run=run, role="actor_train", config=CONFIG)
        p.log({"loss": 0.0}, step=0)
        p.log({"loss": 1.0}, step=2**63)  # an int log() took, but a U63 on the wire refuses
        ordinary_steps(p, range(1, 6))
        assert_not_wedged(p, recorder, run, range(6))
        stats = p.stats()
        p.close()
    assert stats["invalid"] == 1 and stats["logged"] == 6 and not dropped(stats)
    assert sum(collector.health.malformed.values()) == 0


def test_the_largest_step_is_emitted_and_one_beyond_it_refused_by_log_and_counted() -> None:
    """Issue 38, item 8: step 2**63 - 1 was acknowledged and never emitted while the collector
    ran (the collector's "finished every step" mark lay below it; only a shutdown flushed it,
    partial). Steps end at ``MAX_STEP``: it is emitted once the producer closes; a larger
    one, 2**63 - 1 included, is refused by ``log()`` and counted."""
    run = "max-step"
    with serving() as (collector, recorder):
        p = Producer(collector.address, run=run, role="actor_train", config=CONFIG)
        p.log({"loss": 1.0}, step=MAX_STEP - 1)
        p.log({"loss": 2.0}, step=2**63 - 1)
        p.log({"loss": 3.0}, step=MAX_STEP + 1)
        p.log({"loss": 4.0}, step=MAX_STEP)
        assert p.flush(20)
        p.close()
        stats = p.stats()
        assert recorder.wait(run, [MAX_STEP - 1, MAX_STEP]) == set()
        record = recorder.records[(run, MAX_STEP)]
        assert record.metrics["loss"] == 4.0 and not record.partial
        emitted = recorder.steps(run)
    assert emitted == {MAX_STEP - 1, MAX_STEP}
    assert stats["invalid"] == 2 and stats["logged"] == 2 and not dropped(stats)


def test_a_burst_of_wide_calls_is_split_below_the_message_limit() -> None:
    """40 calls of 10k names are 12.8 MB: they leave as messages the collector accepts."""
    run = "burst"
    with serving() as (collector, recorder):
        p = Producer(collector.address, run=run, role="actor_train", config=CONFIG)
        assert p.flush(10)  # registered: the burst is all that is in flight
        payloads = [dict.fromkeys(WIDE, float(step)) for step in range(40)]
        with busy_caller():
            for step, payload in enumerate(payloads):
                p.log(payload, step=step)
        ordinary_steps(p, range(40, 45))
        assert_not_wedged(p, recorder, run, range(45))
        stats = p.stats()
        p.close()
        assert all(len(recorder.records[(run, s)].metrics) >= 10_000 for s in range(40))
    assert stats["logged"] == 45 and not dropped(stats) and stats["invalid"] == 0
    assert sum(collector.health.malformed.values()) == 0


def test_a_call_larger_than_a_message_alone_is_dropped_and_counted(caplog) -> None:
    """40k names whose samples are all NaN: their counts alone are 10 MB."""
    run = "one-huge-call"
    with serving() as (collector, recorder):
        p = Producer(collector.address, run=run, role="actor_train", config=CONFIG)
        p.log({"loss": 0.0}, step=0)
        p.log({f"nan/{i:0240d}": float("nan") for i in range(40_000)}, step=1)
        ordinary_steps(p, range(2, 6))
        assert_not_wedged(p, recorder, run, [0, *range(2, 6)])
        stats = p.stats()
        p.close()
    assert stats["dropped_oversized"] == 1 and dropped(stats) == {"dropped_oversized": 1}
    assert stats["logged"] == 6
    assert sum(collector.health.malformed.values()) == 0
    warning = next(r.getMessage() for r in caplog.records if "dropped_oversized" in r.message)
    assert "bytes" in warning and str(protocol.MAX_PAYLOAD_BYTES) in warning


# ---------------------------------------------------------------------------- item 5


def test_a_step_of_2_64_does_not_stop_the_sender() -> None:
    run = "step-2-64"
    with serving() as (collector, recorder):
        p = Producer(collector.address, run=run, role="actor_train", config=CONFIG)
        p.log({"loss": 0.0}, step=0)
        p.log({"loss": 1.0}, step=2**64)  # msgpack cannot even encode it
        p.log({"loss": 1.0}, step=10**30)
        ordinary_steps(p, range(1, 6))
        assert_not_wedged(p, recorder, run, range(6))
        assert p._sender.is_alive()
        stats = p.stats()
        p.close()
    assert stats["invalid"] == 2 and stats["logged"] == 6 and stats["errors"] == 0
    assert not dropped(stats)


# ---------------------------------------------------------------------------- item 6


def test_a_name_over_the_length_limit_is_dropped_and_later_tables_still_work() -> None:
    run = "long-name"
    long_name = "x" * (DEFAULT_LIMITS.max_name_length + 1)
    with serving() as (collector, recorder):
        p = Producer(collector.address, run=run, role="actor_train", config=CONFIG)
        ordinary_steps(p, range(10))
        p.log({"loss": 10.0, long_name: 1.0}, step=10)
        for step in range(11, 30):  # a name list the collector has not seen yet
            p.log({"loss": float(step), "acc": 0.5}, step=step)
        p.step_done(29)
        assert_not_wedged(p, recorder, run, range(30))
        stats = p.stats()
        p.close()
        records = [recorder.records[(run, s)] for s in range(30)]
    assert all("loss" in r.metrics and not r.partial for r in records)
    assert all("acc" in r.metrics for r in records[11:])
    assert stats["invalid"] == 1 and not dropped(stats)
    assert sum(collector.health.malformed.values()) == 0


def test_more_names_than_an_entry_may_hold_drops_the_excess_only() -> None:
    run = "many-names"
    with serving() as (collector, recorder):
        p = Producer(collector.address, run=run, role="actor_train", config=CONFIG)
        ordinary_steps(p, range(5))
        p.log({"loss": 5.0, **dict.fromkeys(WIDE, 1.0)}, step=5)  # 10,001 names
        for step in range(6, 10):
            p.log({"loss": float(step), "acc": 0.5}, step=step)
        p.step_done(9)
        assert_not_wedged(p, recorder, run, range(10))
        stats = p.stats()
        p.close()
        wide = recorder.records[(run, 5)].metrics
        later = [recorder.records[(run, s)] for s in range(6, 10)]
    assert "loss" in wide and WIDE[-2] in wide and WIDE[-1] not in wide  # the 10,001st
    assert all("acc" in r.metrics for r in later)
    assert stats["invalid"] == 1 and not dropped(stats)
    assert sum(collector.health.malformed.values()) == 0


def test_the_collector_keeps_the_good_tables_of_a_hello_with_a_bad_one() -> None:
    """A producer that does not apply the limits itself (an older one): its good tables are
    kept, and only the entries of the bad one are lost, each counted."""
    run = "raw-hello"
    bad = ["ok", "y" * (DEFAULT_LIMITS.max_name_length + 1)]
    tables = [
        protocol.TableDecl(0, ["loss"], bytes([1])),
        protocol.TableDecl(1, bad, bytes([1, 1])),
        protocol.TableDecl(2, ["loss", "acc"], bytes([1, 1])),
    ]
    rows = [(0, 1), (1, 2), (2, 2)]  # (table, names) per step, then again
    with serving() as (collector, recorder):
        ctx = zmq.Context()
        sock = ctx.socket(zmq.DEALER)
        sock.connect(collector.address)
        hello = protocol.encode_hello(
            5, 1, run=run, role="actor_train", rank=0, world_size=1, tables=tables
        )
        sock.send(hello)
        one = struct.pack("<4d", 1.0, 1.0, 1.0, 1.0)  # one sample of 1.0: sum, weight, min, max
        entries = [
            protocol.pack_entry(step, time.time(), table, one * n)
            for step, (table, n) in enumerate(rows * 2)
        ]
        sock.send(protocol.encode_metrics(5, 1, entries, done=5))
        acked = 0
        deadline = time.monotonic() + 10
        while acked < 1 and time.monotonic() < deadline:
            if sock.poll(100):
                acked = protocol.decode(sock.recv()).seq
        sock.close(0)
        ctx.term()
        missing = recorder.wait(run, [0, 2, 3, 5])
        emitted = recorder.steps(run)
    assert acked == 1 and not missing
    assert emitted == {0, 2, 3, 5}  # steps 1 and 4 used the bad table
    assert collector.health.malformed["bad_names"] >= 1
    assert collector.health.malformed["bad_table"] == 2


# ---------------------------------------------------------------------------- the last line


def test_a_message_the_collector_rejects_is_acknowledged_as_rejected_and_counted() -> None:
    """A collector configured below what producers send: the burst's messages are refused
    as oversized, yet acknowledged as rejected, so the producer counts those calls and goes
    on instead of resending them forever."""
    run = "small-collector"
    with serving(max_message_bytes=1024 * 1024) as (collector, recorder):
        p = Producer(collector.address, run=run, role="actor_train", config=CONFIG)
        assert p.flush(10)
        payloads = [dict.fromkeys(WIDE, float(step)) for step in range(40)]
        with busy_caller():
            for step, payload in enumerate(payloads):
                p.log(payload, step=step)
        assert p.flush(20), "the rejected messages were never acknowledged: wedged"
        ordinary_steps(p, range(40, 45))
        assert_not_wedged(p, recorder, run, range(40, 45))
        stats = p.stats()
        p.close()
        arrived = recorder.steps(run) & set(range(40))
    assert collector.health.malformed["oversized"] >= 1
    assert stats["dropped_rejected"] == 40 - len(arrived) > 0
    assert dropped(stats) == {"dropped_rejected": stats["dropped_rejected"]}
