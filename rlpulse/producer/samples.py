"""``Samples`` values on the sender thread: rows reduced to a mergeable state.

``log()`` only keeps the :class:`~rlpulse.producer.values.Samples` object (a copy of the rows'
references); the encoder hands it here, on the sender thread, where its rows are checked,
bounded and reduced to the top, bottom and random ``k`` (``rlpulse.schemas.samples``), with
this rank's ``(role, rank)`` as every row's origin. Bad rows are dropped and counted
(``samples_dropped``), cut texts counted (``samples_cut``); a bad value as a whole (a ``k``
out of range, a key that is not a string) is counted ``invalid``. Nothing here raises.

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
)

ROW = "\x00row"
"""The field :func:`reduce_then_fill` numbers the rows by while it reduces them (no user field
can be named so; it is gone from the rows it returns)."""


class SampleReducer:
    """Reduces ``Samples`` values of one rank; ``counters`` are the sender thread's."""

    def __init__(
        self, origin: tuple[str, int], limits: SampleLimits, counters: Counters | None = None
    ) -> None:
        self.origin = origin
        self.limits = limits
        self.counters = counters if counters is not None else Counters()
        self._by_k: dict[int, SampleLimits] = {limits.k: limits}

    def reduce(self, value: Samples | SampleState) -> SampleState | None:
        """The state of ``value``'s rows (a state as it is, from this rank); None (counted
        ``invalid``) for a value that cannot be reduced at all."""
        if isinstance(value, SampleState):
            state = _from(value, self.origin)
        else:
            limits = self._limits(value.k)
            if limits is None or type(value.key) is not str or not value.key:
                self.counters.invalid += 1
                return None
            try:
                state = reduce_rows(value.rows, value.key, origin=self.origin, limits=limits)
            except Exception:  # a mapping that raises when read: the value is lost, counted
                self.counters.invalid += 1
                return None
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
