"""Producers' clocks, bounded by the collector's.

A step's time is the latest ``log()`` time of any rank, read off the producers' clocks. With a
``wall_clock`` (the daemon's), a time later than the collector's own when the message is
handled is bounded to it: the collector can vouch that the call happened before it received
it, not that a rank's clock is right. One rank's clock an hour ahead would otherwise put every
record an hour in the future and break ``system/tps`` (``CLOCK_SKEW_S``).

>>> clock = ClockBound(lambda: 100.0, Health())
>>> prod = ProducerInfo(1, "r", "actor_train", 0, 1, "host", 0.0)
>>> clock.entries(prod, [(3, 150.0, 0, b"", {})], replay=False)[0][1]
100.0
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from rlpulse.collector.health import Health
from rlpulse.collector.runs.members import ProducerInfo

log = logging.getLogger("rlpulse.collector")
CLOCK_SKEW_S = 2.0
"""A ``log()`` time this much ahead of the collector's clock at receipt is counted
(``Health.clock_skew``) and its rank named once in the log; any time ahead is bounded to the
receive time (less than this is ordinary clock drift between hosts)."""


class ClockBound:
    """Bounds ``log()`` times by ``wall_clock`` (``time.time``), counting and naming (once)
    the producers and relays whose clock runs ahead."""

    def __init__(self, wall_clock: Callable[[], float], health: Health) -> None:
        self.now = wall_clock
        self.health = health
        self._skewed: set[int] = set()
        """Producers (and relays) already named in a clock-skew warning."""

    def entries(self, prod: ProducerInfo, entries: list, replay: bool) -> list:
        """``entries`` with every ``log()`` time later than the collector's clock now bounded
        to it; more than ``CLOCK_SKEW_S`` ahead is counted, and the producer named once."""
        bound = self.now()
        if all(e[1] <= bound for e in entries):
            return entries  # the common case: no copy
        ahead = max(e[1] for e in entries) - bound
        if ahead > CLOCK_SKEW_S and not replay:
            self.health.clock_skew += sum(1 for e in entries if e[1] - bound > CLOCK_SKEW_S)
            who = f"{prod.role}/{prod.rank} of run {prod.run!r} (host {prod.host})"
            self.warn(prod.pid, who, ahead)
        return [(e[0], min(e[1], bound), *e[2:]) for e in entries]

    def forget(self, pids: list[int]) -> None:
        """Producers forgotten (their run ended long ago): named again if they come back."""
        self._skewed.difference_update(pids)

    def warn(self, pid: int, who: str, ahead: float) -> None:
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
