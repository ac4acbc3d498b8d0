"""Version-2 traffic through the aggregator: names declared once in tables, entries merged per
(step, table) in bulk, ``done`` folded into metrics, bad rows caught in bulk and counted."""

from __future__ import annotations

import array

import numpy as np
import pytest

from rlpulse.collector.config import CollectorConfig
from rlpulse.collector.runs.aggregator import Aggregator
from rlpulse.schemas import metrics as M, protocol as P
from rlpulse.schemas.messages import TableDecl
from rlpulse.schemas.record import StepRecord
from rlpulse.schemas.values import Summary
from tests.collector.helpers import hello

ADV, LOSS, LR = M.CRITIC_ADVANTAGES.name, M.ACTOR_PG_LOSS.name, M.ACTOR_LR.name
TABLE = TableDecl(0, [ADV, LOSS, LR], bytes([1, 1, 6]))


def rows(*states: Summary) -> bytes:
    return array.array("d", [x for s in states for x in s]).tobytes()


def metrics(pid: int, seq: int, step: int, data: bytes, table: int = 0, done: int = -1):
    return P.decode(P.encode_metrics(pid, seq, [P.pack_entry(step, 1.0, table, data)], done))


class Harness:
    def __init__(self) -> None:
        self.records: list[StepRecord] = []
        config = CollectorConfig(grace_s=30, liveness_s=10, settle_s=0)
        self.agg = Aggregator(self.records.append, config)

    def send(self, *msgs: P.Message) -> None:
        for m in msgs:
            self.agg.handle(m, 0.0)
        self.agg.poll(0.0)


def test_ranks_merge_exactly_through_tables_and_folded_dones() -> None:
    h = Harness()
    rng = np.random.default_rng(5)
    samples = {r: rng.normal(r, 2.0, int(rng.integers(3, 3000))) for r in range(4)}
    h.send(*(hello(10 + r, rank=r, ws=4, tables=[TABLE]) for r in range(4)))
    h.send(
        *(
            metrics(
                10 + r,
                1,
                0,
                rows(
                    Summary.of_samples(x),
                    Summary.of_weighted(float(r), len(x)),
                    Summary.of_scalar(1e-5 * (r + 1)),
                ),
                done=0,  # the step is finished with this message: no separate done
            )
            for r, x in samples.items()
        )
    )
    (record,) = h.records
    pooled = np.concatenate(list(samples.values()))
    assert not record.partial and record.ranks == 4
    assert record.metrics[f"{ADV}/mean"] == pytest.approx(pooled.mean(), rel=1e-12)
    assert (record.metrics[f"{ADV}/max"], record.metrics[f"{ADV}/min"]) == (
        pooled.max(),
        pooled.min(),
    )
    weights = {r: len(x) for r, x in samples.items()}
    want = sum(r * w for r, w in weights.items()) / sum(weights.values())
    assert record.metrics[LOSS] == pytest.approx(want, rel=1e-12)
    assert record.metrics[LR] == pytest.approx(4e-5)  # LAST: the latest entry of the step


def test_an_undeclared_table_and_impossible_rows_are_counted_the_rest_merged() -> None:
    h = Harness()
    h.send(hello(1, rank=0, ws=2, tables=[TABLE]), hello(2, rank=1, ws=2, tables=[TABLE]))
    good = rows(Summary.of_scalar(1.0), Summary.of_weighted(2.0, 1), Summary.of_scalar(3.0))
    bad = rows(Summary(1.0, -5.0, 1.0, 1.0), Summary(), Summary.of_scalar(3.0))  # weight < 0
    h.send(
        metrics(1, 1, 0, good),
        metrics(2, 1, 0, bad),  # rejected in bulk: the same step and table as the good one
        metrics(2, 2, 0, good, table=7),  # never declared
        metrics(2, 3, 0, good[:-8]),  # too short for its table
        P.Done(1, 2, 0),
        P.Done(2, 4, 0),
    )
    (record,) = h.records
    assert record.metrics[f"{ADV}/mean"] == 1.0 and record.ranks == 2
    assert h.agg.health.malformed == {"bad_values": 2, "bad_table": 1}


def test_entries_of_one_producer_across_batches_and_tables_pool_the_same() -> None:
    """Grouped merging (per batch, per step and table) equals merging one by one."""
    data = [
        rows(Summary.of_samples([1.0, 9.0]), Summary.of_weighted(1.0, 2), Summary.of_scalar(1.0)),
        rows(Summary.of_samples([-4.0]), Summary.of_weighted(3.0, 6), Summary.of_scalar(2.0)),
        rows(Summary(), Summary(), Summary.of_scalar(3.0)),
    ]
    results = []
    for batched in (True, False):
        h = Harness()
        h.send(hello(1, rank=0, ws=1, tables=[TABLE]))
        msgs = [metrics(1, seq, 0, d) for seq, d in enumerate(data, start=1)]
        if batched:
            h.send(*msgs)
        else:
            for m in msgs:
                h.send(m)
        h.send(P.Done(1, 4, 0))
        results.append(h.records[0].metrics)
    assert results[0] == results[1]
    assert results[0][f"{ADV}/mean"] == 2.0 and results[0][LR] == 3.0
