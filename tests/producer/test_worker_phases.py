"""``rlpulse.producer.integrations.phases``: a framework's worker call as a phase of its role,
with a real producer and a loopback inbox standing in for the collector."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest

from rlpulse.producer import Producer
from rlpulse.producer.integrations.phases import Call, as_phase, current, load
from rlpulse.schemas import metrics as M
from tests.producer.conftest import entries, has_bye


def phase_times(messages: list) -> dict[tuple[str, int], dict[str, float]]:
    """``(phase infix, step) -> {part: host seconds}`` of every phase the producer sent."""
    out: dict[tuple[str, int], dict[str, float]] = {}
    for e in entries(messages):
        for name, row in zip(e.names, e.values, strict=True):
            match = M.TIME_PHASE.match(name)
            if match is not None:
                key = (f"{match['cluster']}/{match['phase']}", e.step)
                out.setdefault(key, {})[match["part"]] = float(row[0])
    return out


class Worker:
    """A framework's worker: the driver calls ``update`` and ``infer`` with a batch that says
    its step; ``update`` calls ``infer`` (a worker method calling another)."""

    marker = "the framework's dispatch attribute"

    def __init__(self, producer: Producer) -> None:
        self.producer = producer
        self.seen: list[object] = []

    def update(self, batch: dict) -> str:
        self.seen.append(current())
        with load("onload"):
            time.sleep(0.02)
        self.infer(batch)
        time.sleep(0.01)
        with load("offload"):
            time.sleep(0.03)
        return "updated"

    def infer(self, batch: dict) -> str:
        self.seen.append(current())
        return "inferred"

    async def push(self, step: int) -> str:
        await asyncio.sleep(0.01)
        self.seen.append(current())
        return "pushed"


Worker.update.dispatch = Worker.marker  # type: ignore[attr-defined]


def describe(infix: str):
    def call(worker: Worker, batch: dict) -> Call | None:
        step = batch.get("step")
        return None if step is None else Call(worker.producer, infix, step)

    return call


@pytest.fixture
def wrapped(monkeypatch):
    monkeypatch.setattr(Worker, "update", as_phase(Worker.update, describe("actor/train_step")))
    monkeypatch.setattr(
        Worker, "infer", as_phase(Worker.infer, describe("actor/compute_log_probs"))
    )
    monkeypatch.setattr(
        Worker,
        "push",
        as_phase(Worker.push, lambda w, step: Call(w.producer, "actor/model_update", step)),
    )


def test_each_call_is_one_phase_with_the_bodys_own_loads(inbox, wrapped) -> None:
    p = Producer(inbox.address, run="r", role="actor")
    worker = Worker(p)
    assert worker.update({"step": 3}) == "updated"
    assert worker.infer({"step": 4}) == "inferred"
    assert worker.infer({}) == "inferred"  # the batch names no step: not measured
    assert asyncio.run(worker.push(5)) == "pushed"
    assert Worker.update.dispatch == Worker.marker and Worker.update.__name__ == "update"
    # the nested call ran inside the outer phase and opened none of its own
    outer, nested, alone, unmeasured, pushed = worker.seen
    assert outer is not None and nested is outer and alone is not None and unmeasured is None
    assert pushed is not None
    assert current() is None
    p.close()
    got = phase_times(inbox.receive(until=has_bye))
    assert set(got) == {
        ("actor/train_step", 3),
        ("actor/compute_log_probs", 4),
        ("actor/model_update", 5),
    }
    update = got[("actor/train_step", 3)]
    assert update["onload"] >= 0.02 and update["offload"] >= 0.03
    assert 0.01 <= update["execute"] < update["total"]
    assert "onload" not in got[("actor/compute_log_probs", 4)]
    assert got[("actor/model_update", 5)]["total"] >= 0.01


def test_a_describe_that_fails_leaves_the_call_unmeasured_and_warns_once(
    inbox, caplog, monkeypatch
) -> None:
    def broken(worker: Worker, batch: dict) -> Call:
        raise KeyError("no step here")

    monkeypatch.setattr(Worker, "infer", as_phase(Worker.infer, broken))
    p = Producer(inbox.address, run="r", role="actor")
    worker = Worker(p)
    with caplog.at_level(logging.WARNING, logger="rlpulse.integrations.phases"):
        assert [worker.infer({}) for _ in range(3)] == ["inferred"] * 3
    warnings = [r for r in caplog.records if "runs without its phase" in r.getMessage()]
    assert len(warnings) == 1 and "no step here" in warnings[0].getMessage()
    p.close()
    assert phase_times(inbox.receive(until=has_bye)) == {}


def test_the_calls_own_error_propagates_and_its_phase_is_still_sent(inbox, monkeypatch) -> None:
    def failing(worker: Worker, batch: dict) -> str:
        raise RuntimeError("the framework's own error")

    monkeypatch.setattr(Worker, "infer", as_phase(failing, describe("critic/compute_values")))
    p = Producer(inbox.address, run="r", role="critic")
    with pytest.raises(RuntimeError, match="framework's own error"):
        Worker(p).infer({"step": 1})
    assert current() is None
    p.close()
    assert ("critic/compute_values", 1) in phase_times(inbox.receive(until=has_bye))


def test_a_producer_that_cannot_open_phases_leaves_the_calls_unmeasured(
    caplog, monkeypatch
) -> None:
    """A producer without phases (a recorder of ``log()`` calls in a test, say): the worker's
    calls run as ever, warned about once."""

    class LogOnly:
        def log(self, data: dict, step: int) -> None:
            pass

    monkeypatch.setattr(
        Worker, "infer", as_phase(Worker.infer, describe("actor/compute_log_probs"))
    )
    worker = Worker(LogOnly())  # type: ignore[arg-type]
    with caplog.at_level(logging.WARNING, logger="rlpulse.integrations.phases"):
        assert [worker.infer({"step": s}) for s in range(3)] == ["inferred"] * 3
    warnings = [r for r in caplog.records if "runs without its phase" in r.getMessage()]
    assert len(warnings) == 1 and worker.seen == [None, None, None]
