"""Steps are emitted once, exactly pooled, when every expected rank is done, or flagged partial."""

from __future__ import annotations

import numpy as np
import pytest

from rlpulse.collector.runs.aggregator import Aggregator
from rlpulse.schemas import Summary, metrics as M, protocol as P
from tests.collector.helpers import Harness, hello, metrics, table

ADV = M.CRITIC_ADVANTAGES.name
LOSS = M.ACTOR_PG_LOSS.name


def test_ragged_ranks_pool_exactly_against_numpy() -> None:
    h = Harness()
    rng = np.random.default_rng(3)
    data = {
        0: rng.normal(2, 1, 7),
        1: rng.normal(-1, 3, 3000),
        2: np.array([]),
        3: np.array([np.nan, 4.0]),
    }
    h.send(*(hello(10 + r, rank=r, ws=4) for r in range(4)))
    for r, values in data.items():
        h.send(
            metrics(
                10 + r,
                0,
                {ADV: Summary.of_samples(values), LOSS: Summary.of_weighted(float(r), len(values))},
            )
        )
    assert h.records == []
    h.send(*(P.Done(10 + r, 2, 0) for r in range(4)))
    (rec,) = h.records
    pooled = np.concatenate([v[np.isfinite(v)] for v in data.values()])
    assert rec.metrics["critic/advantages/mean"] == pytest.approx(pooled.mean(), rel=1e-12)
    assert rec.metrics["critic/advantages/max"] == pooled.max()
    assert rec.metrics["critic/advantages/min"] == pooled.min()
    weights = np.array([len(v) for v in data.values()])
    assert rec.metrics[LOSS] == pytest.approx((np.arange(4) * weights).sum() / weights.sum())
    assert not rec.partial and rec.ranks == 4


def test_waits_for_world_size_not_just_the_ranks_seen() -> None:
    h = Harness(liveness_s=1000)
    h.send(hello(1, rank=0, ws=2), metrics(1, 0, {LOSS: 1.0}), metrics(1, 1, {LOSS: 1.0}))
    assert h.records == []  # rank 1 never registered: step 0 is not complete
    h.send(hello(2, rank=1, ws=2), metrics(2, 0, {LOSS: 3.0}), metrics(2, 1, {LOSS: 3.0}))
    assert h.steps() == [0] and h.records[0].metrics[LOSS] == 2.0


def test_every_role_must_finish() -> None:
    h = Harness()
    h.send(hello(1, role="actor_train"), hello(2, role="critic"))
    h.send(metrics(1, 0, {LOSS: 1.0}), metrics(1, 1, {LOSS: 1.0}))
    assert h.records == []
    h.send(metrics(2, 0, {M.CRITIC_LOSS.name: 0.5}), P.Done(2, 3, 0))
    assert h.steps() == [0] and set(h.records[0].roles.values()) == {"actor_train", "critic"}


def test_grace_period_emits_partial_naming_the_missing_rank() -> None:
    h = Harness(grace_s=5, liveness_s=1000)
    h.send(hello(1, rank=0, ws=2), hello(2, rank=1, ws=2))
    h.send(metrics(1, 0, {LOSS: 1.0}), metrics(2, 0, {LOSS: 3.0}), metrics(1, 1, {LOSS: 1.0}))
    h.tick(4.9)
    assert h.records == []
    h.tick(0.2)
    (rec,) = h.records
    assert rec.partial and rec.missing == ("actor_train/1",) and rec.metrics[LOSS] == 2.0


def test_silent_producer_is_presumed_dead_after_liveness() -> None:
    h = Harness(grace_s=1000, liveness_s=10)
    h.send(hello(1, rank=0, ws=2), hello(2, rank=1, ws=2), metrics(2, 0, {LOSS: 3.0}))
    for step in range(4):
        h.tick(4)
        h.send(metrics(1, step, {LOSS: 1.0}), P.Heartbeat(1, 9, {}))
    assert h.steps() == [0, 1, 2]  # rank 1 silent since t=0, gone at t=10
    assert all(r.partial and r.missing == ("actor_train/1",) for r in h.records)


