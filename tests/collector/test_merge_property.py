"""Whatever order the ranks' messages arrive in, each step is emitted once, complete, and
exactly the pool of every rank's samples, also when a rank's process is replaced mid-step.

The ranks of a run send, per step, one to three ``log()`` calls and then ``done``; their
streams interleave at random (each producer's own messages stay in order, as the delivery
layer keeps them). A rank may die part-way through a step and be replaced by a new process,
which logs that step again from the start: the step must then hold the new process's data
only, whether the old process's last messages arrive before or after the new one's hello.
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings, strategies as st

from rlpulse.collector.tiers.relay import HEARTBEAT_S
from rlpulse.schemas import Summary, metrics as M, protocol as P
from rlpulse.schemas.record import StepRecord
from tests.collector.helpers import TIMING, Harness, hello, metrics, table, through_a_restart
from tests.collector.tiers import Relay, Tiers

ADV = M.CRITIC_ADVANTAGES.name
"""Samples: pooled mean, max and min."""
LOSS = M.ACTOR_PG_LOSS.name
"""A rank's own mean over its tokens: pooled weighted by tokens."""
TIME = M.TIME_PHASE.format(cluster="actor_train", phase="train_step", part="total")
"""Logged once per rank and step: the slowest rank's."""


@dataclass
class Call:
    step: int
    samples: np.ndarray
    loss: tuple[float, int] | None
    """(mean, tokens) or not logged in this call."""
    time: float | None


@dataclass
class Life:
    """One process of a rank: its producer id, the calls it sends in order, and the steps it
    finishes. A process that dies part-way through a step sent that step's first calls only;
    its successor logs the step again from the start."""

    pid: int
    rank: int
    calls: list[Call] = field(default_factory=list)
    done: list[int] = field(default_factory=list)

    def counted(self) -> list[Call]:
        """The calls whose data the run keeps: those of the steps this process finished."""
        return [c for c in self.calls if c.step in self.done]


@st.composite
def call(draw: st.DrawFn, step: int, first: bool) -> Call:
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    n = draw(st.sampled_from([0, 1, 3, 50]))
    samples = rng.normal(draw(st.sampled_from([0.0, 5.0, -100.0])), 3, n)
    if n and draw(st.booleans()):
        samples[0] = math.nan  # counted apart, never pooled
    loss = None
    if draw(st.booleans()):
        loss = (float(rng.normal()), draw(st.integers(1, 4096)))
    time = float(draw(st.integers(1, 10_000))) / 100 if first else None
    return Call(step, samples, loss, time)


@st.composite
def runs(draw: st.DrawFn) -> tuple[int, int, list[Life], dict[int, set[int]]]:
    """World size, steps, every process of every rank (in the order each rank ran them),
    and per step the ranks nobody ran it for: a process may die before logging anything of
    a step, or part-way through it, and its successor may log that step again from the
    start or go on from the next one (resumed from a later checkpoint)."""
    world = draw(st.integers(1, 5))
    steps = draw(st.integers(1, 4))
    lives: list[Life] = []
    skipped: dict[int, set[int]] = {}
    pid = 100
    for rank in range(world):
        restart_at = draw(st.one_of(st.none(), st.integers(0, steps - 1)))
        life = Life(pid, rank)
        skip = False
        for step in range(steps):
            if step == restart_at:  # logs none, or part, of this step and dies
                begun = draw(st.integers(0, 2))
                life.calls += [draw(call(step, True)) for _ in range(begun)]
                lives.append(life)
                pid += 1
                life = Life(pid, rank)
                skip = step + 1 < steps and draw(st.booleans())
            if skip:  # the successor goes on from the next step
                skipped.setdefault(step, set()).add(rank)
                skip = False
                continue
            life.calls += [draw(call(step, k == 0)) for k in range(draw(st.integers(1, 3)))]
            life.done.append(step)
        lives.append(life)
        pid += 1
    return world, steps, lives, skipped


