"""Issue 41's proof at the collector: a step's samples are those of the union of every rank's
rows, however the rows were split into calls, ranks and relays, in any arrival order; after a
restart from saved state; and without the rows of a replaced process.

Rows get their random keys from a seeded generator here (``reduce_rows(keys=...)``), so the
test knows every row's key and computes the union's top, bottom and random ``k`` directly:
sorted by key (ties by random key) and by random key, over all rows.
"""

from __future__ import annotations

import array
import random
from dataclasses import dataclass

from hypothesis import HealthCheck, given, settings, strategies as st

from rlpulse.collector.tiers.relay import HEARTBEAT_S
from rlpulse.schemas import Summary, metrics as M, protocol as P
from rlpulse.schemas.record import StepRecord
from rlpulse.schemas.samples import SampleLimits, SampleState, encode, reduce_rows
from tests.collector.helpers import TIMING, Harness, hello, table, through_a_restart
from tests.collector.tiers import Relay, Tiers

NAME = M.ROLLOUT_SAMPLES.name
ROLE = "actor_train"


@dataclass
class Row:
    """A row as logged, with the random key it is given."""

    rkey: int
    fields: dict


def samples_metrics(pid: int, seq: int, step: int, rows: list[Row], rank: int, k: int) -> P.Metrics:
    """One ``log({NAME: Samples(rows, key="reward", k=k)}, step)`` of producer ``pid``, as its
    sender sends it (the count row and the state beside it)."""
    keys = iter([r.rkey for r in rows])
    state = reduce_rows(
        [r.fields for r in rows],
        "reward",
        origin=(ROLE, rank),
        limits=SampleLimits(k=k),
        keys=keys.__next__,
    )
    values = array.array("d", Summary.of_scalar(float(state.rows))).tobytes()
    entry = P.pack_entry(step, 0.0, table([NAME]).id, values, {}, None, {0: encode(state)})
    return P.decode(P.encode_metrics(pid, seq, [entry]))  # type: ignore[return-value]


def expected(rows: list[Row], k: int) -> tuple[list[int], list[int], list[int]]:
    """The union's top, bottom and random ``k``, as random keys."""
    top = sorted(rows, key=lambda r: (-r.fields["reward"], r.rkey))[:k]
    bottom = sorted(rows, key=lambda r: (r.fields["reward"], r.rkey))[:k]
    rand = sorted(rows, key=lambda r: r.rkey)[:k]
    return [r.rkey for r in top], [r.rkey for r in bottom], [r.rkey for r in rand]


def got(state: SampleState) -> tuple[list[int], list[int], list[int]]:
    return (
        [r.rkey for r in state.top],
        [r.rkey for r in state.bottom],
        [r.rkey for r in state.random],
    )


@st.composite
def ranks(draw: st.DrawFn) -> tuple[int, list[list[list[Row]]]]:
    """``k``, and per rank its calls, each a list of rows (rewards with many ties; a rank may
    log no row, or very many more than another)."""
    k = draw(st.integers(1, 6))
    rng = random.Random(draw(st.integers(0, 2**32 - 1)))
    world = draw(st.integers(1, 5))
    out = []
    for rank in range(world):
        calls = []
        for _ in range(draw(st.integers(1, 3))):
            n = draw(st.sampled_from([0, 1, 2, 7, 40]))
            calls.append(
                [
                    Row(rng.getrandbits(63), {"reward": float(rng.randint(-3, 3)), "rank": rank})
                    for _ in range(n)
                ]
            )
        out.append(calls)
    return k, out


def streams(k: int, world: list[list[list[Row]]]) -> dict[int, list[P.Message]]:
    """Per producer id, its messages: hello, its calls for step 0, then ``done``."""
    out = {}
    for rank, calls in enumerate(world):
        pid = 100 + rank
        msgs: list[P.Message] = [hello(pid, rank=rank, ws=len(world), tables=[table([NAME])])]
        for seq, rows in enumerate(calls, 1):
            msgs.append(samples_metrics(pid, seq, 0, rows, rank, k))
        msgs.append(P.Done(pid, len(calls) + 1, 0))
        out[pid] = msgs
    return out


def interleaved(per: dict[int, list[P.Message]], rnd: random.Random) -> list[P.Message]:
    queues = {pid: list(msgs) for pid, msgs in per.items()}
    order = []
    while queues:
        pid = rnd.choice(sorted(queues))
        order.append(queues[pid].pop(0))
        if not queues[pid]:
            del queues[pid]
    return order


