"""Relay semantics in process: two relays and a root, checked against one collector that sees
every rank. The records a relay emits go to the root as its upstream sink would send them."""

from __future__ import annotations

import numpy as np
import pytest

from rlpulse.collector.config import CollectorConfig
from rlpulse.collector.tiers.relay import HEARTBEAT_S
from rlpulse.collector.tiers.watch import dead_after
from rlpulse.schemas import Summary, metrics as M, protocol as P
from tests.collector.helpers import TIMING, hello, metrics
from tests.collector.tiers import Tiers

ADV, LOSS = M.CRITIC_ADVANTAGES.name, M.ACTOR_PG_LOSS.name


def samples(rank: int, step: int) -> np.ndarray:
    rng = np.random.default_rng(100 * rank + step)
    return rng.normal(rank, 1.0, int(rng.integers(1, 500)))


def log_step(t: Tiers, via: str, pid: int, rank: int, step: int) -> None:
    x = samples(rank, step)
    t.send(via, metrics(pid, step, {ADV: Summary.of_samples(x.tolist()), LOSS: float(rank + step)}))


def test_each_tier_waits_for_its_own_ranks_only() -> None:
    t = Tiers()
    t.send("A", hello(1, rank=0, ws=4), hello(2, rank=1, ws=4))
    t.send("B", hello(3, rank=2, ws=4), hello(4, rank=3, ws=4))
    for pid, rank, via in ((1, 0, "A"), (2, 1, "A")):
        log_step(t, via, pid, rank, 0)
        t.send(via, P.Done(pid, 2, 0))
    deltas = [r for r in t.relays["A"].sent if r.kind == "delta" and r.step == 0]
    assert len(deltas) == 1, "relay A forwards step 0 once its two ranks are in"
    assert not t.out, "the root still waits for relay B's ranks"
    for pid, rank in ((3, 2), (4, 3)):
        log_step(t, "B", pid, rank, 0)
        t.send("B", P.Done(pid, 2, 0))
    assert [r.step for r in t.out] == [0]
    t.same_as_reference()
    x = np.concatenate([samples(r, 0) for r in range(4)])
    assert t.out[0].metrics[f"{ADV}/mean"] == pytest.approx(x.mean(), rel=1e-12)
    assert t.out[0].metrics[f"{ADV}/max"] == x.max()


def test_a_rank_that_registers_after_its_relay_forwarded_a_step_goes_in_a_second_delta() -> None:
    t = Tiers()
    t.send("A", hello(1, rank=0, ws=2))
    log_step(t, "A", 1, 0, 0)
    t.send("A", P.Done(1, 2, 0))
    first = [r for r in t.relays["A"].sent if r.kind == "delta" and r.step == 0]
    assert len(first) == 1, "relay A knows only rank 0 and forwards step 0 without waiting"
    assert not t.out, "the root waits for rank 1, which the world size says exists"
    t.send("B", hello(2, rank=1, ws=2))
    log_step(t, "B", 2, 1, 0)
    t.send("B", P.Done(2, 2, 0))
    assert [r.step for r in t.out] == [0]
    t.same_as_reference()
    assert t.root.health.late == 0


def test_the_same_relay_forwards_a_late_registered_rank_as_another_delta_for_the_step() -> None:
    t = Tiers()
    t.send("A", hello(1, rank=0, ws=2))
    log_step(t, "A", 1, 0, 0)
    t.send("A", P.Done(1, 2, 0))
    t.send("A", hello(2, rank=1, ws=2))
    log_step(t, "A", 2, 1, 0)
    t.send("A", P.Done(2, 2, 0))
    deltas = [r for r in t.relays["A"].sent if r.kind == "delta" and r.step == 0]
    assert len(deltas) == 2, "step 0 reopened at the relay for rank 1, never dropped as late"
    assert t.relays["A"].agg.health.late == 0
    assert [r.step for r in t.out] == [0]
    t.same_as_reference()


def test_a_rank_gone_behind_a_relay_is_not_waited_for_at_the_root() -> None:
    t = Tiers()
    t.send("A", hello(1, rank=0, ws=2), hello(2, rank=1, ws=2))
    log_step(t, "A", 1, 0, 0)
    t.send("A", P.Done(1, 2, 0))
    for _ in range(int(TIMING["liveness_s"] / HEARTBEAT_S) + 2):  # rank 1 falls silent
        t.send("A", P.Heartbeat(1, 0, {}))
        t.tick(HEARTBEAT_S)
    assert [r.step for r in t.out] == [0]
    assert t.out[0].partial and t.out[0].missing == ("actor_train/1",)
    t.same_as_reference()
    gone = [m for m in t.relays["A"].members.values() if m.gone]
    assert [m.rank for m in gone] == [1], "the relay announced its verdict"


def test_a_silent_relay_keeps_its_ranks_alive_at_the_root_with_heartbeats() -> None:
    t = Tiers()
    t.send("A", hello(1, rank=0, ws=2))
    t.send("B", hello(2, rank=1, ws=2))
    log_step(t, "A", 1, 0, 0)
    log_step(t, "B", 2, 1, 0)
    for _ in range(3 * int(TIMING["liveness_s"] / HEARTBEAT_S)):  # a long step 1
        t.send("A", P.Heartbeat(1, 0, {}))
        t.send("B", P.Heartbeat(2, 0, {}))
        t.tick(HEARTBEAT_S)
    assert not t.out, "step 0 is open at both relays; the root waits and presumes no one gone"
    assert any(r.kind == "heartbeat" for r in t.relays["A"].sent)
    t.send("A", P.Done(1, 2, 0))
    t.send("B", P.Done(2, 2, 0))
    assert [r.step for r in t.out] == [0] and not t.out[0].partial
    t.same_as_reference()