def stream(life: Life, world: int) -> tuple[list[P.Message], int]:
    """A process's messages in order (hello, then each step's calls and done), and how many
    of them it sent before its successor started: up to its last ``done``, or its hello. The
    hello declares the tables of all its calls (positions in the stream stay one a message)."""
    out: list[P.Message] = [hello(life.pid, rank=life.rank, ws=world)]
    tables: dict[int, P.TableDecl] = {}
    before = 1
    for k, c in enumerate(life.calls):
        values: dict[str, Summary | float] = {ADV: Summary.of_samples(c.samples)}
        if c.loss is not None:
            values[LOSS] = Summary.of_weighted(*c.loss)
        if c.time is not None:
            values[TIME] = c.time
        decl = table(list(values))
        tables[decl.id] = decl
        bad = int(np.isnan(c.samples).sum())
        out.append(metrics(life.pid, c.step, values, nonfinite={ADV: bad} if bad else None))
        last = k + 1 == len(life.calls) or life.calls[k + 1].step != c.step
        if last and c.step in life.done:
            out.append(P.Done(life.pid, len(out), c.step))
            before = len(out)
    out[0] = hello(life.pid, rank=life.rank, ws=world, tables=tables.values())
    return out, before


def arrivals(lives: list[Life], world: int, rnd: random.Random) -> Iterator[tuple[P.Message, bool]]:
    """Every process's messages, interleaved at random, each with whether it comes after its
    process's successor said hello (its data is then refused). A successor's hello comes
    after everything its predecessor sent up to its last ``done`` (that process had died
    before the successor started); the predecessor's last, unfinished calls may still
    arrive at any point after that."""
    queues, before = {}, {}
    for life in lives:
        queues[life.pid], before[life.pid] = stream(life, world)
    predecessor = {b.pid: a.pid for a, b in itertools.pairwise(lives) if a.rank == b.rank}
    successor = {a: b for b, a in predecessor.items()}
    sent = dict.fromkeys(queues, 0)
    while any(sent[pid] < len(q) for pid, q in queues.items()):
        ready = [
            pid
            for pid, q in queues.items()
            if sent[pid] < len(q)
            and (pid not in predecessor or sent[predecessor[pid]] >= before[predecessor[pid]])
        ]
        pid = rnd.choice(ready)
        yield queues[pid][sent[pid]], bool(sent.get(successor.get(pid, -1), 0))
        sent[pid] += 1


def check_steps(emitted: list[int], lives: list[Life], late: int = 0) -> None:
    """Each step once, in order, and no step nobody logged (such a step is never opened;
    nor is one whose only data came from a replaced process after its successor's hello,
    which is refused and counted). Every step a finished process logged is there, unless
    ``late`` entries were counted: through relays, a restarted rank's finished steps may
    wait at its old relay until the root has gone past them."""
    assert emitted == sorted(set(emitted)), emitted
    assert set(emitted) <= {c.step for life in lives for c in life.calls}, emitted
    counted = {c.step for life in lives for c in life.counted()}
    assert counted <= set(emitted) or late, emitted