def test_a_step_goes_out_once_the_rank_it_waited_for_finishes_and_the_rest_are_gone() -> None:
    """The poll remembers the slot a step waits for (so a poll does not list every missing
    rank); when that rank finishes and every slot still missing is gone, the step goes out at
    that poll, not at the grace period."""
    h = Harness(grace_s=1000, liveness_s=10)
    h.send(*(hello(1 + r, rank=r, ws=3) for r in range(3)))
    h.send(metrics(1, 0, {LOSS: 1.0}), metrics(1, 1, {LOSS: 1.0}))  # rank 0 finished step 0
    h.tick(4)
    h.send(metrics(2, 0, {LOSS: 3.0}))  # rank 1 logged it: alive, not finished
    h.tick(7)  # rank 2 silent since t=0: gone; rank 1 heard from at t=4: alive
    h.send(P.Heartbeat(1, 9, {}))
    assert h.records == []  # waits for rank 1
    h.send(P.Done(2, 0, 0))  # rank 1 finishes: rank 2, the only one missing, is gone
    (rec,) = h.records
    assert rec.partial and rec.missing == ("actor_train/2",) and rec.metrics[LOSS] == 2.0


def test_late_data_is_counted_not_merged() -> None:
    h = Harness()
    h.send(hello(1), metrics(1, 0, {LOSS: 1.0}), metrics(1, 1, {LOSS: 1.0}))
    assert h.steps() == [0]
    h.send(metrics(1, 0, {LOSS: 100.0}))
    assert h.agg.health.late == 1 and h.steps() == [0]


def test_each_step_emitted_once_and_in_order() -> None:
    h = Harness()
    h.send(hello(1, rank=0, ws=2), hello(2, rank=1, ws=2))
    for step in range(5):
        h.send(metrics(1, step, {LOSS: 1.0}))
    for step in range(5):
        h.send(metrics(2, step, {LOSS: 1.0}))
    h.send(P.Bye(1, 9, {}), P.Bye(2, 9, {}))
    assert h.steps() == [0, 1, 2, 3, 4]


def test_several_log_calls_of_one_step_merge() -> None:
    h = Harness()
    h.send(
        hello(1),
        metrics(1, 0, {ADV: Summary.of_samples([1, 2])}),
        metrics(1, 0, {ADV: Summary.of_samples([6]), LOSS: 2.0}),
        P.Done(1, 2, 0),
    )
    assert (
        h.records[0].metrics["critic/advantages/mean"] == 3.0 and h.records[0].metrics[LOSS] == 2.0
    )


def test_last_keeps_the_latest_and_max_takes_the_slowest_rank() -> None:
    h = Harness()
    t = M.TIME_PHASE.format(cluster="actor_train", phase="train_step", part="total")
    h.send(hello(1, rank=0, ws=2), hello(2, rank=1, ws=2))
    h.send(
        metrics(1, 0, {M.ACTOR_LR.name: 1e-5, t: 2.0}),
        metrics(2, 0, {M.ACTOR_LR.name: 2e-5, t: 7.0}),
    )
    h.send(P.Done(1, 3, 0), P.Done(2, 3, 0))
    assert h.records[0].metrics[M.ACTOR_LR.name] == 2e-5 and h.records[0].metrics[t] == 7.0


