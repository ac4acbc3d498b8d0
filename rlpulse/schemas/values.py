"""Mergeable metric states: the only maths that combines numbers from different ranks.

Every value rlpulse moves is a :class:`Summary` of four numbers, ``(sum, weight, min, max)``:

* ``sum`` and ``weight`` pool exactly. A weighted mean is ``sum / weight``; a fraction is
  numerator / denominator, the same two slots; a count is ``sum``. A mean of per-rank means is
  wrong whenever ranks hold different numbers of tokens: rank A with 7 tokens at mean 1.0 and
  rank B with 3000 tokens at mean 0.0 have a pooled mean of 7/3007, not 0.5.
* ``min`` and ``max`` are the extremes of the samples seen. NaN means *not observed* (a rank
  that logged a pre-computed mean has no extremes, an empty rank has none at all); merging
  ignores NaN, so a rank that saw nothing never erases another rank's real extreme.

The reduction of the metric (``rlpulse.schemas.reductions``) decides only two things: that ``LAST``
replaces ``sum`` instead of adding it, and which statistic is read at the end.

>>> a = Summary.of_samples([1.0, 3.0])
>>> b = Summary.of_weighted(0.5, 4.0)
>>> merged = a.merge(b, Reduction.MEAN)
>>> merged.read(Stat.MEAN), merged.read(Stat.MAX)
(1.0, 3.0)
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import NamedTuple

import numpy as np

from rlpulse.schemas.reductions import Reduction, Stat

NAN = math.nan


class Summary(NamedTuple):
    """Sum, weight and extremes of some samples: the one mergeable state. A tuple in wire
    order, so the producer packs it and the collector's arrays hold it as it is. Merges
    associatively and commutatively (``LAST`` aside, which keeps the later of two states).

    >>> Summary.of_fraction(3, 40)
    Summary(sum=3.0, weight=40.0, min=nan, max=nan)
    """

    sum: float = 0.0
    weight: float = 0.0
    min: float = NAN
    max: float = NAN

    @classmethod
    def of_scalar(cls, value: float) -> Summary:
        """One sample (finite: a non-finite one is no sample, see ``of_samples``)."""
        v = float(value)
        return tuple.__new__(cls, (v, 1.0, v, v))

    @classmethod
    def of_samples(cls, values: Iterable[float]) -> Summary:
        """Every finite value is one sample; non-finite values are left out."""
        arr = np.asarray(list(values), dtype=np.float64).ravel()
        arr = arr[np.isfinite(arr)]
        if arr.size == 0:
            return EMPTY
        return cls(float(arr.sum()), float(arr.size), float(arr.min()), float(arr.max()))

    @classmethod
    def of_weighted(cls, value: float, weight: float) -> Summary:
        """A mean over ``weight`` samples whose extremes are unknown."""
        w = float(weight)
        return cls(float(value) * w, w, NAN, NAN) if w > 0 else EMPTY

    @classmethod
    def of_fraction(cls, numerator: float, denominator: float) -> Summary:
        """``numerator`` of ``denominator`` items had the property."""
        return cls(float(numerator), float(denominator), NAN, NAN)

    def merge(self, other: Summary, reduction: Reduction) -> Summary:
        """Combine two states of the same metric; ``other`` is the later one
        (:func:`reduce_rows` of the two)."""
        pair = np.array((self, other), dtype=np.float64).reshape(2, 1, WIDTH)
        last = _LAST_ONE if reduction is Reduction.LAST else None
        return Summary._make(reduce_rows(pair, last)[0].tolist())

    def read(self, stat: Stat) -> float | None:
        """The statistic, or None when the samples do not define it (no weight, no extremes)."""
        return read_row(self, stat)


EMPTY = Summary()
"""No samples: zero sum and weight, extremes not observed."""
WIDTH = len(Summary._fields)
"""Numbers per state on the wire and in the collector's arrays."""
SUM, WEIGHT, MIN, MAX = range(WIDTH)


RULE: tuple[np.ufunc, ...] = (np.add, np.add, np.fmin, np.fmax)
"""The merge rule, per column (``SUM, WEIGHT, MIN, MAX``): sums and weights add, extremes
keep the smaller and the larger, a NaN (not observed) losing to any number. ``LAST`` metrics
then take the later state's sum (:func:`_keep_latest`). Every merge here applies these
ufuncs: ``ufunc(a, b)`` for two states, ``ufunc.reduce`` for k, never a loop over rows."""
_LAST_ONE = np.ones(1, dtype=bool)
_LAST_ONE.flags.writeable = False


def _keep_latest(merged: np.ndarray, latest: np.ndarray, last: np.ndarray) -> None:
    """``LAST`` rows (``last``) of ``merged`` take the sum of ``latest``, in place."""
    merged[:, SUM] = np.where(last, latest[:, SUM], merged[:, SUM])


def reduce_rows(rows: np.ndarray, last: np.ndarray | None = None) -> np.ndarray:
    """Merge k states of each of n metrics: ``rows`` is k x n x 4, oldest first; return the
    n x 4 merged states (for k == 1, ``rows[0]`` itself). ``last`` marks the metrics that
    reduce by ``LAST`` (None: none do). The one merge rule (:data:`RULE`); the others here
    are this one for k == 2.

    >>> reduce_rows(np.array([[[1.0, 1.0, 1.0, 1.0]], [[3.0, 1.0, 3.0, 3.0]]])).tolist()
    [[4.0, 2.0, 1.0, 3.0]]
    """
    if rows.shape[0] == 1:
        return rows[0]
    merged = np.empty(rows.shape[1:], dtype=np.float64)
    for column, ufunc in enumerate(RULE):
        ufunc.reduce(rows[:, :, column], axis=0, out=merged[:, column])
    if last is not None:
        _keep_latest(merged, rows[-1], last)
    return merged