def check_exact(rec: StepRecord, world: int, lives: list[Life], skipped: set[int]) -> None:
    """``rec`` is the exact pool of what the finished processes logged for its step, and
    complete unless a rank's step was ``skipped``: then it is partial, naming the rank."""
    if skipped:
        assert rec.partial, rec
        assert {f"actor_train/{r}" for r in skipped} <= set(rec.missing), rec.missing
    else:
        assert not rec.partial and rec.ranks == world, rec
    calls = [c for life in lives for c in life.counted() if c.step == rec.step]
    if not calls:
        return
    pooled = np.concatenate([c.samples for c in calls])
    finite = pooled[np.isfinite(pooled)]
    if finite.size:
        assert rec.metrics[f"{ADV}/mean"] == pytest.approx(finite.mean(), rel=1e-12, abs=1e-12)
        assert rec.metrics[f"{ADV}/max"] == finite.max()
        assert rec.metrics[f"{ADV}/min"] == finite.min()
    losses = [c.loss for c in calls if c.loss is not None]
    if losses:
        weights = sum(w for _, w in losses)
        want = sum(v * w for v, w in losses) / weights
        assert rec.metrics[LOSS] == pytest.approx(want, rel=1e-9, abs=1e-12)
    else:
        assert LOSS not in rec.metrics
    assert rec.metrics[TIME] == max(c.time for c in calls if c.time is not None)
    assert rec.ranks == len(
        {(life.rank) for life in lives for c in life.counted() if c.step == rec.step}
    )


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(runs(), st.integers(0, 2**32 - 1))
def test_any_arrival_order_and_restarts_give_each_step_once_and_exact(drawn, seed) -> None:
    world, _, lives, skipped = drawn
    rnd = random.Random(seed)
    h = Harness()
    refused = 0  # data of a process sent after its successor's hello: counted, not merged
    for msg, after_successor in arrivals(lives, world, rnd):
        if isinstance(msg, P.Metrics) and after_successor:
            refused += len(msg.entries)
        h.send(msg)
    check_steps(h.steps(), lives)
    assert h.agg.health.rank_takeovers == sum(
        a.rank == b.rank for a, b in itertools.pairwise(lives)
    )
    assert h.agg.health.conflict_entries == refused
    for rec in h.records:
        check_exact(rec, world, lives, skipped.get(rec.step, set()))


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(runs(), st.integers(0, 2**32 - 1), st.integers(1, 3))
def test_through_relays_each_step_is_once_and_exact_or_flagged(drawn, seed, relays) -> None:
    """The same streams, each process behind one of a few relays (a restarted rank may come
    back on another node, behind another relay), the root fed what the relays forward, and
    time then running on until every silent process is presumed dead: every step once, in
    order. Without restarts every step is exact and complete, as a single collector gives
    it. A replaced process's data, once merged at its relay with other ranks', cannot be
    taken out at the root: such a step may go out partial, naming the rank, but never
    complete with a wrong number."""
    world, _, lives, skipped = drawn
    rnd = random.Random(seed)
    t = Tiers()
    t.relays = {via: Relay(0xA0 + via, t.root, t.clock) for via in range(relays)}
    via = {life.pid: rnd.randrange(relays) for life in lives}
    for msg, _ in arrivals(lives, world, rnd):
        t.send(via[msg.producer], msg)
    for _ in range(int((TIMING["liveness_s"] + TIMING["grace_s"]) / HEARTBEAT_S) + 2):
        t.tick(HEARTBEAT_S)
    check_steps([r.step for r in t.out], lives, t.root.health.late)
    restarted = {a.rank for a, b in itertools.pairwise(lives) if a.rank == b.rank}
    for rec in t.out:
        assert rec.partial or not skipped.get(rec.step), rec
        if rec.partial:
            # The replaced rank, or "overcounted": more processes than ranks contributed.
            named = {f"actor_train/{r}" for r in restarted} | {"actor_train/overcounted"}
            assert restarted and set(rec.missing) <= named, rec.missing
        else:
            check_exact(rec, world, lives, set())
    if not restarted:
        t.same_as_reference()


# A restarted rank whose old process alone had opened a step (it logged step 1, then a new
# process took the slot over and ran step 2), and a checkpoint after the takeover: the step
# lost its only data, and recovery must still emit it partial (found by Hypothesis).
RESTART_OPENED_ONLY_BY_THE_OLD = (
    1,
    3,
    [
        Life(
            pid=100,
            rank=0,
            calls=[Call(0, np.array([]), None, 0.01), Call(1, np.array([]), None, 0.01)],
            done=[0],
        ),
        Life(pid=101, rank=0, calls=[Call(2, np.array([]), None, 0.01)], done=[2]),
    ],
    {1: {0}},
)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(runs(), st.integers(0, 2**32 - 1), st.floats(0, 1), st.floats(0, 1))
@example(RESTART_OPENED_ONLY_BY_THE_OLD, 1, 1.0, 0.75)
def test_a_collector_restarted_anywhere_emits_what_it_would_have(
    drawn, seed, checkpoint_at, crash_at
) -> None:
    """The same streams into a collector that checkpoints at one point, crashes at a later
    one and is recovered as the daemon does (the checkpoint restored, the steps emitted
    since noted, the write-ahead log replayed from the oldest open step's first data), then
    takes the rest: together it emits exactly what one that never stopped emits."""
    world, _, lives, _ = drawn
    order = [msg for msg, _ in arrivals(lives, world, random.Random(seed))]
    got, want = through_a_restart(order, checkpoint_at, crash_at)
    assert [(r.step, r.partial, r.missing, r.ranks) for r in got] == [
        (r.step, r.partial, r.missing, r.ranks) for r in want
    ]
    for g, w in zip(got, want, strict=True):  # merged in another order: equal to rounding
        assert g.metrics == pytest.approx(w.metrics, rel=1e-12, abs=1e-12), g.step