def test_throughput_and_cumulative_samples() -> None:
    h = Harness(tps_window=2)
    tok, smp = M.SYSTEM_STEP_TOKENS.name, M.SYSTEM_STEP_SAMPLES.name
    h.send(hello(1, rank=0, ws=2), hello(2, rank=1, ws=2))
    ends = [10.0, 12.0, 16.0, 17.0]
    for step, end in enumerate(ends):
        h.send(
            metrics(1, step, {tok: 100, smp: 3}, t=end - 0.5),
            metrics(2, step, {tok: 300, smp: 5}, t=end),
        )
        h.send(P.Done(1, 5, step), P.Done(2, 5, step))
    r = {rec.step: rec.metrics for rec in h.records}
    assert M.SYSTEM_TPS.name not in r[0]  # no previous step end to measure from
    assert r[1][M.SYSTEM_TPS.name] == pytest.approx(400 / 2.0)
    assert r[2][M.SYSTEM_TPS.name] == pytest.approx(800 / 6.0)  # window of 2 steps
    assert r[3][M.SYSTEM_TPS.name] == pytest.approx(800 / 5.0)
    assert [r[s][M.SYSTEM_SAMPLES.name] for s in range(4)] == [8, 16, 24, 32]
    assert r[3][M.SYSTEM_TOKENS.name] == 1600


def test_a_rank_clock_ahead_is_bounded_by_the_receive_time_counted_and_named(caplog) -> None:
    """Issue 38 item 6: rank 1's clock steps an hour ahead at step 3. Its times are bounded
    by the collector's clock when it receives them: the records keep the collector's time
    and ``system/tps`` its true value (an hour's end for step 3 gave 2.8 tokens/s before)."""
    wall = [1000.0]
    h = Harness(tps_window=1)
    h.agg = Aggregator(h.records.append, h.agg.config, wall_clock=lambda: wall[0])
    tok = M.SYSTEM_STEP_TOKENS.name
    h.send(hello(1, rank=0, ws=2), hello(2, rank=1, ws=2))
    for step in range(6):
        wall[0] = 1000.0 + step  # a step a second; each rank logs just before it is received
        ahead = 3600.0 if step >= 3 else 0.0
        h.send(
            metrics(1, step, {tok: 5_000}, t=wall[0] - 0.01),
            metrics(2, step, {tok: 5_000}, t=wall[0] - 0.01 + ahead),
        )
        h.send(P.Done(1, 5, step), P.Done(2, 5, step))
    assert h.steps() == list(range(6))
    for rec in h.records:
        assert rec.time <= 1000.0 + rec.step
        if rec.step:
            assert rec.metrics[M.SYSTEM_TPS.name] == pytest.approx(10_000, rel=0.02), rec.step
    assert h.agg.health.clock_skew == 3
    named = [r.message for r in caplog.records if "ahead of this collector's clock" in r.message]
    assert len(named) == 1 and "actor_train/1 of run 'r'" in named[0]


def test_a_rank_clock_is_trusted_without_a_wall_clock() -> None:
    h = Harness()
    h.send(hello(1), metrics(1, 0, {LOSS: 1.0}, t=5e9), P.Done(1, 5, 0))
    assert h.records[0].time == 5e9 and h.agg.health.clock_skew == 0


def test_derived_names_logged_by_a_producer_are_dropped() -> None:
    h = Harness()
    h.send(hello(1), metrics(1, 0, {M.SYSTEM_TPS.name: 1e9, LOSS: 1.0}), P.Done(1, 2, 0))
    assert M.SYSTEM_TPS.name not in h.records[0].metrics and h.agg.health.derived_logged == 1


def test_data_from_an_unregistered_producer_is_counted_not_merged() -> None:
    h = Harness()
    h.send(metrics(1, 0, {LOSS: 4.0}))
    assert h.agg.health.unknown_producer == 1 and not h.agg.runs


def test_restarted_worker_takes_over_its_slot() -> None:
    """The replaced process's data for the open step is withdrawn: the step holds the new
    process's data only, once, and is complete."""
    h = Harness()
    h.send(hello(1, rank=0, ws=1), metrics(1, 0, {LOSS: 1.0}))
    h.send(hello(2, rank=0, ws=1), metrics(2, 0, {LOSS: 3.0}), P.Done(2, 1, 0))
    (rec,) = h.records
    assert rec.metrics[LOSS] == 3.0 and not rec.partial and rec.ranks == 1
    assert h.agg.health.rank_takeovers == 1


