"""The producer sends what was logged, never raises or blocks, and closes promptly."""

from __future__ import annotations

import logging
import threading
import time

import numpy as np
import pytest
import torch

from rlpulse.producer import Masked, Producer, Weighted
from rlpulse.producer.config import ProducerConfig
from rlpulse.schemas import Reduction, metrics as M, protocol
from tests.producer.conftest import done_steps, entries, has_bye


def by_name(entry: protocol.Entry) -> dict[str, list[float]]:
    return {n: entry.values[i].tolist() for i, n in enumerate(entry.names)}


def test_registers_then_sends_states(inbox) -> None:
    p = Producer(
        inbox.address,
        run="r",
        role="actor_train",
        rank=1,
        world_size=2,
        reductions={"x/peak": "max"},
    )
    p.log(
        {
            M.ACTOR_PG_LOSS.name: Weighted(0.5, 10),
            M.CRITIC_ADVANTAGES.name: Masked(np.array([1.0, 5.0, 9.0]), np.array([1, 1, 0])),
            "x/peak": 3,
            M.ACTOR_LR.name: 1e-5,
        },
        step=4,
    )
    p.close()
    msgs = inbox.receive(until=has_bye)
    # The first hello may be refused while ZeroMQ still connects (it is repeated until
    # answered), so close()'s heartbeat may come first: the hello is the first *hello*.
    hello = next(m for m in msgs if isinstance(m, protocol.Hello))
    assert (
        hello.run,
        hello.role,
        hello.rank,
        hello.world_size,
    ) == ("r", "actor_train", 1, 2)
    (entry,) = entries(msgs)
    assert entry.step == 4
    got = by_name(entry)
    assert got[M.ACTOR_PG_LOSS.name][:2] == [5.0, 10.0]
    assert got[M.CRITIC_ADVANTAGES.name] == [6.0, 2.0, 1.0, 5.0]
    assert got[M.ACTOR_LR.name] == [1e-5, 1.0, 1e-5, 1e-5]
    kinds = dict(zip(entry.names, entry.kinds, strict=True))
    assert kinds["x/peak"] == Reduction.MAX and kinds[M.ACTOR_LR.name] == Reduction.LAST
    data = [m.seq for m in msgs if isinstance(m, protocol.RELIABLE)]
    assert data == sorted(data)


def test_bad_values_are_dropped_counted_and_the_rest_is_sent(inbox, caplog) -> None:
    caplog.set_level(logging.WARNING, "rlpulse.producer")
    p = Producer(inbox.address, run="r", role="a")
    p.log(
        {"good": 1.0, "bad": "oops", "nan": float("nan"), "t": torch.tensor([1.0, float("inf")])},
        step=0,
    )
    p.log({"x": 1.0}, step=-1)
    p.log({"x": 1.0}, step="3")  # type: ignore[arg-type]
    p.log(None, step=1)  # type: ignore[arg-type]
    p.close()
    (entry,) = entries(inbox.receive(until=has_bye))
    assert set(entry.names) == {"good", "t"} and dict(entry.nonfinite) == {"nan": 1, "t": 1}
    stats = p.stats()
    assert stats["invalid"] == 3 and stats["nonfinite"] == 2 and stats["errors"] == 1
    assert (
        "bad: cannot log a str" in caplog.text
        and "step must be an integer from 0 to" in caplog.text
    )


def test_close_is_prompt_with_no_collector_listening() -> None:
    p = Producer(
        "tcp://127.0.0.1:9", run="r", role="a", config=ProducerConfig(close_timeout_s=5.0)
    )  # nothing listens on port 9
    for step in range(100):
        p.log({"x": float(step)}, step=step)
    started = time.monotonic()
    p.close()
    assert time.monotonic() - started < 1.0
    p.close()  # idempotent


def test_full_queue_drops_and_counts_without_blocking() -> None:
    p = Producer(
        "tcp://127.0.0.1:9", run="r", role="a", config=ProducerConfig(max_pending=10, sndhwm=1)
    )
    p._sender.stop(p.config.close_timeout_s)  # a sender that never drains: the queue only fills
    p._sender.join(5)
    for step in range(50):
        p.log({"x": 1.0}, step=step)
    assert p.stats()["dropped_queue_full"] == 40 and p.stats()["logged"] == 10
    p.close()


