"""``Samples`` values on the sender thread: rows reduced to a mergeable state.

``log()`` only keeps the :class:`~rlpulse.producer.values.Samples` object (a copy of the rows'
references); the encoder hands it here, on the sender thread, where its rows are checked,
bounded and reduced to the top, bottom and random ``k`` (``rlpulse.schemas.samples``), with
this rank's ``(role, rank)`` as every row's origin. Bad rows are dropped and counted
(``samples_dropped``), cut texts counted (``samples_cut``); a bad value as a whole (a ``k``
out of range, a key that is not a string, rows that are no sequence of mappings) is counted
``invalid``. Each is warned about once per name, with the reason (the first bad row's, for
dropped rows). Nothing here raises. When ``close()`` is ending, a value not reduced by the
sender's ``cutoff`` is given up (:data:`GAVE_UP`), counted by the encoder
(``dropped_unreduced``).

A process that holds a whole batch whose rows are costly to make in full (texts decoded from
token ids) reduces it itself with :func:`reduce_then_fill`, which makes the costly fields of
the rows it keeps only, and logs the ``SampleState``: it is taken as it is (its rows given
this rank's origin, its drops and cuts counted).

>>> from rlpulse.producer.stats import Counters
>>> reducer = SampleReducer(("actor", 0), SampleLimits(k=2), Counters())
>>> state = reducer.reduce(Samples([{"r": 1.0}, {"r": "x"}], key="r"))
>>> state.rows, reducer.counters.samples_dropped
(1, 1)
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from rlpulse.producer.stats import Counters
from rlpulse.producer.values import Samples
from rlpulse.schemas.samples import (
    KEYS,
    SampleLimits,
    SampleRow,
    SampleState,
    clean_row,
    reduce_rows,
    row_problem,
)

SLICE = 1024
"""Rows reduced between two looks at the ``cutoff`` (about 10 ms of rows of long texts)."""
GAVE_UP = object()
"""What :meth:`SampleReducer.reduce` returns for a value it stopped reducing at its
``cutoff`` (``close()`` is ending): the value is lost, the caller counts it."""
ROW = "\x00row"
"""The field :func:`reduce_then_fill` numbers the rows by while it reduces them (no user field
can be named so; it is gone from the rows it returns)."""


class SampleReducer:
    """Reduces ``Samples`` values of one rank; ``counters`` are the sender thread's, and
    ``warn_once(key, message)`` the producer's (what is wrong with a value or its rows is
    said once per name, as for other bad values)."""

    def __init__(
        self,
        origin: tuple[str, int],
        limits: SampleLimits,
        counters: Counters | None = None,
        warn_once: Callable[[str, str], None] | None = None,
    ) -> None:
        self.origin = origin
        self.limits = limits
        self.counters = counters if counters is not None else Counters()
        self.warn_once = warn_once or _silent
        self._by_k: dict[int, SampleLimits] = {limits.k: limits}
        self._told: set[str] = set()
        """Names whose dropped rows were warned about (the reason is looked for once)."""
        self.cutoff = math.inf
        """``time.monotonic()`` past which values are no longer reduced (set by the sender
        when ``close()`` begins): :data:`GAVE_UP`."""

    def reduce(
        self, value: Samples | SampleState, name: str = "samples"
    ) -> SampleState | object | None:
        """The state of ``value``'s rows, logged under ``name`` (a state reduced already is
        taken as it is, from this rank); None (counted ``invalid``, warned) for a value that
        cannot be reduced at all; :data:`GAVE_UP` past the ``cutoff`` (looked at every
        :data:`SLICE` rows: the states of slices merge exactly into the whole's)."""
        if isinstance(value, SampleState):
            taken = _from(value, self.origin)
            self.counters.samples_dropped += taken.dropped
            self.counters.samples_cut += taken.cut
            return taken
        limits = self._limits(value.k)
        state = None
        if value.refused:
            why = f"{NOT_ROWS}, {value.refused}"
        elif limits is None:
            why = f"Samples k must be an int from 1 to 1024, got {value.k!r}"
        elif type(value.key) is not str or not value.key:
            why = f"Samples key must be a non-empty string, got {value.key!r}"
        else:
            try:
                state = self._reduce(value.rows, value.key, limits)
                if state is GAVE_UP:
                    return GAVE_UP
                assert isinstance(state, SampleState)
                why = _no_rows(value.rows, state)
            except Exception as exc:  # a mapping that raises when read: the value is lost
                why = f"reading its Samples rows failed ({exc!r})"
        if why or not isinstance(state, SampleState) or limits is None:
            self.counters.invalid += 1
            self.warn_once(f"value:{name}", f"{name}: {why}; that value is dropped")
            return None
        self.counters.samples_dropped += state.dropped
        self.counters.samples_cut += state.cut
        if state.dropped and name not in self._told:
            self._told.add(name)
            self.warn_once(
                f"samples-dropped:{name}",
                f"{name}: {state.dropped} of {state.dropped + state.rows} Samples rows dropped "
                f"({self._first_problem(value.rows, value.key, limits)}); counted in "
                "stats()['samples_dropped']",
            )
        return state

    def _reduce(
        self, rows: tuple[object, ...], key: str, limits: SampleLimits
    ) -> SampleState | object:
        """``rows`` reduced a :data:`SLICE` at a time, giving up past the ``cutoff``."""
        state: SampleState | None = None
        for start in range(0, max(len(rows), 1), SLICE):
            if self.cutoff < math.inf and time.monotonic() > self.cutoff:
                return GAVE_UP
            part = reduce_rows(rows[start : start + SLICE], key, origin=self.origin, limits=limits)
            state = part if state is None else state.merge(part)
        assert state is not None
        return state

    @staticmethod
    def _first_problem(rows: tuple[object, ...], key: str, limits: SampleLimits) -> str:
        for row in rows:
            try:
                problem = row_problem(row, key, limits)
            except Exception as exc:  # a mapping that raises when read a second time
                return f"the first: {exc!r}"
            if problem is not None:
                return f"the first: {problem}"
        return "see the step record's dropped"

    def _limits(self, k: object) -> SampleLimits | None:
        if k is None:
            return self.limits
        if type(k) is not int or not 1 <= k <= 1024:
            return None
        limits = self._by_k.get(k)
        if limits is None:
            limits = self._by_k[k] = replace(self.limits, k=k)
        return limits


NOT_ROWS = "Samples rows must be a sequence of mappings (one dict per row)"


def _no_rows(rows: tuple[object, ...], state: SampleState) -> str:
    """Why ``rows`` is no sequence of rows at all (every one dropped, none a mapping: a list
    of tuples or strings is a wrong value, not bad rows); empty when some row is a mapping."""
    if not state.dropped or state.rows or any(isinstance(r, Mapping) for r in rows):
        return ""
    return f"{NOT_ROWS}, its rows are {', '.join(sorted({type(r).__name__ for r in rows}))}"


def _silent(key: str, message: str) -> None:
    """No warnings (a reducer made without the producer's ``warn_once``: tests, tools)."""


def _from(state: SampleState, origin: tuple[str, int]) -> SampleState:
    """``state`` with every row's origin ``origin``."""
    role, rank = origin

    def own(rows: tuple[SampleRow, ...]) -> tuple[SampleRow, ...]:
        return tuple(r._replace(role=role, rank=rank) for r in rows)

    return replace(state, top=own(state.top), bottom=own(state.bottom), random=own(state.random))


def reduce_then_fill(
    rows: Sequence[Mapping[str, Any]],
    key: str,
    fill: Callable[[list[int]], Sequence[Mapping[str, Any]]],
    *,
    origin: tuple[str, int],
    limits: SampleLimits,
    keys: Callable[[], int] = KEYS,
) -> SampleState:
    """The state of ``rows`` completed by ``fill``, which makes the costly fields of the rows
    kept only: ``fill(indices)`` returns, for those indices into ``rows``, the fields to add
    to each, in that order. The state is the one the completed rows would reduce to (which
    rows are kept depends on their ``key`` and random keys only), at the cost of completing at
    most ``3 k`` of them. Texts ``fill`` gives are cut to the limits and counted as cut; a row
    and what ``fill`` adds to it count one field more against ``limits.row_fields``;
    ``ValueError`` if ``fill`` gives a value no row may hold. ``keys``: the random keys'
    source (``rlpulse.schemas.samples.KEYS``).

    >>> texts = []
    >>> state = reduce_then_fill(
    ...     [{"score": float(i)} for i in range(100)], "score",
    ...     lambda idx: [texts.append(i) or {"text": f"row {i}"} for i in idx],
    ...     origin=("driver", 0), limits=SampleLimits(k=1))
    >>> state.rows, [r.fields for r in state.top], len(texts) <= 3
    (100, [{'score': 99.0, 'text': 'row 99'}], True)
    """
    numbered = ({**row, ROW: i} for i, row in enumerate(rows))
    state = reduce_rows(numbered, key, origin=origin, limits=limits, keys=keys)
    kept: dict[int, SampleRow] = {r.rkey: r for r in (*state.top, *state.bottom, *state.random)}
    order = list(kept)
    indices = [int(kept[rkey].fields[ROW]) for rkey in order]  # type: ignore[arg-type]
    added = fill(indices) if indices else []
    if len(added) != len(indices):
        raise ValueError(f"fill gave {len(added)} rows for {len(indices)} indices")
    done: dict[int, SampleRow] = {}
    cut = 0
    for rkey, extra in zip(order, added, strict=True):
        row = kept[rkey]
        fields = {n: v for n, v in row.fields.items() if n != ROW}
        checked = clean_row({**fields, **extra}, key, limits)
        if checked is None:
            raise ValueError(f"fill gave a value no row may hold: {dict(extra)!r:.200}")
        cut += checked[2]
        done[rkey] = row._replace(fields=checked[0])

    def filled(part: tuple[SampleRow, ...]) -> tuple[SampleRow, ...]:
        return tuple(done[r.rkey] for r in part)

    return replace(
        state,
        top=filled(state.top),
        bottom=filled(state.bottom),
        random=filled(state.random),
        cut=state.cut + cut,
    )