@pytest.mark.parametrize("begun", [False, True], ids=["between-steps", "mid-step"])
def test_a_step_a_restarted_rank_skipped_goes_out_partial_naming_it(begun) -> None:
    """Rank 0 finishes step 0 and dies, before logging anything of step 1 or part-way
    through it; its new process goes on from step 2 (a later checkpoint). Its cumulative
    ``done`` says step 1 is finished, but nobody ran step 1 for rank 0: the step holds rank
    1's data only, and must say so. It went out complete when the old process had logged
    nothing of it (nothing to withdraw)."""
    h = Harness()
    h.send(hello(1, rank=0, ws=2), hello(2, rank=1, ws=2))
    h.send(metrics(1, 0, {LOSS: 1.0}), P.Done(1, 2, 0), metrics(2, 0, {LOSS: 3.0}), P.Done(2, 2, 0))
    h.send(metrics(2, 1, {LOSS: 5.0}), P.Done(2, 3, 1))
    if begun:
        h.send(metrics(1, 1, {LOSS: 9.0}))
    h.send(hello(3, rank=0, ws=2), metrics(3, 2, {LOSS: 7.0}), P.Done(3, 2, 2))
    h.send(metrics(2, 2, {LOSS: 9.0}), P.Done(2, 4, 2))
    assert [(r.step, r.partial, r.missing, r.metrics[LOSS]) for r in h.records] == [
        (0, False, (), 2.0),
        (1, True, ("actor_train/0",), 5.0),
        (2, False, (), 8.0),
    ]


def test_a_restarted_rank_that_logs_the_step_again_keeps_every_step_complete() -> None:
    """The usual restart: the new process logs the step its predecessor died in again."""
    h = Harness()
    h.send(hello(1, rank=0, ws=1), metrics(1, 0, {LOSS: 1.0}), P.Done(1, 2, 0))
    h.send(metrics(1, 1, {LOSS: 9.0}))
    h.send(hello(2, rank=0, ws=1), metrics(2, 1, {LOSS: 3.0}), P.Done(2, 2, 1))
    assert [(r.step, r.partial, r.metrics[LOSS]) for r in h.records] == [
        (0, False, 1.0),
        (1, False, 3.0),
    ]


def test_where_a_restarted_rank_resumes_survives_a_checkpoint() -> None:
    """A checkpoint keeps what a new process's predecessor had finished (taken before its
    first step) and the steps it skipped (taken after): a collector restored from it, whose
    open steps are rebuilt from the write-ahead log, still emits the skipped step partial."""
    h = Harness()  # each hello declares the table of the data its process logs
    h.send(
        hello(1, rank=0, ws=2, tables=[table([LOSS])]),
        hello(2, rank=1, ws=2, tables=[table([LOSS])]),
    )
    h.send(
        metrics(1, 0, {LOSS: 1.0}), P.Done(1, 2, 0), hello(3, rank=0, ws=2, tables=[table([LOSS])])
    )
    before_first = h.agg.snapshot()
    restored = Harness()
    restored.agg.restore(before_first, 0.0)
    assert restored.agg.membership.producers[3].resumes_after == 0
    assert restored.agg.membership.resuming == {3}

    h.send(metrics(3, 2, {LOSS: 7.0}), P.Done(3, 2, 2))  # rank 0 goes on from step 2
    after_first = h.agg.snapshot()
    restored = Harness()
    restored.agg.restore(after_first, 0.0)
    for msg in (metrics(2, 0, {LOSS: 3.0}), P.Done(2, 2, 0), metrics(3, 2, {LOSS: 7.0})):
        restored.agg.handle(msg, 0.0, replay=True)  # the log from the oldest open step on
    restored.send(metrics(2, 1, {LOSS: 5.0}), P.Done(2, 3, 1), P.Done(3, 3, 2))
    restored.send(metrics(2, 2, {LOSS: 9.0}), P.Done(2, 4, 2))
    assert [(r.step, r.partial, r.missing) for r in restored.records] == [
        (0, False, ()),
        (1, True, ("actor_train/0",)),
        (2, False, ()),
    ]


