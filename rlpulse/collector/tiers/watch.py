"""The root's side of its relays' silence, and of a relay ahead of the others.

A relay speaks at least every ``HEARTBEAT_S`` (a delta, an announcement or a heartbeat). Its
silence says nothing about the ranks behind it: a relay stopped by SIGSTOP, a VM pause, a
swap storm or a network stall holds every message of its ranks, which go on logging, and
forwards it all once it runs again. So the root does not take a silent relay for dead ranks.
Silent for ``liveness_s`` (:func:`silent_after`), it is *silent*: the steps waiting for its
ranks wait as for slow ranks (each until ``grace_s`` after its first rank finished it), and
the other relays, once ``max_open_steps`` steps ahead, are held back as producers ahead of
the others are (:func:`admits`), so nothing goes out early for the window either. Silent
for :func:`dead_after` (the longer of ``grace_s`` and ``liveness_s``), it is *presumed dead*
(killed, its host down, cut off): its ranks are gone (``Membership.silent``), and the steps
waiting for them go out partial naming them, as for dead ranks, until it speaks again. A
relay that speaks again says which of its ranks are gone by its own liveness verdict, so
ranks that died behind a frozen relay are presumed dead then, ``liveness_s`` of the relay's
own clock (which leaves its freeze out) after it runs again.

:class:`RelayWatch` says which it is, in the log (a warning when a relay falls silent, is
presumed dead, and speaks again) and on /metrics: ``relays_silent``,
``relays_presumed_dead`` and, per relay with ranks still running behind it,
``relay_silent_seconds`` and ``relay_waiting_steps`` (the open steps waiting for its ranks).

>>> dead_after(CollectorConfig(grace_s=60, liveness_s=10))
60.0
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

from rlpulse.collector.config import CollectorConfig
from rlpulse.collector.health import Health
from rlpulse.collector.runs.members import ProducerInfo, Slot
from rlpulse.collector.runs.membership import Membership
from rlpulse.collector.tiers.relay import HEARTBEAT_S
from rlpulse.schemas import protocol

if TYPE_CHECKING:
    from rlpulse.collector.runs.run import Run

log = logging.getLogger("rlpulse.collector")
WATCH_S = 0.5
"""How often the watch reads its relays' silence (for the log and /metrics only: whether a
relay is presumed dead is decided where it matters, with the time of that moment)."""
SPEAKING, SILENT, DEAD = "speaking", "silent", "presumed dead"


def silent_after(config: CollectorConfig) -> float:
    """How long a relay below the root may say nothing before it is *silent*: a producer's
    ``liveness_s``, and never under two of its heartbeats (``HEARTBEAT_S`` apart), so a
    relay that merely has nothing to forward is never called silent."""
    return float(max(config.liveness_s, 2 * HEARTBEAT_S))


def dead_after(config: CollectorConfig) -> float:
    """How long a relay below the root may be silent before it is presumed dead and its
    ranks gone: as long as a slow rank's step is waited for (``grace_s``), never less than
    :func:`silent_after`."""
    return float(max(config.grace_s, silent_after(config)))


def state(silent_s: float, silent_after: float, dead_after: float) -> str:
    """A relay that said nothing for ``silent_s``: :data:`SPEAKING`, :data:`SILENT` or
    :data:`DEAD`.

    >>> [state(s, 10, 60) for s in (2, 10, 59.9, 60)]
    ['speaking', 'silent', 'silent', 'presumed dead']
    """
    if silent_s >= dead_after:
        return DEAD
    return SILENT if silent_s >= silent_after else SPEAKING


def _running(membership: Membership, prod: ProducerInfo) -> bool:
    return not prod.presumed_gone and not prod.finished and membership.holds_slot(prod)


def owes(membership: Membership, relay: int, run: Run, step: int) -> bool:
    """Whether a rank behind ``relay`` still running has not finished ``step`` of ``run``:
    the relay is not ahead of that step, and what it sends is what the step waits for."""
    producers = membership.producers
    for pid in run.members.slots.values():
        prod = producers.get(pid)
        if (
            prod is not None
            and prod.via == relay
            and prod.watermark < step
            and _running(membership, prod)
        ):
            return True
    return False


def admits(
    membership: Membership, runs: Mapping[str, Run], msg: protocol.Delta, window: int
) -> bool:
    """Whether a relay's delta may be applied now (``Aggregator.admits``): as a producer's
    data (``completion.admits``), always, unless it opens a step while its run holds
    ``window`` open steps and every rank behind the relay has finished the oldest of them
    (the relay is ahead: its ranks are not what the window waits for). The delta then waits
    at the relay, unacknowledged, until the run has room (:func:`has_room`). Without this, a
    relay ahead of a silent one forced the oldest steps out partial once the window filled."""
    relay = membership.relays.get(msg.producer)
    if relay is None:
        return True
    run = runs.get(relay.aliases.get(msg.run, msg.run))
    if run is None or len(run.steps) < window:
        return True
    steps, last = run.steps, run.last_emitted
    if not any(e[0] not in steps and e[0] > last for e in msg.entries):
        return True
    return owes(membership, relay.pid, run, min(steps))


def has_room(membership: Membership, runs: Mapping[str, Run], relay: int, window: int) -> bool:
    """A relay held back may go on (``Aggregator.has_room``): one of its runs has half its
    window free again, or waits for its ranks at its oldest open step. (``admits`` decides,
    delta by delta, what goes in.)"""
    info = membership.relays.get(relay)
    names = set(info.aliases.values()) if info is not None else set()
    if not names:
        return True
    for name in names:
        run = runs.get(name)
        if run is None or len(run.steps) <= window // 2:
            return True
        if owes(membership, relay, run, min(run.steps)):
            return True
    return False


class RelayWatch:
    """Says what each relay below the root is (speaking, silent, presumed dead), in the log
    and in ``health`` (see the module docstring); :meth:`check` at every poll of the root's
    aggregator, with its clock (which leaves out the root's own pauses).

    >>> membership = Membership(liveness_s=10, health=Health())
    >>> RelayWatch(membership, Health(), CollectorConfig()).check({}, 0.0)
    """

    def __init__(self, membership: Membership, health: Health, config: CollectorConfig) -> None:
        self.membership = membership
        self.health = health
        self.silent_s = silent_after(config)
        self.dead_s = dead_after(config)
        self._states: dict[int, str] = {}
        """Per relay with ranks running behind it, what it was at the last check."""
        self._quiet_from: dict[int, float] = {}
        """Per relay silent at the last check, when it last spoke before."""
        self._waited: dict[int, int] = {}
        """Per relay, the open steps waiting for its ranks at the last check (those that go
        out partial once it is presumed dead: gone by the time it is seen dead)."""
        self._next = 0.0

    def check(self, runs: Mapping[str, Run], now: float) -> None:
        """Every ``WATCH_S``: each relay's state, logged when it changes, and the counts."""
        if now < self._next or not self.membership.relays:
            return
        self._next = now + WATCH_S
        behind = self._behind(runs)
        rows: dict[tuple[str, str], dict[str, float]] = {}
        counts = {SILENT: 0, DEAD: 0}
        for relay in self.membership.relays.values():
            slots = behind.get(relay.pid)
            if not slots:  # nothing runs behind it (yet, or any more): nothing waits for it
                self._states.pop(relay.pid, None)
                self._quiet_from.pop(relay.pid, None)
                self._waited.pop(relay.pid, None)
                continue
            silent_s = max(0.0, now - relay.last_seen)
            current = state(silent_s, self.silent_s, self.dead_s)
            counts[current] = counts.get(current, 0) + 1
            waiting = _waiting(runs, slots)
            was = self._states.get(relay.pid, SPEAKING)
            waited = self._waited.get(relay.pid, waiting) if current == DEAD else waiting
            self._note(relay, was, current, silent_s, waited)
            self._states[relay.pid], self._waited[relay.pid] = current, waiting
            rows[(f"{relay.pid:x}", relay.host)] = {
                "silent_seconds": round(silent_s, 3),
                "waiting_steps": waiting,
            }
        self.health.relays_silent = counts[SILENT]
        self.health.relays_presumed_dead = counts[DEAD]
        self.health.relays = rows  # replaced whole: a scrape reads it from another thread

    def _behind(self, runs: Mapping[str, Run]) -> dict[int, dict[str, set[Slot]]]:
        """Per relay, per run, the slots still running behind it."""
        out: dict[int, dict[str, set[Slot]]] = {}
        producers = self.membership.producers
        for name, run in runs.items():
            for slot, pid in run.members.slots.items():
                prod = producers.get(pid)
                if prod is not None and prod.via is not None and _running(self.membership, prod):
                    out.setdefault(prod.via, {}).setdefault(name, set()).add(slot)
        return out

    def _note(
        self, relay: ProducerInfo, was: str, now_is: str, silent_s: float, waiting: int
    ) -> None:
        if was == now_is:
            return
        who = f"relay {relay.pid:x} (host {relay.host})"
        quiet_from = self._quiet_from.pop(relay.pid, relay.last_seen)
        if now_is != SPEAKING:
            self._quiet_from[relay.pid] = relay.last_seen
        if now_is == SILENT:
            log.warning(
                "%s silent for %.1fs: not taken for dead ranks (it may be stopped, paused or "
                "cut off while its ranks run on); %d open steps wait for its ranks as for slow "
                "ranks (grace_s), and it is presumed dead after %gs of silence "
                "(rlpulse_collector_relay_silent_seconds)",
                who,
                silent_s,
                waiting,
                self.dead_s,
            )
        elif now_is == DEAD:
            log.warning(
                "%s silent for %.1fs (the longer of grace_s and liveness_s): presumed dead; "
                "its ranks are presumed gone, and the %d open steps that waited for them go out "
                "partial naming them, until it speaks again "
                "(rlpulse_collector_relays_presumed_dead)",
                who,
                silent_s,
                waiting,
            )
        else:
            log.warning(
                "%s speaks again after %.1fs of silence%s; its ranks count as it announces them",
                who,
                relay.last_seen - quiet_from,
                ", presumed dead meanwhile" if was == DEAD else "",
            )


def _waiting(runs: Mapping[str, Run], slots: Mapping[str, Iterable[Slot]]) -> int:
    """Open steps that some of ``slots`` (per run) has not finished."""
    total = 0
    for name, mine in slots.items():
        run = runs.get(name)
        if run is None:
            continue
        for state_ in run.steps.values():
            done = state_.done
            if any(slot not in done for slot in mine):
                total += 1
    return total