def test_unreachable_collector_buffers_up_to_the_bound_then_counts_drops() -> None:
    p = Producer("tcp://127.0.0.1:9", run="r", role="a", config=ProducerConfig(max_unacked=20))
    for step in range(100):
        p.log({"x": 1.0}, step=step)
        assert not p.flush(0.01)  # nobody acknowledges: every call is its own message
    stats = p.stats()
    assert stats["unacked"] == 20 and stats["dropped_buffer_full"] == 80
    started = time.monotonic()
    p.close()
    assert time.monotonic() - started < 1.0
    assert p.stats()["dropped_send"] == 20  # still unacknowledged at close: counted too


def test_the_bye_goes_out_even_when_the_buffer_is_full(inbox) -> None:
    """A full unacked buffer refuses new data (counted), never the bye: without it the
    collector would not know this rank is done, and its last step would wait out the grace
    period (or, with ``state_dir``, stay open after the collector stops)."""
    inbox.acking = False
    p = Producer(
        inbox.address,
        run="r",
        role="a",
        config=ProducerConfig(max_unacked=3, resend_s=0.2, close_timeout_s=5),
    )
    for step in range(5):
        p.log({"x": float(step)}, step=step)
        p.flush(0.05)  # nobody acknowledges: every call is its own message
    assert p.stats()["unacked"] == 3 and p.stats()["dropped_buffer_full"] == 2
    inbox.acking = True
    p.close()
    msgs = inbox.receive(timeout_s=5.0, until=has_bye)
    assert has_bye(msgs) and {e.step for e in entries(msgs)} == {0, 1, 2}  # resent too
    assert p.stats()["dropped_buffer_full"] == 2 and p.stats()["dropped_send"] == 0


def test_unacknowledged_messages_are_resent_and_acks_release_them(inbox) -> None:
    inbox.acking = False
    p = Producer(inbox.address, run="r", role="a", config=ProducerConfig(resend_s=0.2))
    for step in range(5):
        p.log({"x": float(step)}, step=step)
    first = inbox.receive(timeout_s=1.0, until=lambda ms: len(entries(ms)) == 5)
    assert len(entries(first)) == 5 and p.stats()["unacked"] > 0
    # keep the hellos: their name tables decode what is resent (a collector that predates
    # asking for resends, as this inbox: everything again once acknowledgements stall)
    inbox.messages[:] = [m for m in inbox.messages if isinstance(m, protocol.Hello)]
    inbox.acking = True
    again = inbox.receive(timeout_s=3.0, until=lambda ms: len(entries(ms)) == 5)
    assert [e.step for e in entries(again)] == [0, 1, 2, 3, 4]
    assert p.flush(2.0) and p.stats()["unacked"] == 0 and p.stats()["resent_messages"] > 0
    p.close()


def test_hello_is_repeated_until_the_collector_answers_it(inbox) -> None:
    """A hello ZeroMQ refused right after connecting, or one that went unanswered, is sent
    again within ``HELLO_RETRY_S``, not after five heartbeats; once answered it stops."""
    inbox.acking = False  # as a collector that has not seen the hello: no answer at all
    p = Producer(inbox.address, run="r", role="a", config=ProducerConfig(heartbeat_s=10.0))
    p.log({"x": 1.0}, step=0)

    def hellos(msgs: list) -> int:
        return sum(isinstance(m, protocol.Hello) for m in msgs)

    msgs = inbox.receive(timeout_s=5, until=lambda m: hellos(m) >= 3)
    assert hellos(msgs) >= 3
    assert isinstance(msgs[0], protocol.Hello), "data went out before the hello"
    inbox.acking = True
    answered = hellos(inbox.receive(timeout_s=5, until=lambda m: hellos(m) > hellos(msgs)))
    time.sleep(0.6)  # three retry periods: no more hellos once one was answered
    assert hellos(inbox.receive(timeout_s=0)) == answered
    p.close()


