"""Values waiting for the sender thread, bounded in bytes; and the steps that lost some.

``log()`` hands ``Samples`` values to the sender thread as they are (their rows are reduced
there: ``rlpulse.producer.samples``), so until then the producer holds the rows. A sender
that falls behind (rows logged faster than it reduces them) would hold them without bound:
``log()`` therefore counts each value's bytes (:func:`samples_bytes`, an estimate cheap
enough for the training thread) against ``ProducerConfig.pending_limit_bytes``, released by
the sender once it has reduced the value. A value that would go past the bound is dropped
and counted (``stats()["dropped_unreduced"]``); the rest of its call still goes. Host arrays
and GPU values have their own bound (``snapshot_limit_bytes``, past which ``log()`` reduces
them at once), numbers are a few bytes each (``max_pending`` calls bound them). The bound
also bounds the delay: a step's numbers wait behind at most that many bytes of rows queued
before them (about 0.2 s per 160 MB of rows, measured in ``tests/integration/behind.py``).

A step that lost values this way, or because ``close()`` could not reduce them in time, goes
to the collector as *incomplete* (:class:`IncompleteSteps`, the wire's ``incomplete``
element): it emits that step partial, naming this rank. The producer names those steps in a
warning when it closes.

>>> from rlpulse.producer.values import Samples
>>> samples_bytes(Samples([{"text": "x" * 1000, "reward": 1.0}] * 100, key="reward")) > 100_000
True
"""

from __future__ import annotations

import sys
from collections.abc import Mapping

from rlpulse.producer.values import Samples
from rlpulse.schemas.messages import DEFAULT_LIMITS

SAMPLED_ROWS = 8
"""Rows of a ``Samples`` value :func:`samples_bytes` measures (spread evenly over it)."""
_size = sys.getsizeof


def samples_bytes(value: Samples) -> int:
    """The memory ``value``'s rows hold, estimated from :data:`SAMPLED_ROWS` of them spread
    evenly over it (the row mapping and each field value, by ``sys.getsizeof``: a text's
    exact size, whatever its characters), times the rows, plus the tuple of them. A few µs
    whatever the rows: walking 20,000 rows of long texts in ``log()`` would cost the
    training thread milliseconds. An estimate, not a bound: rows of very uneven sizes are
    measured within the spread of the ones sampled."""
    rows = value.rows
    n = len(rows)
    total = _size(rows)
    if not n:
        return total
    picked = rows if n <= SAMPLED_ROWS else rows[:: n // SAMPLED_ROWS][:SAMPLED_ROWS]
    sampled = 0
    for row in picked:
        sampled += _size(row)
        if type(row) is dict:
            for v in row.values():
                sampled += _size(v)
    return total + sampled * n // len(picked)


SHOWN_RANGES = 20
"""Ranges of steps the closing warning names; the rest are counted."""
MAX_INCOMPLETE = DEFAULT_LIMITS.max_entries
"""Incomplete steps one message tells at most (the collector's bound); the rest ride in the
next ones."""
CAUSES = ("dropped_unreduced", "dropped_send", "dropped_oversized", "errors")
"""The counters of values or calls lost on the producer's side that make steps incomplete."""


class IncompleteSteps:
    """Steps this producer sent, or could not send, without some of their values: each
    goes to the collector once, in the next data message (:meth:`take`), and all of them
    are named in the warning at ``close()`` (:meth:`describe`, as ranges). Written by the
    sender thread only.

    >>> steps = IncompleteSteps()
    >>> for s in (3, 4, 5, 9):
    ...     steps.add(s)
    >>> steps.take(10), steps.take(10), steps.describe()
    ([3, 4, 5, 9], [], '3-5, 9')
    """

    def __init__(self) -> None:
        self._untold: list[int] = []
        self._ranges: list[list[int]] = []
        """Every step noted, as ``[first, last]`` ranges, in the order noted."""
        self.count = 0

    def add(self, step: int) -> None:
        """Note ``step`` (once: a step noted twice in a row is one)."""
        ranges = self._ranges
        if ranges and ranges[-1][0] <= step <= ranges[-1][1]:
            return
        self.count += 1
        self._untold.append(step)
        if ranges and step == ranges[-1][1] + 1:
            ranges[-1][1] = step
        else:
            ranges.append([step, step])

    def take(self, limit: int) -> list[int]:
        """Up to ``limit`` steps not told to the collector yet, now told."""
        told, self._untold = self._untold[:limit], self._untold[limit:]
        return told

    @property
    def untold(self) -> int:
        return len(self._untold)

    def describe(self) -> str:
        """The steps noted, as ranges (``25-39, 41``), the first :data:`SHOWN_RANGES` of them."""
        shown = [f"{a}-{b}" if b > a else f"{a}" for a, b in self._ranges[:SHOWN_RANGES]]
        more = len(self._ranges) - SHOWN_RANGES
        return ", ".join(shown) + (f" and {more} more ranges" if more > 0 else "")

    def verdict(self, stats: Mapping[str, int]) -> str:
        """What the warning at ``close()`` says: the steps, and the counters that lost them."""
        how = ", ".join(f"{k} {stats[k]}" for k in CAUSES if stats.get(k))
        return (
            f"{self.count} steps went to the collector without some of their values ({how}; "
            f"see stats()): steps {self.describe()}. The collector emits them partial, naming "
            "this rank"
        )