def check(rec: StepRecord, k: int, world: list[list[list[Row]]]) -> None:
    rows = [r for calls in world for rs in calls for r in rs]
    assert rec.metrics[NAME] == len(rows)
    state = rec.samples[NAME]  # a state of no rows too: the name is there, with empty sets
    assert got(state) == expected(rows, k)
    assert state.rows == len(rows)
    by_key = {r.rkey: r for r in rows}
    for kept in (*state.top, *state.bottom, *state.random):  # each row as logged, its origin
        assert kept.fields == by_key[kept.rkey].fields
        assert (kept.role, kept.rank) == (ROLE, kept.fields["rank"])


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ranks(), st.integers(0, 2**32 - 1))
def test_merged_samples_are_the_unions_top_bottom_and_random_k(drawn, seed) -> None:
    k, world = drawn
    h = Harness()
    h.send(*interleaved(streams(k, world), random.Random(seed)))
    assert [r.step for r in h.records] == [0]
    check(h.records[0], k, world)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ranks(), st.integers(0, 2**32 - 1), st.integers(1, 3))
def test_through_relays_the_samples_are_the_same(drawn, seed, relays) -> None:
    """Each rank behind one of a few relays: the root's samples are the union's, and the
    same as one collector's of every rank."""
    k, world = drawn
    rnd = random.Random(seed)
    t = Tiers()
    t.relays = {via: Relay(0xA0 + via, t.root, t.clock) for via in range(relays)}
    per = streams(k, world)
    via = {pid: rnd.randrange(relays) for pid in per}
    for msg in interleaved(per, rnd):
        t.send(via[msg.producer], msg)
    for _ in range(int((TIMING["liveness_s"] + TIMING["grace_s"]) / HEARTBEAT_S) + 2):
        t.tick(HEARTBEAT_S)
    assert [r.step for r in t.out] == [r.step for r in t.ref_out] == [0]
    check(t.out[0], k, world)
    check(t.ref_out[0], k, world)
    assert t.out[0].samples[NAME].record() == t.ref_out[0].samples[NAME].record()


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ranks(), st.integers(0, 2**32 - 1), st.floats(0, 1), st.floats(0, 1))
def test_a_collector_restarted_from_its_state_gives_the_same_samples(
    drawn, seed, checkpoint_at, crash_at
) -> None:
    """Checkpointed at one point, crashed at a later one and recovered as the daemon does
    (checkpoint restored, emitted steps noted, the write-ahead log replayed): the samples
    are those of a collector that never stopped, row for row."""
    k, world = drawn
    order = interleaved(streams(k, world), random.Random(seed))
    records, want = through_a_restart(order, checkpoint_at, crash_at)
    assert [r.step for r in records] == [r.step for r in want] == [0]
    assert {n: s.record() for n, s in records[0].samples.items()} == {
        n: s.record() for n, s in want[0].samples.items()
    }
    check(records[0], k, world)


def test_a_replaced_process_rows_are_withdrawn_from_the_steps_samples() -> None:
    """Rank 0's first process logs rows at step 0 and dies before finishing it; a new process
    takes the slot over and logs other rows: the step's samples hold none of the old rows."""
    rng = random.Random(41)

    def rows(n: int, reward: float, tag: str) -> list[Row]:
        return [Row(rng.getrandbits(63), {"reward": reward, "who": tag}) for _ in range(n)]

    old, new, other = rows(20, 100.0, "old"), rows(3, 1.0, "new"), rows(5, 2.0, "rank1")
    h = Harness()
    h.send(hello(1, rank=0, ws=2), hello(2, rank=1, ws=2))
    h.send(samples_metrics(1, 1, 0, old, 0, 4), samples_metrics(2, 1, 0, other, 1, 4))
    h.send(P.Done(2, 2, 0))
    h.send(hello(3, rank=0, ws=2))  # the restarted rank: its old data for step 0 withdrawn
    h.send(samples_metrics(3, 1, 0, new, 0, 4), P.Done(3, 2, 0))
    assert [r.step for r in h.records] == [0]
    rec = h.records[0]
    state = rec.samples[NAME]
    kept = {r.fields["who"] for r in (*state.top, *state.bottom, *state.random)}
    assert kept == {"new", "rank1"}
    assert rec.metrics[NAME] == 8 and state.rows == 8
    assert got(state) == expected(new + other, 4)


def test_a_malformed_state_is_rejected_and_counted_the_count_still_merges() -> None:
    h = Harness()
    h.send(hello(1))
    values = array.array("d", Summary.of_scalar(3.0)).tobytes()
    entry = P.pack_entry(0, 0.0, table([NAME]).id, values, {}, None, {0: b"\x93not a state"})
    h.send(P.decode(P.encode_metrics(1, 1, [entry])), P.Done(1, 2, 0))
    assert h.agg.health.malformed["bad_samples"] == 1
    assert h.records[0].metrics[NAME] == 3 and not h.records[0].samples


def test_producers_dropped_rows_reach_health() -> None:
    h = Harness()
    h.send(hello(1), P.Heartbeat(1, 2, {"samples_dropped": 4, "samples_cut": 9}))
    h.send(hello(2, rank=1, ws=2), P.Heartbeat(2, 2, {"samples_dropped": 1}))
    assert h.agg.health.snapshot()["producer_samples_dropped"] == 5
