"""``Samples`` names in the collector: merging their states into a step.

Each open step keeps, per run row of a name logged as ``Samples`` (its value counts the rows,
a ``SUM``), the merged :class:`~rlpulse.schemas.samples.SampleState`: the top and bottom
``k`` rows by the key and the ``k`` rows of smallest random key over every entry so far, so
its memory is bounded by ``k`` rows per name, whatever the rows logged. The merge is exact
and does not depend on order, so a relay forwards its merged states and its collector merges
them like any producer's; a step rebuilt from its kept entries (a replaced process's data
withdrawn, or the write-ahead log replayed) gets the same rows back, their random keys
travelling with them.

>>> from rlpulse.schemas import samples
>>> acc: dict[int, samples.SampleState] = {}
>>> part = samples.reduce_rows([{"r": 1.0}], "r", origin=("a", 0))
>>> merge_into(acc, {2: samples.encode(part)}); merge_into(acc, {2: samples.encode(part)})
>>> acc[2].rows
2
"""

from __future__ import annotations

from collections.abc import Mapping

from rlpulse.schemas import samples
from rlpulse.schemas.errors import SchemaError
from rlpulse.schemas.samples import SampleState


def merge_into(acc: dict[int, SampleState], states: Mapping[int, bytes]) -> None:
    """Merge decoded ``states`` (run row -> bytes) into ``acc`` (run row -> state), in place;
    raise :class:`SchemaError` (``bad_samples``) for bytes that are no samples state, or one
    ranked by another key than the step's so far (nothing is merged then)."""
    merged: dict[int, SampleState] = {}
    for row, buf in states.items():
        try:
            state = samples.decode(buf)
            held = acc.get(row)
            merged[row] = state if held is None else held.merge(state)
        except SchemaError as exc:
            raise SchemaError("bad_samples", exc.detail) from None
    acc.update(merged)