def test_log_never_raises_even_from_many_threads(inbox) -> None:
    p = Producer(inbox.address, run="r", role="a")
    errors = []

    def spam(k: int) -> None:
        try:
            for step in range(200):
                p.log({f"t{k}": np.arange(3.0), "s": step}, step=step)
        except Exception as exc:  # pragma: no cover - the assertion below reports it
            errors.append(exc)

    threads = [threading.Thread(target=spam, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    p.close()
    got = entries(inbox.receive(until=has_bye))
    assert not errors and len(got) == 800 and p.stats()["errors"] == 0


def test_heartbeats_carry_stats(inbox) -> None:
    p = Producer(inbox.address, run="r", role="a", config=ProducerConfig(heartbeat_s=0.05))
    p.log({"x": "bad"}, step=0)
    msgs = inbox.receive(
        timeout_s=3, until=lambda ms: any(isinstance(m, protocol.Heartbeat) for m in ms)
    )
    beat = next(m for m in msgs if isinstance(m, protocol.Heartbeat))
    assert beat.stats["invalid"] == 1 and beat.stats["logged"] == 1
    p.close()


def test_step_done_and_phase(inbox) -> None:
    p = Producer(inbox.address, run="r", role="actor_train")
    loads = []
    with p.phase(
        "actor_train/train_step",
        step=2,
        onload=lambda: loads.append("on"),
        offload=lambda: loads.append("off"),
    ):
        time.sleep(0.02)
    p.step_done(2)
    with pytest.raises(RuntimeError), p.phase("actor_train/generate", step=3):
        raise RuntimeError("training error propagates unchanged")
    # warned, not measured, not raised; the caller's state still moves on and off
    with p.phase(
        "not-an-infix",
        step=3,
        onload=lambda: loads.append("on2"),
        offload=lambda: loads.append("off2"),
    ):
        loads.append("body")
    p.close()
    msgs = inbox.receive(until=has_bye)
    assert loads == ["on", "off", "on2", "body", "off2"]
    names = {n: v for e in entries(msgs) for n, v in by_name(e).items()}
    total = names[M.TIME_PHASE.format(cluster="actor_train", phase="train_step", part="total")][0]
    execute = names[M.TIME_PHASE.format(cluster="actor_train", phase="train_step", part="execute")][
        0
    ]
    assert 0.02 <= execute <= total < 1.0
    for part in ("onload", "offload"):
        assert M.TIME_PHASE.format(cluster="actor_train", phase="train_step", part=part) in names
    rss = names[
        M.MEMORY_CPU.format(cluster="actor_train", phase="train_step", when="end", kind="rss")
    ][0]
    assert 0.01 < rss < 64  # GiB: this test process
    assert M.TIME_PHASE.format(cluster="actor_train", phase="generate", part="total") in names
    assert 2 in done_steps(msgs)


def test_a_phase_logs_what_it_was_given_in_its_own_entry(inbox) -> None:
    """Phase.add: the values reach the collector in the phase's end entry, where the collector
    reads the phase's span (rlpulse.collector.runs.spans), also when the body raises."""
    p = Producer(inbox.address, run="r", role="rollout")
    with p.phase("rollout/generate", step=1) as phase:
        phase.add({M.ROLLOUT_RESPONSE_LONGEST.name: 60, M.ROLLOUT_RESPONSE_FINISH.name: [0.5]})
    with pytest.raises(RuntimeError), p.phase("rollout/generate", step=2) as phase:
        phase.add({M.ROLLOUT_RESPONSE_LONGEST.name: 7})
        raise RuntimeError("propagates")
    p.close()
    total = M.TIME_PHASE.format(cluster="rollout", phase="generate", part="total")
    ends = [by_name(e) for e in entries(inbox.receive(until=has_bye)) if total in e.names]
    assert [e[M.ROLLOUT_RESPONSE_LONGEST.name][3] for e in ends] == [60.0, 7.0]
    assert ends[0][M.ROLLOUT_RESPONSE_FINISH.name][3] == 0.5


def test_hellos_and_heartbeats_carry_the_producers_clock(inbox) -> None:
    """The stamps the collector measures this producer's clock offset from."""
    before = time.time()
    p = Producer(inbox.address, run="r", role="a", config=ProducerConfig(heartbeat_s=0.05))
    msgs = inbox.receive(
        timeout_s=3, until=lambda ms: any(isinstance(m, protocol.Heartbeat) for m in ms)
    )
    p.close()
    after = time.time()
    stamped = [m for m in msgs if isinstance(m, (protocol.Hello, protocol.Heartbeat))]
    assert {type(m) for m in stamped} == {protocol.Hello, protocol.Heartbeat}
    assert all(before <= m.sent <= after for m in stamped)


class FakeCuda:
    """Stands in for torch.cuda so the GPU snapshot logic runs on a CPU machine."""

    def __init__(self, initialized: bool = True) -> None:
        self.allocated = 1 << 30
        self.initialized = initialized
        self.properties_read = 0

    def is_available(self) -> bool:
        return True

    def is_initialized(self) -> bool:
        return self.initialized

    def device_count(self) -> int:
        return 2

    def reset_peak_memory_stats(self, device: int) -> None:
        if not self.initialized:  # as torch's: no allocator before CUDA starts
            raise RuntimeError("Invalid device argument ")

    def memory_allocated(self, device: int) -> int:
        return self.allocated * (device + 1)

    memory_reserved = max_memory_allocated = max_memory_reserved = memory_allocated

    def get_device_properties(self, device: int):
        self.properties_read += 1
        self.initialized = True  # as torch's: reading the properties starts CUDA
        return type("Props", (), {"total_memory": 8 << 30})()


def test_phase_records_gpu_snapshots_per_device(inbox) -> None:
    from rlpulse.producer.memory import MemoryProbe

    fake = FakeCuda()
    probe = MemoryProbe(torch=type("T", (), {"cuda": fake})())
    p = Producer(inbox.address, run="r", role="critic", memory_probe=probe)
    with p.phase(
        "critic/compute_values", step=0, onload=lambda: setattr(fake, "allocated", 2 << 30)
    ):
        pass
    p.close()
    names = {n: v[0] for e in entries(inbox.receive(until=has_bye)) for n, v in by_name(e).items()}

    def gpu(when, state, stat, dev):
        return names[
            M.MEMORY_GPU.format(
                cluster="critic",
                phase="compute_values",
                when=when,
                state=state,
                stat=stat,
                device_id=dev,
            )
        ]

    assert gpu("start", "offload", "allocated", 0) == 1.0
    assert gpu("start", "onload", "allocated", 1) == 4.0
    assert gpu("end", "onload", "max_allocated_frac", 1) == 0.5
    assert gpu("end", "offload", "reserved", 0) == 2.0
    assert not any("start/offload/max_allocated_frac" in n for n in names)


def test_a_phase_in_a_process_that_has_not_started_cuda_neither_starts_it_nor_fails(inbox) -> None:
    """A worker that never uses its GPU (a rule-based reward): before this, the phase probe's
    reset_peak_memory_stats raised 'Invalid device argument' (one error per worker in a
    trainer run on an H100) and get_device_properties then started CUDA in that worker."""
    from rlpulse.producer.memory import MemoryProbe

    fake = FakeCuda(initialized=False)
    probe = MemoryProbe(torch=type("T", (), {"cuda": fake})())
    p = Producer(inbox.address, run="r", role="reward", memory_probe=probe)
    with p.phase("reward/compute_rewards", step=0):
        pass
    p.close()
    names = {n for e in entries(inbox.receive(until=has_bye)) for n in by_name(e)}
    assert p.stats()["errors"] == 0
    assert not fake.initialized and fake.properties_read == 0
    assert not [n for n in names if n.startswith("memory/reward/")]
    assert (
        M.MEMORY_CPU.format(cluster="reward", phase="compute_rewards", when="end", kind="rss")
        in names
    )
