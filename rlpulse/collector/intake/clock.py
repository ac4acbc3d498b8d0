"""Producers' clocks: each one's offset from the collector's, measured, and times placed on
the collector's timeline, then bounded by it.

**Offsets.** A producer stamps its hellos and heartbeats with its wall clock when it sends
them (``sent``: the clock its ``log()`` times are read from; a relay stamps its own, to the
collector above it). For each stamped message the collector takes ``received - sent`` on its
own wall clock: the producer's offset plus the message's one-way delay, which is never
negative. The offset is the smallest such value over the producer's last
:data:`OFFSET_SAMPLES` stamps (about half a minute of heartbeats): the message that waited
least. It errs by that message's delay (under a millisecond on a LAN, a few on a loaded
host), late, never early; a clock that jumps ahead is followed at once, one that jumps back
once the older stamps have aged out. An offset smaller than :data:`APPLY_OFFSET_S` is within
that error and is not applied (nor does it cost a copy of each message's entries). A replayed
hello (recovery) is no measurement: offsets are kept in the checkpoint instead.

Every ``log()`` time of a producer is moved by its offset onto the collector's timeline, where
a step's spans, its first and last times and its record's time are then compared. A relay's
producers' times are moved by the relay (onto its timeline), and the relay's by the root.

**Bound.** A time still later than the collector's clock when the message is handled is
bounded to it: the collector can vouch that the call happened before it received it. A time
more than ``CLOCK_SKEW_S`` ahead (a clock that jumped since its last stamp) is counted
(``Health.clock_skew``) and its rank named once in the log.

>>> clock = ClockBound(lambda: 100.0, Health())
>>> prod = ProducerInfo(1, "r", "actor_train", 0, 1, "host", 0.0)
>>> clock.entries(prod, [(3, 150.0, 0, b"", {})], replay=False)[0][1]
100.0
>>> clock.sample(prod, sent=98.5); clock.offsets[1]   # its clock is 1.5 s behind
1.5
>>> clock.entries(prod, [(3, 97.0, 0, b"", {})], replay=False)[0][1]
98.5
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Mapping

from rlpulse.collector.health import Health
from rlpulse.collector.runs.members import ProducerInfo

log = logging.getLogger("rlpulse.collector")
CLOCK_SKEW_S = 2.0
"""A ``log()`` time this much ahead of the collector's clock at receipt, after its producer's
offset, is counted (``Health.clock_skew``) and its rank named once in the log; any time ahead
is bounded to the receive time."""
OFFSET_SAMPLES = 32
"""Stamped messages (hellos, heartbeats: about one a second) an offset is the least over."""
APPLY_OFFSET_S = 0.005
"""Offsets smaller than this are not applied: within the measurement's own error (the least
one-way delay), and a producer on a well-synchronised host costs nothing per message."""
NOTE_OFFSET_S = 0.1
"""An offset this large is logged once per producer (its times are moved by it)."""


class ClockBound:
    """Measures each producer's clock offset (:meth:`sample`), moves its ``log()`` times by it
    and bounds them by ``wall_clock`` (``time.time``), counting and naming (once) the producers
    and relays whose clock runs ahead all the same."""

    def __init__(self, wall_clock: Callable[[], float], health: Health) -> None:
        self.now = wall_clock
        self.health = health
        self.offsets: dict[int, float] = {}
        """Per producer (or relay) whose offset is at least ``APPLY_OFFSET_S``: the seconds to
        add to its clock's times to place them on this collector's timeline."""
        self._samples: dict[int, deque[float]] = {}
        self._skewed: set[int] = set()
        """Producers (and relays) already named in a clock-skew warning."""
        self._noted: set[int] = set()
        """Producers whose offset was logged."""

    def sample(self, prod: ProducerInfo, sent: float) -> None:
        """A message ``prod`` (a producer, or a relay) stamped ``sent`` on its clock arrives
        now (0: not stamped, by a producer that predates stamps: its times stay as given)."""
        if not sent:
            return
        pid = prod.pid
        samples = self._samples.get(pid)
        if samples is None:
            samples = self._samples[pid] = deque(maxlen=OFFSET_SAMPLES)
        samples.append(self.now() - sent)
        offset = min(samples)
        if abs(offset) < APPLY_OFFSET_S:
            self.offsets.pop(pid, None)
            return
        self.offsets[pid] = offset
        if abs(offset) >= NOTE_OFFSET_S and pid not in self._noted:
            self._noted.add(pid)
            log.info(
                "%s's clock is %.3fs %s this collector's: its times are placed on the "
                "collector's timeline (noted once)",
                describe(prod),
                abs(offset),
                "behind" if offset > 0 else "ahead of",
            )

    def moved(self, pid: int, t: float) -> float:
        """``t`` on producer ``pid``'s clock, on this collector's timeline."""
        return t + self.offsets.get(pid, 0.0)

    def entries(self, prod: ProducerInfo, entries: list, replay: bool) -> list:
        """``entries`` with every ``log()`` time moved by the producer's offset, and then
        bounded by the collector's clock now; more than ``CLOCK_SKEW_S`` ahead is counted,
        and the producer named once."""
        offset = self.offsets.get(prod.pid)
        if offset is not None:
            entries = [(e[0], e[1] + offset, *e[2:]) for e in entries]
        bound = self.now()
        if all(e[1] <= bound for e in entries):
            return entries  # the common case: no copy
        ahead = max(e[1] for e in entries) - bound
        if ahead > CLOCK_SKEW_S and not replay:
            self.health.clock_skew += sum(1 for e in entries if e[1] - bound > CLOCK_SKEW_S)
            self.warn(prod.pid, describe(prod), ahead)
        return [(e[0], min(e[1], bound), *e[2:]) for e in entries]

    def forget(self, pids: list[int]) -> None:
        """Producers forgotten (their run ended long ago): named again if they come back."""
        self._skewed.difference_update(pids)
        self._noted.difference_update(pids)
        for pid in pids:
            self.offsets.pop(pid, None)
            self._samples.pop(pid, None)

    def snapshot(self) -> list[list[int | float]]:
        """The offsets applied, for the checkpoint: a restart replays its log with them."""
        return [[pid, off] for pid, off in self.offsets.items()]

    def restore(self, data: list | Mapping) -> None:
        for pid, offset in data:
            self.offsets[int(pid)] = float(offset)
            self._samples[int(pid)] = deque([float(offset)], maxlen=OFFSET_SAMPLES)

    def warn(self, pid: int, who: str, ahead: float) -> None:
        """Name ``who`` (producer or relay ``pid``) once for a clock ``ahead`` seconds ahead."""
        if pid in self._skewed:
            return
        self._skewed.add(pid)
        log.warning(
            "%s logs times %.1fs ahead of this collector's clock: its clock is off; its times "
            "are bounded by when the collector received them (counted in "
            "rlpulse_collector_clock_skew_entries_total; warned once)",
            who,
            ahead,
        )


def describe(prod: ProducerInfo) -> str:
    """A producer (``actor_train/1 of run 'r' (host h)``) or a relay (``relay 1a2b (host h)``)
    as the log names it."""
    if prod.role == "relay" and not prod.run:
        return f"relay {prod.pid:x} (host {prod.host})"
    return f"{prod.role}/{prod.rank} of run {prod.run!r} (host {prod.host})"