def merge_rows(
    acc: np.ndarray, idx: np.ndarray | slice, rows: np.ndarray, last: np.ndarray | None
) -> None:
    """Merge ``rows`` (n x 4 states) into ``acc`` at rows ``idx``, in place: :func:`reduce_rows`
    of the pair (``acc[idx]``, ``rows``) without stacking them.

    ``idx`` (indices or a slice) must not repeat a row (a rank's one call logs each name
    once); ``last`` marks the rows whose metric reduces by ``LAST`` (None: none do).
    """
    target = acc[idx]  # a view for a slice, a copy for an index array
    for column, ufunc in enumerate(RULE):
        ufunc(target[:, column], rows[:, column], out=target[:, column])
    if last is not None:
        _keep_latest(target, rows, last)
    if not isinstance(idx, slice):
        acc[idx] = target


READ = (Stat.MEAN, Stat.FRACTION, Stat.SUM, Stat.LAST, Stat.MIN, Stat.MAX)
"""The statistics a state reads as, in the order of :func:`read_matrix`'s rows."""


def read_matrix(rows: np.ndarray) -> np.ndarray:
    """Every statistic of every state row (``rows`` is n x 4): a ``len(READ)`` x n array,
    one row per statistic of :data:`READ`, NaN where the samples do not define it (no
    weight; extremes never observed). The one definition of how a merged state reads: ratios
    (mean, fraction) are sum over weight, ``LAST`` the sum when there was a sample, extremes
    as they are. A quantile logged on its own merges by max and reads the max; a
    distribution's quantiles are read off its sketch by the collector, never here."""
    total, weight = rows[:, SUM], rows[:, WEIGHT]
    seen = weight > 0
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(seen, total / np.where(seen, weight, 1.0), NAN)
    return np.stack((ratio, ratio, total, np.where(seen, total, NAN), rows[:, MIN], rows[:, MAX]))


def read_rows(rows: np.ndarray) -> dict[Stat, list[float]]:
    """:func:`read_matrix` by statistic, as lists of Python floats."""
    return dict(zip(READ, read_matrix(rows).tolist(), strict=True))


def read_row(row: Sequence[float] | np.ndarray, stat: Stat) -> float | None:
    """Read ``stat`` off one state row (:func:`read_rows`); None when the samples do not
    define it."""
    columns = read_rows(np.asarray(row, dtype=np.float64).reshape(1, WIDTH))
    value = columns.get(stat, columns[Stat.MAX])[0]
    return None if math.isnan(value) else value


def empty_rows(n: int) -> np.ndarray:
    """``n`` identity states: zero sum and weight, extremes not observed."""
    out = np.zeros((n, WIDTH), dtype=np.float64)
    out[:, MIN:] = NAN
    return out


def reduce_checked(rows: np.ndarray, last: np.ndarray | None = None) -> np.ndarray | None:
    """:func:`reduce_rows` of states read off the wire, or None when one of them is not valid
    (:func:`invalid_rows` says which and why). The check reads the merged states, so it costs a
    quarter of checking first (:func:`all_valid`)."""
    with np.errstate(invalid="ignore", over="ignore"):  # the check below says no
        merged = reduce_rows(rows)
    if not all_valid(rows, merged):
        return None
    if last is not None and rows.shape[0] > 1:
        _keep_latest(merged, rows[-1], last)
    return merged


def all_valid(rows: np.ndarray, merged: np.ndarray) -> bool:
    """Whether every state of ``rows`` (k x n x 4) is valid (:func:`invalid_rows` is None),
    decided with ``merged``, their :func:`reduce_rows` (with no ``last``), in single-column
    passes: :func:`invalid_rows`' passes over two columns at once are several times slower.
    False may also mean sums too large to add up: :func:`invalid_rows` is exact."""
    with np.errstate(invalid="ignore"):
        return bool(
            # a NaN or infinity among k sums (or weights) makes their sum NaN or infinite
            np.isfinite(merged[:, :MIN]).all()
            and not (rows[..., WEIGHT] < 0).any()
            and not (rows[..., MIN] > rows[..., MAX]).any()
            # -inf among the minima is their fmin, +inf among the maxima their fmax
            and not np.isinf(merged[:, MIN:]).any()
            and not (rows[..., MIN] == math.inf).any()
            and not (rows[..., MAX] == -math.inf).any()
        )


def invalid_rows(rows: np.ndarray) -> str | None:
    """Why states read off the wire are impossible, or None when they are fine: ``rows`` is
    ``(..., 4)``. Sums and weights must be finite, weights non-negative, extremes finite or
    NaN (not observed), and min <= max. The producer never sends anything else."""
    if rows.size == 0:
        return None
    if not np.isfinite(rows[..., :MIN]).all():
        return "sum and weight must be finite (NaN/Inf samples are dropped by the producer)"
    if (rows[..., WEIGHT] < 0).any():
        return "weight must not be negative"
    extremes = rows[..., MIN:]
    if np.isinf(extremes).any():
        return "min and max must be finite or NaN (not observed)"
    if (extremes[..., 0] > extremes[..., 1]).any():
        return "min is greater than max"
    return None