def test_a_restored_collector_keeps_a_replaced_ranks_finished_step() -> None:
    """Rank 0 finishes step 0 and dies in step 1; its new process repeats step 0 (late) and
    logs step 1. A collector restored from its checkpoint rebuilds the open steps from the
    write-ahead log, knowing who holds each slot *now*: the old process's data for step 0
    was refused as a conflict, and step 0 went out complete with rank 1's data only (3.0,
    not 2.0). It must come out as it would have without the restart."""
    rank0_old = (metrics(1, 0, {LOSS: 1.0}), metrics(1, 0, {LOSS: 2.0}), P.Done(1, 2, 0))
    rank0_old += (metrics(1, 1, {LOSS: 1.5}),)  # then it dies
    rank0_new = (
        hello(3, rank=0, ws=2, tables=[table([LOSS])]),
        metrics(3, 0, {LOSS: 99.0}),
        metrics(3, 1, {LOSS: 7.0}),
    )
    rest = (metrics(2, 0, {LOSS: 3.0}), P.Done(2, 2, 0), metrics(2, 1, {LOSS: 5.0}))
    rest += (P.Done(2, 3, 1), P.Done(3, 3, 1))

    def emitted(h: Harness) -> list[tuple]:
        return [(r.step, r.partial, r.ranks, r.metrics[LOSS]) for r in h.records]

    h = Harness()  # each hello declares the table of the data its process logs
    h.send(
        hello(1, rank=0, ws=2, tables=[table([LOSS])]),
        hello(2, rank=1, ws=2, tables=[table([LOSS])]),
        *rank0_old,
        *rank0_new,
    )
    restored = Harness()
    restored.agg.restore(h.agg.snapshot(), 0.0)
    for msg in (*rank0_old, *rank0_new):  # the log from step 0's first data on
        restored.agg.handle(msg, 0.0, replay=True)
    h.send(*rest)
    restored.send(*rest)
    assert emitted(restored) == emitted(h) == [(0, False, 2, 2.0), (1, False, 2, 6.0)]


def test_too_many_open_steps_emit_the_oldest() -> None:
    """Past the hard bound (8 x max_open_steps) the oldest steps go out partial; below it a
    producer that runs ahead is held back instead (``admits``, the daemon's business)."""
    h = Harness(max_open_steps=2, liveness_s=1000)
    h.send(hello(1, rank=0, ws=2))
    for step in range(19):
        h.send(metrics(1, step, {LOSS: 1.0}))
    assert h.steps() == [0, 1, 2] and all(r.partial for r in h.records)


def test_a_producer_ahead_of_a_full_window_is_not_admitted() -> None:
    h = Harness(max_open_steps=2, liveness_s=1000)
    h.send(hello(1, rank=0, ws=2), metrics(1, 0, {LOSS: 1.0}), metrics(1, 1, {LOSS: 1.0}))
    assert h.agg.admits(metrics(1, 1, {LOSS: 2.0})) and not h.agg.admits(metrics(1, 2, {LOSS: 2.0}))
    assert not h.agg.has_room(1)
    # Rank 1 still owes the oldest open step: its data is always admitted, whatever it opens.
    h.send(hello(2, rank=1, ws=2))
    assert h.agg.admits(metrics(2, 5, {LOSS: 2.0}))


def test_a_closing_producer_ahead_is_admitted_up_to_the_hard_bound() -> None:
    """Issue 38, item 11: a producer that said goodbye behind its held data is admitted past
    the window, never past the hard bound (8 x max_open_steps: the oldest would go partial)."""
    h = Harness(max_open_steps=2, liveness_s=1000)
    h.send(hello(1, rank=0, ws=2), metrics(1, 0, {LOSS: 1.0}), metrics(1, 1, {LOSS: 1.0}))
    assert not h.agg.admits(metrics(1, 2, {LOSS: 2.0}))
    assert h.agg.admits(metrics(1, 2, {LOSS: 2.0}), closing=True)
    for step in range(2, 16):
        h.send(metrics(1, step, {LOSS: 1.0}))
    assert not h.agg.admits(metrics(1, 16, {LOSS: 2.0}), closing=True)  # 16 open: the bound
    assert h.records == []


