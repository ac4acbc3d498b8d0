"""Histograms: a catalog kind for a measured quantity whose quantiles must merge exactly.

A quantile cannot be merged: the p99 of two replicas is not a function of their p99s. What
merges is a histogram with buckets fixed in advance: each replica counts its samples per
bucket, the counts add up across replicas (an ordinary SUM metric per bucket, so the wire
and the collector need nothing new), and a quantile is read off the merged counts.

One :class:`Histogram` declaration makes the catalog entries of the quantity ``name``:

* ``{name}/bucket/{le}`` (:attr:`Histogram.buckets`, a SUM template): how many samples fell
  in the bucket with upper bound ``le`` (and above the previous bound); ``le`` is one of
  :data:`BOUNDS` spelled by :func:`bound_label`, or ``inf`` for the samples above the last;
* ``{name}`` (:attr:`Histogram.summary`, a pooled-mean family): the raw samples themselves,
  reported as ``{name}/mean``, ``/max`` and ``/min``, exact across replicas;
* ``{name}/p50``, ``/p95``, ``/p99`` (:attr:`Histogram.quantile_entries`, derived): computed by
  the collector from the merged bucket counts with :func:`quantile`.

:meth:`Histogram.observe` turns one reporting interval's samples into what a producer logs.

Quantiles are *exact to bucket resolution*: the estimate lies in the same bucket as the true
sample quantile (the smallest sample with at least ``q * n`` samples at or below it), and so
within one bucket width of it. Bounds are log-spaced, ten per decade from 1 ms to 100 s, so a
bucket spans 26% of its upper bound; within the bucket the estimate interpolates linearly,
as Prometheus' ``histogram_quantile`` does, and is then clamped to the observed minimum and
maximum (which only moves it closer to the truth).

>>> counts = bucket_counts([0.010, 0.011, 0.012, 0.2])
>>> {bound_label(BOUNDS[i]): int(c) for i, c in enumerate(counts) if c}
{'0.01': 1, '0.0126': 2, '0.2': 1}
>>> round(quantile(counts, 0.5), 5)  # half of 4 samples: the 2nd, in (0.01, 0.0126]
0.0113
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Sequence

import numpy as np

from rlpulse.schemas.catalog import Entry, Template, family
from rlpulse.schemas.reductions import Reduction

BOUNDS: tuple[float, ...] = tuple(float(f"{10 ** (k / 10):.3g}") for k in range(-30, 21))
"""Bucket upper bounds: 10**(k/10) for k = -30..20 (1 ms to 100 s), to 3 significant digits."""
INF = "inf"
"""The ``le`` label of the last bucket: samples above every bound."""
QUANTILES: tuple[float, ...] = (0.5, 0.95, 0.99)
"""Quantiles a histogram reports unless its declaration names others."""


def bound_label(bound: float) -> str:
    """A bound as the ``le`` parameter of a bucket name: the shortest exact spelling.

    >>> bound_label(0.00126), bound_label(1.0), bound_label(100.0)
    ('0.00126', '1', '100')
    """
    return f"{bound:g}"


def quantile_label(q: float) -> str:
    """``p50`` for 0.5, ``p99.9`` for 0.999: the last part of a quantile's name.

    >>> quantile_label(0.95), quantile_label(0.999)
    ('p95', 'p99.9')
    """
    return f"p{round(q * 100, 6):g}"


def bucket_counts(
    samples: Iterable[float] | np.ndarray, bounds: Sequence[float] = BOUNDS
) -> np.ndarray:
    """Samples per bucket: ``len(bounds) + 1`` integers, the last for samples above every bound.

    A sample equal to a bound counts in that bound's bucket (``le``: less or equal). Non-finite
    samples are left out (as the producer leaves them out of a summary).

    >>> bucket_counts([0.5, 1.0, 1.5, float("nan")], bounds=(1.0, 2.0)).tolist()
    [2, 1, 0]
    """
    x = np.asarray(samples, dtype=np.float64).ravel()
    x = x[np.isfinite(x)]
    index = np.searchsorted(np.asarray(bounds, dtype=np.float64), x, side="left")
    return np.bincount(index, minlength=len(bounds) + 1).astype(np.int64)


def quantile(
    counts: Sequence[float] | np.ndarray,
    q: float,
    bounds: Sequence[float] = BOUNDS,
    *,
    low: float | None = None,
    high: float | None = None,
) -> float | None:
    """The ``q`` quantile of samples counted per bucket; None when there are none.

    As Prometheus' ``histogram_quantile``: rank ``q * total``, the first bucket whose
    cumulative count reaches it, and linear interpolation between the bucket's lower bound
    (the previous bound; 0 for the first bucket) and its upper bound. ``low`` and ``high``,
    the observed minimum and maximum when known, clamp the result, and ``high`` is the upper
    bound of the last bucket (without it, a rank in the last bucket gives the last bound, as
    in Prometheus).

    >>> quantile([0, 4, 0], 0.5, bounds=(1.0, 2.0))   # 4 samples in (1, 2]
    1.5
    >>> quantile([0, 4, 0], 0.5, bounds=(1.0, 2.0), low=1.8, high=1.9)
    1.8
    """
    if not 0.0 < q < 1.0:
        raise ValueError(f"quantile must be strictly between 0 and 1, got {q!r}")
    c = np.asarray(counts, dtype=np.float64)
    if len(c) != len(bounds) + 1:
        raise ValueError(
            f"{len(c)} bucket counts for {len(bounds)} bounds (expected {len(bounds) + 1})"
        )
    total = float(c.sum())
    if not total > 0.0:
        return None
    rank = q * total
    cumulative = np.cumsum(c)
    b = int(np.searchsorted(cumulative, rank, side="left"))
    below = float(cumulative[b - 1]) if b > 0 else 0.0
    lower = bounds[b - 1] if b > 0 else 0.0
    if b < len(bounds):
        upper = bounds[b]
    elif high is not None and high > lower:
        upper = high
    else:
        return _clamp(bounds[-1], low, high)
    value = lower + (upper - lower) * (rank - below) / float(c[b])
    return _clamp(value, low, high)


def _clamp(value: float, low: float | None, high: float | None) -> float:
    if low is not None and math.isfinite(low):
        value = max(value, low)
    if high is not None and math.isfinite(high):
        value = min(value, high)
    return value


class Histogram:
    """A quantity recorded as mergeable bucket counts plus its pooled raw samples; the catalog
    entries it makes are attributes (see the module docstring).

    ``count_unit`` is the unit of a bucket count (what one sample is: a request, a step).
    Quantile entries are derived: the collector computes them, producers never log them.

    >>> h = Histogram("demo/latency", "s", "Seconds per call.", count_unit="calls")
    >>> h.buckets.format(le=bound_label(BOUNDS[0]))
    'demo/latency/bucket/0.001'
    >>> [e.name for e in h.quantile_entries.values()]
    ['demo/latency/p50', 'demo/latency/p95', 'demo/latency/p99']
    >>> sorted(h.observe([0.25, 0.5]))
    ['demo/latency', 'demo/latency/bucket/0.251', 'demo/latency/bucket/0.501']
    """

    def __init__(
        self,
        name: str,
        unit: str,
        help: str,
        *,
        count_unit: str,
        quantiles: Sequence[float] = QUANTILES,
        bounds: Sequence[float] = BOUNDS,
    ) -> None:
        bounds = tuple(float(b) for b in bounds)
        if not bounds or not all(math.isfinite(b) and b > 0 for b in bounds):
            raise ValueError(f"{name}: bounds must be positive finite numbers, got {bounds}")
        if any(b >= c for b, c in itertools.pairwise(bounds)):
            raise ValueError(f"{name}: bounds must increase strictly, got {bounds}")
        labels = tuple(bound_label(b) for b in bounds)
        if len(set(labels)) != len(labels) or any(
            float(s) != b for s, b in zip(labels, bounds, strict=True)
        ):
            raise ValueError(
                f"{name}: bounds must have distinct exact short spellings, got {labels}"
            )
        if not quantiles or not all(0.0 < q < 1.0 for q in quantiles):
            raise ValueError(
                f"{name}: quantiles must lie strictly between 0 and 1, got {quantiles}"
            )
        self.name = name
        self.unit = unit
        self.bounds: tuple[float, ...] = bounds
        self.labels: tuple[str, ...] = (*labels, INF)
        """The ``le`` of each bucket, in bucket order (the last is :data:`INF`)."""
        self.buckets = Template(
            f"{name}/bucket/{{le}}",
            Reduction.SUM,
            count_unit,
            f"Histogram bucket of {name}: samples above the previous bound and at most le "
            f"({unit}; le=inf: above the last bound), summed over the reporting interval and "
            "across producers. The collector derives the quantiles from these counts.",
            choices={"le": self.labels},
        )
        self.summary: Entry = family(
            name, unit, f"{help} Mean, max and min, pooled exactly over every sample."
        )
        self.quantile_entries: dict[float, Entry] = {
            q: Entry(
                f"{name}/{quantile_label(q)}",
                Reduction.MAX,  # never merged: computed by the collector after merging
                unit,
                f"{help} Quantile {q:g}, computed by the collector from the bucket counts "
                f"{name}/bucket/{{le}} merged across producers (interpolated within the "
                "bucket as Prometheus' histogram_quantile does, clamped to the observed min "
                "and max): exact to bucket resolution.",
                derived=True,
            )
            for q in quantiles
        }
        self.bucket_names: tuple[str, ...] = tuple(self.buckets.format(le=le) for le in self.labels)
        """The bucket metrics' names, in bucket order."""

    @property
    def entries(self) -> tuple[Entry, ...]:
        """The fixed catalog entries: the summary family, then each quantile."""
        return (self.summary, *self.quantile_entries.values())

    def observe(self, samples: Sequence[float] | np.ndarray) -> dict[str, object]:
        """What a producer logs for one interval's ``samples``: the non-zero bucket counts and
        the finite samples themselves (for the summary). Empty when there are no samples."""
        x = np.asarray(samples, dtype=np.float64).ravel()
        x = x[np.isfinite(x)]
        if x.size == 0:
            return {}
        counts = bucket_counts(x, self.bounds)
        out: dict[str, object] = {
            self.bucket_names[i]: int(counts[i]) for i in np.flatnonzero(counts)
        }
        out[self.name] = x
        return out
