"""A silent relay is not dead ranks (issue 46, item 2), in process: two relays and a root, one
relay frozen as by SIGSTOP (``Relay.freeze``: it receives, polls and sends nothing; its clock
leaves the freeze out, as the daemon's does), checked against one collector of every rank.

The root waits for a silent relay's ranks as for slow ranks, holds the other relay back
once it is a window ahead, presumes the relay dead after ``max(grace_s, liveness_s)`` of
silence, and still finds ranks that died behind it once it speaks again."""

from __future__ import annotations

import logging

import numpy as np

from rlpulse.collector.config import CollectorConfig
from rlpulse.collector.health import Health
from rlpulse.collector.sinks.base import SinkContext
from rlpulse.collector.sinks.prometheus import PrometheusSink
from rlpulse.collector.tiers import watch
from rlpulse.collector.tiers.relay import HEARTBEAT_S
from rlpulse.schemas import Summary, metrics as M, protocol as P
from tests.collector.helpers import TIMING, hello, metrics
from tests.collector.tiers import Tiers
from tests.support.prom import scrape_registry

ADV, LOSS = M.CRITIC_ADVANTAGES.name, M.ACTOR_PG_LOSS.name
LIVENESS_S, GRACE_S = TIMING["liveness_s"], TIMING["grace_s"]
DEAD_S = watch.dead_after(CollectorConfig(**TIMING))  # type: ignore[arg-type]
RANKS = {"A": ((1, 0), (2, 1)), "B": ((3, 2), (4, 3))}
"""Per relay, its ranks (producer id, rank) of a world of four."""


def two_relays(**root_config: object) -> Tiers:
    t = Tiers(**root_config)
    for via, ranks in RANKS.items():
        t.send(via, *(hello(pid, rank=rank, ws=4) for pid, rank in ranks))
    return t


def log_step(t: Tiers, via: str, step: int, ranks=None) -> None:
    for pid, rank in ranks or RANKS[via]:
        x = np.random.default_rng(100 * rank + step).normal(rank, 1.0, 50)
        values = {ADV: Summary.of_samples(x.tolist()), LOSS: float(rank + step)}
        t.send(via, metrics(pid, step, values))


def beat(t: Tiers, seconds: float, pids=(1, 2, 3, 4)) -> None:
    """``seconds`` pass, every rank of ``pids`` heartbeating (to its relay, frozen or not)."""
    for _ in range(round(seconds / HEARTBEAT_S)):
        for via, ranks in RANKS.items():
            t.send(via, *(P.Heartbeat(pid, 0, {}) for pid, _ in ranks if pid in pids))
        t.tick(HEARTBEAT_S)


def finish(t: Tiers, step: int, pids=(1, 2, 3, 4)) -> None:
    for via, ranks in RANKS.items():
        t.send(via, *(P.Done(pid, 2, step) for pid, _ in ranks if pid in pids))


def row(t: Tiers, relay: int) -> dict[str, float]:
    t.root.relay_watch._next = 0.0  # read now, not at the next WATCH_S
    t.root.relay_watch.check(t.root.runs, t.clock[0])
    return dict(t.root.health.relays[(f"{relay:x}", "h")])


def test_the_bound_and_the_states() -> None:
    assert watch.dead_after(CollectorConfig(grace_s=60, liveness_s=10)) == 60
    assert watch.dead_after(CollectorConfig(grace_s=5, liveness_s=10)) == 10
    # A relay with nothing to forward speaks every HEARTBEAT_S: never silent between two.
    short = CollectorConfig(grace_s=1, liveness_s=1)
    assert watch.silent_after(short) == watch.dead_after(short) == 2 * HEARTBEAT_S
    states = [watch.state(s, LIVENESS_S, DEAD_S) for s in (0, 9.9, 10, DEAD_S - 0.1, DEAD_S)]
    assert states == [watch.SPEAKING, watch.SPEAKING, watch.SILENT, watch.SILENT, watch.DEAD]


def test_a_frozen_relay_is_waited_for_and_every_step_comes_complete(caplog) -> None:
    """Relay A frozen for twice ``liveness_s``: before, its ranks were presumed dead at
    ``liveness_s`` and steps 1 to 5 went out partial, then A's data for them was late."""
    caplog.set_level(logging.WARNING, "rlpulse.collector")
    t = two_relays()
    for via in RANKS:
        log_step(t, via, 0)
    finish(t, 0)
    t.relays["A"].freeze()
    for step in range(1, 6):  # the ranks run on: A's wait at A, B's reach the root
        for via in RANKS:
            log_step(t, via, step)
    beat(t, 2 * LIVENESS_S)
    assert [r.step for r in t.out] == [0] and t.root.health.partial_steps == 0
    assert t.root.health.relays_silent == 1 and t.root.health.relays_presumed_dead == 0
    silent, speaking = row(t, 0xA), row(t, 0xB)
    assert silent["silent_seconds"] >= 2 * LIVENESS_S - HEARTBEAT_S
    assert silent["waiting_steps"] == 4, "B forwarded steps 1 to 4 (its ranks are in step 5)"
    assert speaking["silent_seconds"] < HEARTBEAT_S and speaking["waiting_steps"] == 0
    assert "relay a (host h) silent" in caplog.text and ": presumed dead" not in caplog.text
    t.relays["A"].thaw()
    finish(t, 5)
    beat(t, HEARTBEAT_S)
    assert [r.step for r in t.out] == list(range(6))
    assert not any(r.partial for r in t.out) and t.root.health.late == 0
    t.same_as_reference()
    assert t.root.health.relays_silent == 0
    assert "relay a (host h) speaks again after" in caplog.text


