"""Spans out of the entries a collector receives: every rank's phase, exact times, the
stragglers of the step, through one collector and through relays to a root."""

from __future__ import annotations

import math

import pytest

from rlpulse.collector.config import CollectorConfig
from rlpulse.collector.runs.aggregator import Aggregator
from rlpulse.schemas import metrics as M, protocol as P
from rlpulse.schemas.record import StepRecord
from rlpulse.schemas.spans import Span
from tests.collector.helpers import Declaring, hello, metrics
from tests.collector.tiers import Tiers

TOTAL, EXECUTE = (
    M.TIME_PHASE.format(cluster="actor_train", phase="train_step", part=p)
    for p in ("total", "execute")
)
GPU = M.TIME_PHASE_GPU.format(cluster="actor_train", phase="train_step", part="total")
LAG = M.STRAGGLER.format(cluster="actor_train", phase="train_step", stat="lag")
SLOWEST = M.STRAGGLER.format(cluster="actor_train", phase="train_step", stat="slowest_rank")
SECONDS = {0: 1.5, 1: 4.0, 2: 2.0}
END = {0: 1000.25, 1: 1001.5, 2: 1000.75}


def phase_end(pid: int, rank: int, step: int) -> P.Metrics:
    values = {TOTAL: SECONDS[rank], EXECUTE: SECONDS[rank] - 0.5, GPU: SECONDS[rank] * 2}
    return metrics(pid, step, values, t=END[rank] + step)


def expected_span(rank: int, step: int) -> Span:
    end = END[rank] + step
    return Span(
        "actor_train",
        rank,
        "host",
        "actor_train",
        "train_step",
        end - SECONDS[rank],
        end,
        SECONDS[rank] - 0.5,
        SECONDS[rank] * 2,
    )


def test_each_rank_phase_becomes_a_span_and_the_step_names_its_straggler() -> None:
    out: list[StepRecord] = []
    agg = Aggregator(out.append, CollectorConfig(grace_s=30, liveness_s=10, settle_s=0))
    feed = Declaring(agg)
    for r in range(3):
        feed.handle(hello(10 + r, rank=r, ws=3), 0.0)
    for r in range(3):
        feed.handle(phase_end(10 + r, r, 0), 0.0)
        feed.handle(metrics(10 + r, 0, {M.ACTOR_PG_LOSS.name: 1.0}, t=END[r]), 0.0)  # no span
        feed.handle(P.Done(10 + r, 3, 0), 0.0)
    agg.poll(0.0)
    (record,) = out
    spans = sorted(record.spans, key=lambda s: s.rank)
    assert spans == [expected_span(r, 0) for r in range(3)]
    assert record.metrics[LAG] == pytest.approx(4.0 - 2.0)
    assert record.metrics[SLOWEST] == 1.0
    assert "spans" not in record.to_json(), "the jsonl line leaves spans out"
    import msgspec

    back = StepRecord.from_json(msgspec.json.decode(record.encode(seq=1))["record"])
    assert back.spans == record.spans, "the outbox keeps them"
    unmeasured = StepRecord(
        run="r", step=1, metrics={}, spans=(msgspec.structs.replace(expected_span(0, 1), gpu=None),)
    )
    again = StepRecord.from_json(msgspec.json.decode(unmeasured.encode(seq=2))["record"])
    assert again.spans == unmeasured.spans and again.spans[0].gpu is None


def test_relays_forward_every_rank_span_and_the_root_finds_the_same_straggler() -> None:
    t = Tiers()
    t.send("A", hello(1, rank=0, ws=3), hello(2, rank=1, ws=3))
    t.send("B", hello(3, rank=2, ws=3))
    for pid, rank, via in ((1, 0, "A"), (2, 1, "A"), (3, 2, "B")):
        t.send(via, phase_end(pid, rank, 0))
        t.send(via, P.Done(pid, 2, 0))
    t.same_as_reference()
    (got,), (want,) = t.out, t.ref_out
    key = lambda s: s.rank  # noqa: E731
    assert (
        sorted(got.spans, key=key)
        == sorted(want.spans, key=key)
        == [expected_span(r, 0) for r in range(3)]
    )
    assert got.metrics[SLOWEST] == 1.0 and math.isclose(got.metrics[LAG], 2.0)


def test_a_span_carries_its_loads_and_a_generations_longest_response() -> None:
    """onload and offload (the ledger splits a phase by them) and rollout/response/longest
    logged with the phase (the ledger names the engine of the step's longest response)."""
    out: list[StepRecord] = []
    agg = Aggregator(out.append, CollectorConfig(grace_s=30, liveness_s=10, settle_s=0))
    feed = Declaring(agg)
    feed.handle(hello(1, role="rollout"), 0.0)
    parts = {"total": 2.0, "execute": 1.5, "onload": 0.25, "offload": 0.2}
    values: dict = {
        M.TIME_PHASE.format(cluster="rollout", phase="generate", part=k): v
        for k, v in parts.items()
    }
    values[M.ROLLOUT_RESPONSE_LONGEST.name] = 60.0
    feed.handle(metrics(1, 0, values, t=100.0), 0.0)
    feed.handle(P.Done(1, 3, 0), 0.0)
    agg.poll(0.0)
    (span,) = out[0].spans
    assert (span.start, span.end, span.execute) == (98.0, 100.0, 1.5)
    assert (span.onload, span.offload, span.longest) == (0.25, 0.2, 60.0)
    assert out[0].ledger is not None and out[0].ledger.who["longest"] == "rollout/0"