def test_a_relay_does_not_take_another_relay() -> None:
    t = Tiers()
    t.relays["A"].agg.handle(P.RelayHello(0xC, 1, "h", 1), 0.0)
    assert t.relays["A"].agg.health.malformed["relay_of_relay"] == 1


def test_endpoints_behind_a_relay_are_listed_at_the_root_until_gone() -> None:
    t = Tiers()
    rank_url, engine_url = "http://10.0.0.7:9100/metrics", "http://10.0.0.7:8000/metrics"
    engine = P.Hello(9, 1, "r", "rollout", 0, 1, "node-7", 1, metrics_url=engine_url, logs=False)
    t.send("A", P.Hello(1, 1, "r", "actor_train", 0, 1, "node-7", 1, metrics_url=rank_url), engine)

    def listed() -> list[tuple[str, str, int]]:
        return sorted((s.url, s.role, s.rank) for s in t.root.membership.scrape_targets(t.clock[0]))

    assert listed() == [(engine_url, "rollout", 0), (rank_url, "actor_train", 0)]
    assert t.root.membership.endpoints[9].via == 0xA
    log_step(t, "A", 1, 0, 0)
    t.send("A", P.Done(1, 2, 0))
    assert [r.step for r in t.out] == [0] and not t.out[0].partial, "never waits for the engine"
    t.send("A", P.Bye(9, 2, {}))
    assert listed() == [(rank_url, "actor_train", 0)], "the engine's goodbye reached the root"
    # Relay A silent past liveness_s says nothing of its ranks; presumed dead, all are gone.
    assert listed_at(t, t.clock[0] + TIMING["liveness_s"]) == [(rank_url, "actor_train", 0)]
    dead = t.clock[0] + dead_after(CollectorConfig(**TIMING))  # type: ignore[arg-type]
    assert t.root.membership.scrape_targets(dead) == []


def listed_at(t: Tiers, now: float) -> list[tuple[str, str, int]]:
    return sorted((s.url, s.role, s.rank) for s in t.root.membership.scrape_targets(now))


def test_a_rank_restarted_behind_another_relay_never_makes_a_step_complete_without_it() -> None:
    """Rank 0 (behind relay A) finishes steps 0 and 1 and dies; relay A holds them, waiting
    for rank 1, which died in step 0. Both come back behind relay B: rank 1 logs step 0
    again, rank 0 goes on from step 2. The root never got rank 0's steps 0 and 1 (they
    still wait at relay A) and its new process never ran them, yet its cumulative ``done``
    (and the watermarks relay B reports, which data for step 2 implies) said they were
    finished: steps 0 and 1 went out complete with rank 1's data only. They must go out
    partial, naming rank 0; relay A's copy, when it comes, is late (counted)."""
    t = Tiers()
    t.send("A", hello(1, rank=0, ws=2), hello(2, rank=1, ws=2))
    t.send("A", metrics(1, 0, {LOSS: 1.0}), metrics(2, 0, {LOSS: 50.0}))  # rank 1 dies here
    t.send("A", P.Done(1, 2, 0), metrics(1, 1, {LOSS: 1.0}), P.Done(1, 3, 1))  # rank 0 too
    t.send("B", hello(4, rank=1, ws=2), hello(3, rank=0, ws=2))
    t.send("B", metrics(3, 2, {LOSS: 7.0}), P.Done(3, 2, 2))
    for step in range(3):
        t.send("B", metrics(4, step, {LOSS: 3.0}), P.Done(4, 2 + step, step))
    for _ in range(int((TIMING["liveness_s"] + TIMING["grace_s"]) / HEARTBEAT_S) + 2):
        t.tick(HEARTBEAT_S)  # relay A gives up on rank 1 and forwards what it holds
    assert [(r.step, r.partial, r.missing) for r in t.out] == [
        (0, True, ("actor_train/0",)),
        (1, True, ("actor_train/0",)),
        (2, False, ()),
    ]
    assert [r.metrics[LOSS] for r in t.out] == [3.0, 3.0, 5.0]
    assert t.root.health.late > 0


def test_a_step_a_relay_never_forwarded_is_opened_for_a_rank_that_brings_it_later() -> None:
    """Relay B's first rank has no data before step 2, so B forwards step 2 first; a rank
    that registers at B later with data for steps 0 and 1 must have them forwarded as new
    steps. They were counted late at the relay (never forwarded, below the last one), and
    the root never saw steps 0 and 1."""
    t = Tiers()
    t.send("B", hello(1, rank=0, ws=2), metrics(1, 2, {LOSS: 1.0}), P.Done(1, 2, 2))
    assert [r.step for r in t.relays["B"].sent if r.kind == "delta"] == [2]
    t.send("B", hello(2, rank=1, ws=2))
    for step in range(3):
        t.send("B", metrics(2, step, {LOSS: 3.0}), P.Done(2, 2 + step, step))
    assert [(r.step, r.partial, r.metrics[LOSS]) for r in t.out] == [
        (0, False, 3.0),
        (1, False, 3.0),
        (2, False, 2.0),
    ]
    assert t.relays["B"].agg.health.late == 0 and t.root.health.late == 0
    t.same_as_reference()