def test_name_cardinality_is_bounded() -> None:
    h = Harness(max_names_per_run=5)
    h.send(hello(1), metrics(1, 0, {f"n{i}": 1.0 for i in range(8)}), P.Done(1, 2, 0))
    assert len(h.records[0].metrics) == 5 and h.agg.health.names_overflow == 3


def test_flush_emits_open_steps() -> None:
    h = Harness()
    h.send(hello(1, ws=2), metrics(1, 0, {LOSS: 1.0}))
    h.agg.flush()
    # rank 0 sent data but had not finished the step either
    assert h.records[0].partial and h.records[0].missing == ("actor_train/0", "actor_train/1")
    assert h.records[0].metrics[LOSS] == 1.0


def test_nonfinite_counts_reach_the_record() -> None:
    h = Harness()
    h.send(hello(1), metrics(1, 0, {LOSS: 1.0}, nonfinite={LOSS: 3}), P.Done(1, 2, 0))
    assert h.records[0].nonfinite == {LOSS: 3}


def test_producer_stats_reach_health() -> None:
    h = Harness()
    h.send(hello(1), P.Heartbeat(1, 2, {"dropped_send": 4, "dropped_queue_full": 1}))
    h.send(hello(2), P.Heartbeat(2, 2, {"errors": 2, "invalid": 3, "dropped_send": 1}))
    health = h.agg.health.snapshot()
    assert health["producer_dropped"] == 6
    assert health["producer_errors"] == 2 and health["producer_invalid"] == 3


def test_new_run_waits_for_late_roles_during_the_settle_window() -> None:
    h = Harness(settle_s=5, liveness_s=1000)
    h.send(hello(1, role="actor_train"), metrics(1, 0, {LOSS: 1.0}), metrics(1, 1, {LOSS: 1.0}))
    assert h.records == []  # step 0 is complete for the roles seen, but the run is new
    h.tick(1)
    h.send(hello(2, role="critic"), metrics(2, 0, {M.CRITIC_LOSS.name: 2.0}), P.Done(2, 2, 1))
    h.tick(4.1)
    assert (
        h.steps() == [0]
        and h.records[0].metrics[M.CRITIC_LOSS.name] == 2.0
        and not h.records[0].partial
    )


def test_declared_topology_is_waited_for_by_name() -> None:
    h = Harness(settle_s=1000, liveness_s=1000, grace_s=1000)
    declared = P.Hello(1, 1, "r", "actor_train", 0, 1, "h", 1, {"actor_train": 1, "critic": 2})
    h.send(declared, metrics(1, 0, {LOSS: 1.0}), P.Done(1, 2, 0))
    assert h.records == []  # critic/0 and critic/1 have not even registered
    h.send(hello(2, role="critic", rank=0, ws=2), hello(3, role="critic", rank=1, ws=2))
    h.send(P.Done(2, 2, 0), P.Done(3, 2, 0))
    assert h.steps() == [0] and not h.records[0].partial  # no settle wait: the topology is known


def test_names_beyond_the_run_bound_are_told_to_their_producer() -> None:
    """Issue 38, item 5: counted at the collector only; now in the producer's feedback."""
    h = Harness(max_names_per_run=2, liveness_s=1000)
    h.send(hello(1, rank=0, ws=1))
    h.send(metrics(1, 0, {"x/a": 1.0, "x/b": 1.0, "x/c": 1.0, "x/d": 1.0}))
    h.send(metrics(1, 1, {"x/a": 1.0, "x/b": 1.0, "x/c": 1.0, "x/d": 1.0}))
    assert h.agg.feedback(1)[3] == 4 and h.agg.health.names_overflow >= 2
