"""``Samples`` values on the sender thread: rows reduced to a mergeable state.

``log()`` only keeps the :class:`~rlpulse.producer.values.Samples` object (a copy of the rows'
references); the encoder hands it here, on the sender thread, where its rows are checked,
bounded and reduced to the top, bottom and random ``k`` (``rlpulse.schemas.samples``), with
this rank's ``(role, rank)`` as every row's origin. Bad rows are dropped and counted
(``samples_dropped``), cut texts counted (``samples_cut``); a bad value as a whole (a ``k``
out of range, a key that is not a string) is counted ``invalid``. Nothing here raises. When
``close()`` is ending, a value not reduced by the sender's ``cutoff`` is given up
(:data:`GAVE_UP`), counted by the encoder (``dropped_unreduced``).

>>> from rlpulse.producer.stats import Counters
>>> reducer = SampleReducer(("actor", 0), SampleLimits(k=2), Counters())
>>> state = reducer.reduce(Samples([{"r": 1.0}, {"r": "x"}], key="r"))
>>> state.rows, reducer.counters.samples_dropped
(1, 1)
"""

from __future__ import annotations

import math
import time
from dataclasses import replace

from rlpulse.producer.stats import Counters
from rlpulse.producer.values import Samples
from rlpulse.schemas.samples import SampleLimits, SampleState, reduce_rows

SLICE = 1024
"""Rows reduced between two looks at the ``cutoff`` (about 10 ms of rows of long texts)."""
GAVE_UP = object()
"""What :meth:`SampleReducer.reduce` returns for a value it stopped reducing at its
``cutoff`` (``close()`` is ending): the value is lost, the caller counts it."""


class SampleReducer:
    """Reduces ``Samples`` values of one rank; ``counters`` are the sender thread's."""

    def __init__(
        self, origin: tuple[str, int], limits: SampleLimits, counters: Counters | None = None
    ) -> None:
        self.origin = origin
        self.limits = limits
        self.counters = counters if counters is not None else Counters()
        self._by_k: dict[int, SampleLimits] = {limits.k: limits}
        self.cutoff = math.inf
        """``time.monotonic()`` past which values are no longer reduced (set by the sender
        when ``close()`` begins): :data:`GAVE_UP`."""

    def reduce(self, value: Samples) -> SampleState | object | None:
        """The state of ``value``'s rows; None (counted ``invalid``) for a value that cannot
        be reduced at all; :data:`GAVE_UP` past the ``cutoff`` (looked at every :data:`SLICE`
        rows: the states of slices merge exactly into the whole's)."""
        limits = self._limits(value.k)
        if limits is None or type(value.key) is not str or not value.key:
            self.counters.invalid += 1
            return None
        rows, key, origin = value.rows, value.key, self.origin
        state = None
        try:
            for start in range(0, max(len(rows), 1), SLICE):
                if self.cutoff < math.inf and time.monotonic() > self.cutoff:
                    return GAVE_UP
                part = reduce_rows(rows[start : start + SLICE], key, origin=origin, limits=limits)
                state = part if state is None else state.merge(part)
        except Exception:  # a mapping that raises when read: the value is lost, counted
            self.counters.invalid += 1
            return None
        assert state is not None
        self.counters.samples_dropped += state.dropped
        self.counters.samples_cut += state.cut
        return state

    def _limits(self, k: object) -> SampleLimits | None:
        if k is None:
            return self.limits
        if type(k) is not int or not 1 <= k <= 1024:
            return None
        limits = self._by_k.get(k)
        if limits is None:
            limits = self._by_k[k] = replace(self.limits, k=k)
        return limits
