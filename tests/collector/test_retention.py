"""Runs are forgotten ``run_retention_s`` after they end (``rlpulse.collector.runs.retention``):
their state leaves the aggregator and its checkpoint, the sinks are told, and a tombstone
keeps what a producer of a forgotten run sends later counted as late."""

from __future__ import annotations

import json

from rlpulse.collector.config import CollectorConfig
from rlpulse.collector.intake.delivery import Delivery
from rlpulse.collector.runs.aggregator import Aggregator
from rlpulse.collector.runs.retention import TOMBSTONE_RETENTIONS
from rlpulse.collector.tiers.relay import Relay as RelayOutput, RelayRecord
from rlpulse.collector.tiers.upstream import UpstreamSink
from rlpulse.schemas import protocol as P
from rlpulse.schemas.record import RunForgotten, StepRecord
from tests.collector.helpers import TIMING, Declaring, Harness, hello, metrics

LOSS = "actor/pg_loss"
RETENTION = 30.0


def finished_run(h: Harness, run: str, first_pid: int, steps: int = 3) -> None:
    """Two ranks of ``run`` log ``steps`` steps and say goodbye."""
    a, b = first_pid, first_pid + 1
    h.send(hello(a, run=run, rank=0, ws=2), hello(b, run=run, rank=1, ws=2))
    for step in range(steps):
        h.send(metrics(a, step, {LOSS: 1.0}), metrics(b, step, {LOSS: 3.0}))
    h.send(P.Bye(a, 99, {"dropped_queue_full": 2}), P.Bye(b, 99, {}))


def wait(h: Harness, seconds: float) -> None:
    """Time passes as it does for the daemon, which polls all the time (a run is found ended
    at the first check after it ended, ``SWEEP_S`` at most)."""
    end = h.now + seconds
    while h.now + 0.5 < end:
        h.tick(0.5)
    h.tick(end - h.now)


def steps_of(h: Harness, run: str) -> list[int]:
    return [r.step for r in h.records if isinstance(r, StepRecord) and r.run == run]


def test_an_ended_run_is_forgotten_after_the_retention_and_leaves_a_tombstone() -> None:
    h = Harness(run_retention_s=RETENTION)
    finished_run(h, "a", 1)
    assert steps_of(h, "a") == [0, 1, 2]
    wait(h, RETENTION - 1)
    assert "a" in h.agg.runs and not any(isinstance(r, RunForgotten) for r in h.records)
    dropped = h.agg.health.producer_dropped()
    wait(h, 2)
    assert h.records[-1] == RunForgotten("a")
    assert h.agg.runs == {} and h.agg.membership.runs == {} and h.agg.producers == {}
    assert h.agg.output.totals == {}  # type: ignore[attr-defined]
    assert h.agg.health.runs_forgotten == 1 and h.agg.health.producers == 0
    assert h.agg.health.producer_dropped() == dropped == 2  # a total never goes down
    snapshot = json.dumps(h.agg.snapshot())
    assert '"a"' in snapshot and snapshot.count("actor_train") == 0  # the tombstone only
    # Their delivery numbering stays while the tombstone does.
    assert h.agg.take_forgotten() == []


def test_late_data_of_a_forgotten_run_is_counted_late_and_never_a_new_run() -> None:
    h = Harness(run_retention_s=RETENTION)
    finished_run(h, "a", 1)
    wait(h, RETENTION + 1)
    emitted = len(h.records)
    # Producer 2 comes back (its hello again, then data for a step never emitted).
    h.send(hello(2, run="a", rank=1, ws=2), metrics(2, 7, {LOSS: 5.0}), metrics(2, 8, {LOSS: 5.0}))
    assert h.agg.health.late == 2 and h.agg.feedback(2)[0] == 2
    wait(h, 60)
    assert len(h.records) == emitted  # nothing emitted, no run made
    assert h.agg.runs == {} and h.agg.membership.runs == {}
    assert h.agg.health.run_attempts == 0
    # Silent again for the retention, it was let go of; its tombstone still knows it, and
    # the late count it was told goes on from there.
    assert h.agg.membership.ghosts == {}
    h.send(metrics(2, 9, {LOSS: 5.0}))
    assert h.agg.health.late == 3 and h.agg.feedback(2)[0] == 3
    # Without a hello, data of the other producer is recognised as well.
    h.send(metrics(1, 9, {LOSS: 5.0}))
    assert h.agg.health.late == 4 and h.agg.feedback(1)[0] == 1


