"""Run identity and rank takeovers in the aggregator: a new run is new, a resumed run resumes,
a restarted rank is counted once, and what the collector leaves out is told back."""

from __future__ import annotations

import numpy as np

from rlpulse.collector.intake.delivery import Delivery
from rlpulse.schemas import Summary, protocol as P
from rlpulse.schemas.metrics import CATALOG
from tests.collector.helpers import Harness, hello, metrics, table

ADV = "critic/advantages"
assert CATALOG.resolve(ADV).reduction.name in ("MEAN", "DIST")  # its row pools as a mean


def adv(values) -> dict:
    return {ADV: Summary.of_samples(np.asarray(values, dtype=float))}


def test_restarted_rank_mid_step_is_counted_once_and_exactly() -> None:
    """Rank 1 dies in step 1 after logging part of it; its restart logs step 1 in full. The
    step holds the restarted process's data, not both, and is complete with 2 ranks."""
    h = Harness()
    h.send(hello(1, rank=0, ws=2), hello(2, rank=1, ws=2))
    h.send(metrics(1, 0, adv([1.0, 2.0])), metrics(2, 0, adv([3.0])))
    h.send(metrics(1, 1, adv([5.0])), metrics(2, 1, adv([7.0, 7.0, 7.0])))  # 2 dies here
    h.send(hello(3, rank=1, ws=2), metrics(3, 1, adv([9.0, 11.0])), P.Done(3, 2, 1))
    h.send(P.Done(1, 2, 1))
    step0, step1 = h.records
    assert step0.metrics[f"{ADV}/mean"] == 2.0 and not step0.partial
    assert step1.metrics[f"{ADV}/mean"] == np.mean([5.0, 9.0, 11.0])
    assert not step1.partial and step1.ranks == 2
    assert h.agg.health.rank_takeovers == 1


def test_restart_that_skips_the_step_leaves_it_partial_naming_the_rank() -> None:
    """The restarted rank goes on from the next step: the withdrawn step lacks its data, so
    it is emitted partial (at once, naming the rank), never complete."""
    h = Harness()
    h.send(hello(1, rank=0, ws=2), hello(2, rank=1, ws=2))
    h.send(metrics(1, 0, adv([1.0])), metrics(2, 0, adv([3.0])))
    h.send(hello(3, rank=1, ws=2), metrics(3, 1, adv([4.0])))  # finishes step 0 without its data
    h.send(P.Done(1, 2, 0))
    (step0,) = h.records
    assert step0.partial and step0.missing == ("actor_train/1",)
    assert step0.metrics[f"{ADV}/mean"] == 1.0


def test_two_live_processes_claiming_one_rank_count_the_newest_only() -> None:
    h = Harness()
    h.send(hello(1, rank=0, ws=1), hello(2, rank=0, ws=1))
    for step in range(3):
        h.send(metrics(1, step, adv([100.0])), metrics(2, step, adv([float(step)])))
    h.send(P.Done(2, 2, 2))
    assert [r.metrics[f"{ADV}/mean"] for r in h.records] == [0.0, 1.0, 2.0]
    assert all(not r.partial and r.ranks == 1 for r in h.records)
    assert h.agg.health.conflict_entries == 3
    assert h.agg.feedback(1) == (0, 3, "", 0, []) and h.agg.feedback(2) == (0, 0, "", 0, [])


def test_a_run_name_reused_after_the_run_ended_starts_a_new_attempt() -> None:
    h = Harness()
    h.send(hello(1, rank=0, ws=1), metrics(1, 0, adv([1.0])), metrics(1, 1, adv([2.0])))
    h.send(P.Bye(1, 2, {}))
    h.send(hello(2, rank=0, ws=1), metrics(2, 0, adv([5.0])), metrics(2, 1, adv([6.0])))
    h.send(P.Bye(2, 2, {}))
    assert [r.step for r in h.by_run("r")] == [0, 1]
    assert [r.metrics[f"{ADV}/mean"] for r in h.by_run("r-2")] == [5.0, 6.0]
    assert h.agg.health.run_attempts == 1 and h.agg.health.late == 0
    assert h.agg.feedback(2) == (0, 0, "r-2", 0, [])
    # A third run under the name is r-3; a second rank of that third run joins r-3.
    h.send(hello(3, rank=0, ws=2), hello(4, rank=1, ws=2))
    assert h.agg.membership.producers[4].run == "r-3"


def test_a_resumed_run_continues_and_its_late_steps_are_told_back() -> None:
    h = Harness()
    h.send(hello(1, rank=0, ws=1), metrics(1, 0, adv([1.0])), metrics(1, 1, adv([2.0])))
    h.send(P.Bye(1, 2, {}))
    h.send(hello(2, rank=0, ws=1, resume=True))
    h.send(metrics(2, 1, adv([9.0])), metrics(2, 2, adv([3.0])), P.Bye(2, 2, {}))
    assert [r.step for r in h.records] == [0, 1, 2] and {r.run for r in h.records} == {"r"}
    assert h.agg.health.late == 1 and h.agg.feedback(2) == (1, 0, "", 0, [])


def test_a_rank_joining_a_live_run_is_not_a_new_attempt() -> None:
    """Workers that live for a second: rank 0 finishes before rank 1 registers, within
    the liveness window: rank 1 joins the same run."""
    h = Harness()
    h.send(hello(1, rank=0, ws=2), metrics(1, 0, adv([1.0])), P.Bye(1, 2, {}))
    h.now = 1.0
    h.send(hello(2, rank=1, ws=2), metrics(2, 0, adv([3.0])), P.Bye(2, 2, {}))
    (rec,) = h.records
    assert rec.run == "r" and not rec.partial and rec.metrics[f"{ADV}/mean"] == 2.0


def test_acks_carry_the_feedback() -> None:
    h = Harness()
    d = Delivery()
    declared = [table([ADV])]  # each hello declares the table of its data (the data skips Harness)
    for msg in (
        hello(1, rank=0, ws=1, tables=declared),
        metrics(1, 0, adv([1.0])),
        P.Bye(1, 2, {}),
    ):
        for m, _ in d.accept(msg, b"a"):
            h.agg.handle(m, 0.0)
    h.agg.poll(0.0)
    d.acks()
    for msg in (
        hello(2, rank=0, ws=1, tables=declared),
        P.Metrics(2, 1, metrics(2, 0, adv([1.0])).entries),
    ):
        for m, _ in d.accept(msg, b"b"):
            h.agg.handle(m, 0.0)
    (ack,) = [P.decode(a) for _, a in d.acks(h.agg.feedback)]
    assert ack == P.Ack(2, 1, 0, 0, "r-2", asks=True)
