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
from dataclasses import dataclass, field

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from rlpulse.schemas import Summary, metrics as M, protocol as P
from tests.collector.helpers import Harness, hello, metrics

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
def runs(draw: st.DrawFn) -> tuple[int, int, list[Life]]:
    """World size, steps, and every process of every rank, in the order each rank ran them."""
    world = draw(st.integers(1, 5))
    steps = draw(st.integers(1, 4))
    lives: list[Life] = []
    pid = 100
    for rank in range(world):
        restart_at = draw(st.one_of(st.none(), st.integers(0, steps - 1)))
        life = Life(pid, rank)
        for step in range(steps):
            if step == restart_at:  # logs part of this step and dies
                life.calls += [draw(call(step, True)) for _ in range(draw(st.integers(1, 2)))]
                lives.append(life)
                pid += 1
                life = Life(pid, rank)
            life.calls += [draw(call(step, k == 0)) for k in range(draw(st.integers(1, 3)))]
            life.done.append(step)
        lives.append(life)
        pid += 1
    return world, steps, lives


def stream(life: Life, world: int) -> tuple[list[P.Message], int]:
    """A process's messages in order (hello, then each step's calls and done), and how many
    of them it sent before its successor started: up to its last ``done``, or its hello."""
    out: list[P.Message] = [hello(life.pid, rank=life.rank, ws=world)]
    before = 1
    for k, c in enumerate(life.calls):
        values: dict[str, Summary | float] = {ADV: Summary.of_samples(c.samples)}
        if c.loss is not None:
            values[LOSS] = Summary.of_weighted(*c.loss)
        if c.time is not None:
            values[TIME] = c.time
        bad = int(np.isnan(c.samples).sum())
        out.append(metrics(life.pid, c.step, values, nonfinite={ADV: bad} if bad else None))
        last = k + 1 == len(life.calls) or life.calls[k + 1].step != c.step
        if last and c.step in life.done:
            out.append(P.Done(life.pid, len(out), c.step))
            before = len(out)
    return out, before


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(runs(), st.randoms(use_true_random=False))
def test_any_arrival_order_and_restarts_give_each_step_once_and_exact(drawn, rnd) -> None:
    """A successor's hello comes after everything its predecessor sent up to its last
    ``done`` (that process had died before the successor started); the predecessor's last,
    unfinished calls may still arrive at any point after that."""
    world, steps, lives = drawn
    h = Harness()
    queues, before = {}, {}
    for life in lives:
        queues[life.pid], before[life.pid] = stream(life, world)
    predecessor = {b.pid: a.pid for a, b in itertools.pairwise(lives) if a.rank == b.rank}
    successor = {a: b for b, a in predecessor.items()}
    sent = dict.fromkeys(queues, 0)
    refused = 0  # data of a process sent after its successor's hello: counted, not merged
    while any(sent[pid] < len(q) for pid, q in queues.items()):
        ready = [
            pid
            for pid, q in queues.items()
            if sent[pid] < len(q)
            and (pid not in predecessor or sent[predecessor[pid]] >= before[predecessor[pid]])
        ]
        pid = rnd.choice(ready)
        msg = queues[pid][sent[pid]]
        if isinstance(msg, P.Metrics) and sent.get(successor.get(pid, -1), 0):
            refused += len(msg.entries)
        h.send(msg)
        sent[pid] += 1

    assert h.steps() == list(range(steps))
    assert h.agg.health.rank_takeovers == len(successor)
    assert h.agg.health.conflict_entries == refused
    for rec in h.records:
        assert not rec.partial and rec.ranks == world, rec
        calls = [c for life in lives for c in life.counted() if c.step == rec.step]
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