def test_a_new_process_naming_a_forgotten_run_starts_an_attempt_or_resumes_it() -> None:
    h = Harness(run_retention_s=RETENTION)
    finished_run(h, "a", 1)
    wait(h, RETENTION + 1)
    finished_run(h, "a", 10, steps=1)  # the same program again
    assert steps_of(h, "a-2") == [0] and h.agg.health.run_attempts == 1
    wait(h, RETENTION + 1)
    assert h.agg.runs == {}
    # Resumed: it goes on from the last step emitted; steps up to it are late.
    h.send(hello(20, run="a", rank=0, ws=1, resume=True))
    h.send(metrics(20, 2, {LOSS: 1.0}), metrics(20, 3, {LOSS: 1.0}), P.Bye(20, 99, {}))
    assert steps_of(h, "a") == [0, 1, 2, 3]
    assert h.agg.health.late == 1 and h.agg.feedback(20)[0] == 1


def test_tombstones_go_after_their_age_and_then_their_numbering() -> None:
    h = Harness(run_retention_s=RETENTION)
    delivery = Delivery(h.agg.health)
    finished_run(h, "a", 1)
    for pid in (1, 2):
        delivery.accept(hello(pid, run="a"), b"id", b"")
    wait(h, RETENTION + 1)
    assert h.agg.take_forgotten() == []
    wait(h, RETENTION * TOMBSTONE_RETENTIONS + 2)
    forgotten = h.agg.take_forgotten()
    assert sorted(forgotten) == [1, 2]
    delivery.forget(forgotten)
    assert delivery.last_seq == {} and delivery.identity == {}
    assert "forgotten" not in h.agg.snapshot()
    # Past the tombstone a producer is unknown: its data is not applied (nor late).
    h.send(metrics(2, 9, {LOSS: 5.0}))
    assert h.agg.health.late == 0 and h.agg.health.unknown_producer == 1


def test_a_run_that_is_live_again_is_not_forgotten() -> None:
    """Both ranks presumed gone (silent for liveness_s): the run has ended; one of them is
    heard from again within the retention: the run is live, and kept."""
    h = Harness(run_retention_s=RETENTION, liveness_s=5.0, grace_s=5.0)
    h.send(hello(1, run="a", rank=0, ws=1), metrics(1, 0, {LOSS: 1.0}))
    wait(h, RETENTION - 1)  # silent: presumed gone since 5 s, step 0 emitted partial
    h.send(metrics(1, 1, {LOSS: 1.0}))
    wait(h, 4)
    assert "a" in h.agg.runs
    wait(h, RETENTION + 10)
    assert "a" not in h.agg.runs


def test_forgetting_survives_a_restart_from_an_older_checkpoint() -> None:
    """Checkpointed before the run was forgotten, crashed after: the outbox holds the
    RunForgotten, and recovery forgets the run again (without telling the sinks twice)."""
    h = Harness(run_retention_s=RETENTION)
    finished_run(h, "a", 1)
    snapshot = h.agg.snapshot()
    wait(h, RETENTION + 1)
    again = Harness(run_retention_s=RETENTION)
    again.agg.restore(json.loads(json.dumps(snapshot)), 0.0)
    assert "a" in again.agg.runs
    again.agg.note_emitted(RunForgotten("a"))
    assert again.agg.runs == {} and again.records == []
    again.send(metrics(1, 9, {LOSS: 5.0}))
    assert again.agg.health.late == 1


def test_a_relay_forgets_a_run_and_its_upstream_sink_its_members() -> None:
    """Behind a relay: the relay forgets the run as any collector (its forwarded steps and
    announced members too), and tells its upstream sink, whose hellos then leave them out."""
    config = CollectorConfig(
        upstream="tcp://127.0.0.1:9", trackers={}, run_retention_s=RETENTION, **TIMING
    )
    sent: list[RelayRecord] = []
    relay = RelayOutput(77)
    h = Harness()
    h.agg = Aggregator(sent.append, config, output=relay)
    h.feed = Declaring(h.agg)
    finished_run(h, "a", 1)
    assert "a" in relay.forwarded and set(relay.announced) == {1, 2}
    wait(h, RETENTION + 1)
    forget = sent[-1]
    assert forget.kind == "forget" and {m.producer for m in forget.members} == {1, 2}
    assert relay.forwarded == {} and relay.announced == {} and h.agg.runs == {}
    upstream = UpstreamSink(config, 77)
    try:
        for kind in ("delta", "forget"):
            assert any(r.kind == kind for r in sent)
        upstream._members = {m.producer: m for m in forget.members}
        upstream.member_late = {1: 3}
        upstream.write(forget)
        assert upstream._members == {} and upstream.member_late == {}
    finally:
        upstream.close()
