"""When each producer is owed an acknowledgement: at once (a hello, a goodbye, a delta, a
rejected message, a heartbeat that asks), or within ``ack_delay_s`` of data (one ack per
producer per interval however many messages it sent).

>>> t = [0.0]
>>> owed = AckTimes(lambda: t[0], delay_s=0.5)
>>> owed.later(7); owed.now(8); owed.due()
[8]
>>> t[0] = 1.0; owed.due()
[7]
"""

from __future__ import annotations

import math
from collections.abc import Callable


class AckTimes:
    """The producers owed an acknowledgement, and by when. Dues are kept in time order (one
    delay after a clock that does not go back), so :meth:`due` reads only the ones due, not
    every producer (a pass over all of them each time was O(ranks) per wake-up)."""

    def __init__(self, clock: Callable[[], float], delay_s: float) -> None:
        self.clock = clock
        self.delay_s = delay_s
        self._now: set[int] = set()
        """Producers owed an acknowledgement at the next :meth:`due`."""
        self._later: dict[int, float] = {}
        """Producers owed one by a time, in the order of those times."""
        self._last_due = -math.inf

    def now(self, pid: int) -> None:
        """Producer ``pid`` is owed an acknowledgement at once."""
        self._now.add(pid)
        self._later.pop(pid, None)

    def later(self, pid: int) -> None:
        """Producer ``pid`` is owed an acknowledgement within ``delay_s``, unless one is owed
        already (as early or earlier)."""
        if pid in self._later or pid in self._now:
            return
        # Never before the last due: the dues stay in order even if the clock went back.
        due = self._last_due = max(self.clock() + self.delay_s, self._last_due)
        self._later[pid] = due

    def forget(self, pid: int) -> None:
        """Producer ``pid`` is owed nothing any more (forgotten)."""
        self._now.discard(pid)
        self._later.pop(pid, None)

    def due(self, everything: bool = False) -> list[int]:
        """The producers owed an acknowledgement now (every one owed any with
        ``everything``), no longer owed it afterwards."""
        due, later = list(self._now), self._later
        self._now.clear()
        if everything:
            due += later
            later.clear()
            return due
        now, ready = self.clock(), []
        for pid, t in later.items():  # in time order: stop at the first not due
            if t > now:
                break
            ready.append(pid)
        for pid in ready:
            del later[pid]
        return due + ready
