"""Values waiting for the sender thread, bounded in bytes; and the steps that lost some.

``log()`` hands ``Samples`` values to the sender thread as they are (their rows are reduced
there: ``rlpulse.producer.samples``), so until then the producer holds the rows. A sender
that falls behind (rows logged faster than it reduces them) would hold them without bound:
``log()`` therefore counts each value's bytes (:class:`RowBytes`, an estimate cheap enough
for the training thread) against ``ProducerConfig.pending_limit_bytes``, released by the
sender once it has reduced the value. A value that would go past the bound is dropped
and counted (``stats()["dropped_unreduced"]``); the rest of its call still goes. Host arrays
and GPU values have their own bound (``snapshot_limit_bytes``, past which ``log()`` reduces
them at once), numbers are a few bytes each (``max_pending`` calls bound them). The bound
also bounds the delay: a step's numbers wait behind at most that many bytes of rows queued
before them (the issue's 20,000 rows of 8 KB texts, 160 MB, take the sender about 0.2 s).

A step that lost values this way, or because ``close()`` could not reduce them in time, goes
to the collector as *incomplete* (:class:`IncompleteSteps`, the wire's ``incomplete``
element): it emits that step partial, naming this rank. The producer names those steps in a
warning when it closes.

"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

from rlpulse.producer.config import MIB
from rlpulse.producer.values import Samples
from rlpulse.schemas.messages import DEFAULT_LIMITS

ROW_BYTES = 72
"""What a row holds besides its fields: the dict and its reference in the value's tuple."""
FIELD_BYTES = 64
"""What a field holds besides its text: the dict's slot and the value object."""
MEASURED_ROWS = 32
"""Rows of a value the sender measures (spread evenly over it) to learn its name's size."""


def row_bytes(row: Any) -> int:
    """What one row holds, from its fields and the lengths of its texts (a byte a character;
    4 for a text that is not ASCII, the most CPython stores a character in): O(fields)."""
    if type(row) is not dict:
        return ROW_BYTES
    total = ROW_BYTES + FIELD_BYTES * len(row)
    for v in row.values():
        if type(v) is str:
            total += len(v) if v.isascii() else 4 * len(v)
    return total


class Measure(NamedTuple):
    """What the sender measured of a name's rows: the mean row (:func:`row_bytes`), and the
    field of its longest texts with their mean length (None without texts)."""

    row: float
    field: str | None
    text: float