def test_a_relay_silent_past_the_bound_is_presumed_dead_and_its_ranks_named(caplog) -> None:
    """Relay A never comes back. Its ranks are not gone at ``liveness_s`` but at ``DEAD_S``
    of silence, also for a step whose own grace is far from over."""
    caplog.set_level(logging.WARNING, "rlpulse.collector")
    t = two_relays()
    for via in RANKS:
        log_step(t, via, 0)
    finish(t, 0)
    t.relays["A"].freeze()
    log_step(t, "B", 1)
    beat(t, DEAD_S - 2 * HEARTBEAT_S, pids=(3, 4))
    log_step(t, "B", 2)  # a fresh step: its grace runs to DEAD_S - 4 + GRACE_S
    assert [r.step for r in t.out] == [0] and t.root.health.relays_silent == 1
    beat(t, 2 * HEARTBEAT_S, pids=(3, 4))
    assert [r.step for r in t.out] == [0, 1] and t.out[1].partial
    assert t.out[1].missing == ("actor_train/0", "actor_train/1")
    assert t.root.health.relays_presumed_dead == 1 and t.root.health.relays_silent == 0
    assert "relay a (host h) silent for" in caplog.text and ": presumed dead" in caplog.text
    assert "the 1 open steps that waited for them go out partial" in caplog.text
    finish(t, 2, pids=(3, 4))
    assert [r.step for r in t.out] == [0, 1, 2] and t.out[2].partial, "not waiting any more"
    assert t.out[2].ranks == 2


def test_ranks_dead_behind_a_frozen_relay_are_found_once_it_speaks_again() -> None:
    """Rank 1 dies while relay A is frozen; rank 0 runs on. A's verdict, by its own clock
    once it runs again, names rank 1 gone; the root then emits the steps partial naming it
    alone, exactly as one collector of every rank does."""
    t = two_relays(grace_s=100)  # the root waits long: what ends the wait is A's verdict
    for via in RANKS:
        log_step(t, via, 0)
    finish(t, 0)
    t.relays["A"].freeze()
    for step in (1, 2):
        log_step(t, "A", step, ranks=[(1, 0)])
        log_step(t, "B", step)
    finish(t, 2, pids=(1, 3, 4))
    beat(t, 2 * LIVENESS_S, pids=(1, 3, 4))
    t.relays["A"].thaw()
    beat(t, HEARTBEAT_S, pids=(1, 3, 4))
    assert [r.step for r in t.out] == [0], "A speaks again; it presumes no rank gone yet"
    beat(t, LIVENESS_S + HEARTBEAT_S, pids=(1, 3, 4))
    assert [(r.step, r.partial, r.missing) for r in t.out[1:]] == [
        (1, True, ("actor_train/1",)),
        (2, True, ("actor_train/1",)),
    ]
    assert [m.rank for m in t.relays["A"].members.values() if m.gone] == [1]
    t.same_as_reference()
    assert t.root.health.relays_silent == t.root.health.relays_presumed_dead == 0


def test_the_relay_ahead_of_a_frozen_one_is_held_back_at_the_window() -> None:
    """A window of 4 open steps and relay A frozen while B's ranks log 10 steps: B is held
    back at the window (before: steps went out partial once B had opened a fifth), and
    let go as A's data comes."""
    t = Tiers(gated=True, max_open_steps=4)
    for via, ranks in RANKS.items():
        t.send(via, *(hello(pid, rank=rank, ws=4) for pid, rank in ranks))
    for via in RANKS:
        log_step(t, via, 0)
    finish(t, 0)
    t.relays["A"].freeze()
    for step in range(1, 11):
        for via in RANKS:
            log_step(t, via, step)
    finish(t, 10)
    beat(t, HEARTBEAT_S)
    assert [r.step for r in t.out] == [0] and t.root.health.partial_steps == 0
    assert sorted(t.root.runs["r"].steps) == [1, 2, 3, 4], "the window, and no more"
    assert t.root.health.held_back == 1
    t.relays["A"].thaw()
    beat(t, 2 * HEARTBEAT_S)
    assert [r.step for r in t.out] == list(range(11))
    assert not any(r.partial for r in t.out) and t.root.health.late == 0
    t.same_as_reference()


def test_a_relay_that_owes_the_oldest_step_is_never_held() -> None:
    t = Tiers(gated=True, max_open_steps=2)
    for via, ranks in RANKS.items():
        t.send(via, *(hello(pid, rank=rank, ws=4) for pid, rank in ranks))
    for step in range(4):  # B runs ahead, A is slow (not frozen): A owes the oldest step
        log_step(t, "B", step)
    assert sorted(t.root.runs["r"].steps) == [0, 1]
    runs, membership = t.root.runs, t.root.membership
    assert not watch.has_room(membership, runs, 0xB, 2)
    assert watch.has_room(membership, runs, 0xA, 2)
    for step in range(4):
        log_step(t, "A", step)
    finish(t, 3)
    assert [r.step for r in t.out] == [0, 1, 2, 3] and not any(r.partial for r in t.out)
    t.same_as_reference()


def test_the_relays_rows_are_on_the_prometheus_page() -> None:
    health = Health()
    health.relays_silent = 1
    health.relays = {("a", "node-1"): {"silent_seconds": 12.5, "waiting_steps": 7}}
    sink = PrometheusSink(SinkContext(health=health.snapshot), port=0)
    got = scrape_registry(sink.registry)
    labels = frozenset({("relay", "a"), ("host", "node-1")})
    assert got[("rlpulse_collector_relay_silent_seconds", labels)] == 12.5
    assert got[("rlpulse_collector_relay_waiting_steps", labels)] == 7
    assert got[("rlpulse_collector_relays_silent", frozenset())] == 1
