"""Distribution metrics in the collector: merging their quantile sketches into a step.

Each open step keeps, per run row of a distribution metric (``Reduction.DIST``), the dense
counts of its sketch (``rlpulse.schemas.sketch``): every entry's sketches, decoded, are added
to them (exact: counts are integers), and when the step is emitted the quantiles are read
off the merged counts, clamped to the row's exact min and max. A relay forwards the merged
counts; its collector adds them like any producer's.

>>> from rlpulse.schemas import sketch
>>> acc: dict[int, np.ndarray] = {}
>>> merge_into(acc, {3: sketch.encode(sketch.counts_of(np.array([1.0, 2.0])))})
>>> merge_into(acc, {3: sketch.encode(sketch.counts_of(np.array([4.0])))})
>>> int(acc[3].sum())
3
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from rlpulse.schemas import sketch
from rlpulse.schemas.reductions import QUANTILE_STATS, Stat
from rlpulse.schemas.values import MAX, MIN


def merge_into(acc: dict[int, np.ndarray], sketches: Mapping[int, bytes]) -> None:
    """Add decoded ``sketches`` (run row -> bytes) into ``acc`` (run row -> counts), in
    place; raise :class:`SchemaError` for a sketch that is not one (nothing is added then)."""
    decoded = {row: sketch.decode(buf) for row, buf in sketches.items()}
    for row, counts in decoded.items():
        held = acc.get(row)
        if held is None:
            acc[row] = counts
        else:
            held += counts


def read(counts: np.ndarray | None, row: Sequence[float] | np.ndarray, stat: Stat) -> float | None:
    """A quantile statistic of a distribution row: off its merged sketch, clamped to the row's
    exact min and max; None without a sketch (only ``Weighted`` values were logged)."""
    if counts is None:
        return None
    return sketch.quantile(counts, QUANTILE_STATS[stat], low=row[MIN], high=row[MAX])


def by_table_row(
    sketches: Sequence[tuple[int, int, bytes]], entries: int
) -> list[dict[int, bytes] | None]:
    """A message's ``(entry, row, bytes)`` references grouped per entry (None: no sketch);
    references to entries the message does not hold are ignored."""
    out: list[dict[int, bytes] | None] = [None] * entries
    for entry, row, buf in sketches:
        if entry < entries:
            held = out[entry]
            if held is None:
                held = out[entry] = {}
            held[row] = buf
    return out