class RowBytes:
    """The bytes of ``Samples`` rows ``log()`` charges against ``pending_limit_bytes``.

    ``log()`` cannot measure a value's rows (20,000 rows of 8 KB texts: milliseconds of the
    training thread; even one row's fields, their memory cold, cost it some µs), so it
    estimates: the value's rows times the mean row of the latest value of the same name the
    sender thread reduced (:meth:`learn`: :data:`MEASURED_ROWS` rows spread over it,
    measured on the sender), a dict look-up. While the sender is behind (rows it has not
    reduced yet: when the bound can be reached), it also reads the first row's text in the
    field of the name's longest texts (a response), and charges its growth over that field's
    mean: rows that grow show at once. The first value of a name, or of one whose rows had no
    text, is charged by its first row whole (:func:`row_bytes`). ``measured`` is written by
    the sender only.

    >>> sizes = RowBytes()
    >>> value = Samples([{"text": "x" * 1000, "reward": 1.0}] * 100, key="reward")
    >>> sizes.estimate("rollout/samples", value, behind=False)
    120000
    """

    def __init__(self) -> None:
        self.measured: dict[str, Measure] = {}

    def estimate(self, name: str, value: Samples, behind: bool) -> int:
        """What ``value`` (logged as ``name``) is taken to hold; in ``log()``."""
        rows = value.rows
        if not rows:
            return 0
        known = self.measured.get(name)
        if known is None:
            return len(rows) * row_bytes(rows[0])
        per = known.row
        if behind:
            first = rows[0]
            if known.field is None:
                per = max(per, row_bytes(first))
            elif type(first) is dict:
                text = first.get(known.field)
                if type(text) is str and len(text) > known.text:
                    per += len(text) - known.text
        return int(len(rows) * per)

    def learn(self, payload: Mapping[Any, Any]) -> None:
        """Measure the ``Samples`` values of a call the sender is about to reduce (one pass
        over :data:`MEASURED_ROWS` rows: a few % of reducing them)."""
        for name, value in payload.items():
            if type(value) is not Samples or not value.rows:
                continue
            rows = value.rows
            picked = rows[:: max(1, len(rows) // MEASURED_ROWS)]
            total = ROW_BYTES * len(picked)
            texts: dict[str, int] = {}
            for row in picked:
                if type(row) is dict:
                    total += FIELD_BYTES * len(row)
                    for field, v in row.items():
                        if type(v) is str:
                            size = len(v) if v.isascii() else 4 * len(v)
                            total += size
                            texts[field] = texts.get(field, 0) + size
            longest = max(texts, key=texts.__getitem__) if texts else None
            mean_text = texts[longest] / len(picked) if longest is not None else 0.0
            self.measured[name] = Measure(total / len(picked), longest, mean_text)


def over_bound(name: str, step: int, size: int, held: int, limit: int) -> str:
    """The warning of a value dropped in ``log()``: ``size`` bytes of rows, with the ``held``
    bytes not reduced yet, past ``limit``."""
    return (
        f"{name} at step {step} dropped: its rows (about {size / MIB:.1f} MiB) and the "
        f"{held / MIB:.1f} MiB of rows the sender thread has not reduced yet are more than "
        f"pending_limit_bytes ({limit / MIB:.0f} MiB). Counted in stats() as "
        "dropped_unreduced; such steps reach the collector partial, naming this rank"
    )


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
    are named in the warning at ``close()`` (:meth:`describe`, as ranges: the first
    :data:`SHOWN_RANGES` kept, the others counted, so a long run keeps a few numbers).
    Written by the sender thread only.

    >>> steps = IncompleteSteps()
    >>> for s in (3, 4, 5, 9):
    ...     steps.add(s)
    >>> steps.take(10), steps.take(10), steps.describe()
    ([3, 4, 5, 9], [], '3-5, 9')
    """

    def __init__(self) -> None:
        self._untold: list[int] = []
        self._ranges: list[list[int]] = []
        """The first ranges of steps noted, ``[first, last]``, in the order noted."""
        self._last = [-1, -2]
        """The range the latest step is in (one of ``_ranges``, or past them)."""
        self._more = 0
        """Ranges past the first :data:`SHOWN_RANGES`."""
        self.count = 0

    def add(self, step: int) -> None:
        """Note ``step`` (once: a step noted twice in a row is one)."""
        last = self._last
        if last[0] <= step <= last[1]:
            return
        self.count += 1
        self._untold.append(step)
        if step == last[1] + 1:
            last[1] = step
        elif len(self._ranges) < SHOWN_RANGES:
            self._last = [step, step]
            self._ranges.append(self._last)
        else:
            self._last = [step, step]
            self._more += 1

    def take(self, limit: int) -> list[int]:
        """Up to ``limit`` steps not told to the collector yet, now told."""
        told, self._untold = self._untold[:limit], self._untold[limit:]
        return told

    @property
    def untold(self) -> int:
        return len(self._untold)

    def describe(self) -> str:
        """The steps noted, as ranges (``25-39, 41``), the first :data:`SHOWN_RANGES` of them."""
        shown = [f"{a}-{b}" if b > a else f"{a}" for a, b in self._ranges]
        return ", ".join(shown) + (f" and {self._more} more ranges" if self._more else "")

    def verdict(self, stats: Mapping[str, int]) -> str:
        """What the warning at ``close()`` says: the steps, and the counters that lost them."""
        how = ", ".join(f"{k} {stats[k]}" for k in CAUSES if stats.get(k))
        return (
            f"{self.count} steps went to the collector without some of their values ({how}; "
            f"see stats()): steps {self.describe()}. The collector emits them partial, naming "
            "this rank"
        )
