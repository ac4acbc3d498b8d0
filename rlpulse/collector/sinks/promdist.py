"""Distribution metrics on /metrics: each as a Prometheus histogram family, summed over steps.

A distribution (``Reduction.DIST``, ``rlpulse.schemas.sketch``) reports its per-step mean, max,
min and quantiles as gauges like any metric; in addition, its merged sketches are added up over
every step the sink writes into cumulative ``_bucket{le}`` counts, ``_sum`` and ``_count``, so
``histogram_quantile(0.9, rate(..._bucket[5m]))`` works over any window. The sketch's slots
(about 2% wide) are coarsened to the fixed boundaries :data:`BOUNDS`: a slot counts in the first
bucket whose ``le`` is at or above the slot's upper edge, so a bucket's count is exact but for
samples within 2% below its ``le``, which may be counted one bucket up. ``_sum`` of a
distribution with negative samples can fall between scrapes (it is exported all the same, for
``rate(_sum) / rate(_count)``).

>>> t = DistTotals()
>>> from rlpulse.schemas import sketch
>>> t.add({"d": sketch.encode(sketch.counts_of(np.array([0.3, 4.0])))}, {"d/mean": 2.15}, {})
>>> [(s.name, s.labels.get("le"), s.value) for f in dist_families({"r": t})
...  for s in f.samples if s.labels.get("le") in (None, "0.5", "5", "+Inf")]  # doctest: +NORMALIZE_WHITESPACE
[('rlpulse_d_bucket', '0.5', 1.0), ('rlpulse_d_bucket', '5', 2.0),
 ('rlpulse_d_bucket', '+Inf', 2.0), ('rlpulse_d_count', None, 2.0), ('rlpulse_d_sum', None, 4.3)]
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping

import numpy as np
from prometheus_client.core import HistogramMetricFamily
from prometheus_client.metrics_core import Metric

from rlpulse.collector.output.promnames import prom_metric
from rlpulse.schemas import sketch
from rlpulse.schemas.errors import SchemaError

_STEPS = (1.0, 2.0, 5.0)
_POSITIVE = tuple(m * 10.0**e for e in range(-3, 5) for m in _STEPS)
BOUNDS: tuple[float, ...] = (*(-b for b in reversed(_POSITIVE)), 0.0, *_POSITIVE)
"""The ``le`` boundaries of every distribution histogram: 0, and 1-2-5 steps from 0.001 to
50000 of either sign (49 boundaries and +Inf)."""
LABELS: tuple[str, ...] = (*(f"{b:g}" for b in BOUNDS), "+Inf")


class DistTotals:
    """One run's distribution histograms, summed over the steps :meth:`add` was given."""

    def __init__(self) -> None:
        self.counts: dict[str, np.ndarray] = {}
        self.sums: dict[str, float] = {}
        self.roles: dict[str, str] = {}

    def add(
        self, distributions: Mapping[str, bytes], metrics: Mapping[str, float], roles: Mapping
    ) -> None:
        """Add one step's merged sketches (``StepRecord.distributions``); a sketch that does
        not decode is skipped (the collector made it, so it does not happen)."""
        for name, buf in distributions.items():
            try:
                upper, n = sketch.bucket_bounds(sketch.decode(buf))
            except SchemaError:
                continue
            index = np.searchsorted(BOUNDS, upper, side="left")
            counts = self.counts.setdefault(name, np.zeros(len(LABELS)))
            counts += np.bincount(index, weights=n, minlength=len(LABELS))
            mean = metrics.get(f"{name}/mean")
            if mean is not None and math.isfinite(mean):
                self.sums[name] = self.sums.get(name, 0.0) + mean * float(n.sum())
            role = roles.get(f"{name}/mean")
            if role:
                self.roles[name] = role

    def copy(self) -> DistTotals:
        out = DistTotals()
        out.counts = {k: v.copy() for k, v in self.counts.items()}
        out.sums, out.roles = dict(self.sums), dict(self.roles)
        return out


def dist_families(runs: Mapping[str, DistTotals]) -> Iterator[Metric]:
    """One histogram family per distribution name, a series per run (labels run, role)."""
    names = sorted({name for t in runs.values() for name in t.counts})
    for name in names:
        pm = prom_metric(name)
        family = HistogramMetricFamily(
            pm.name,
            f"Distribution of {name}, summed over steps (rlpulse name: {name}); buckets from "
            f"its quantile sketch, {sketch.ALPHA:.0%} wide.",
            labels=["run", "role"],
        )
        for run, t in sorted(runs.items()):
            if name in t.counts:
                labels = {"run": run, "role": t.roles.get(name, "")}
                cumulative = np.cumsum(t.counts[name]).tolist()
                # Not add_metric's sum: it leaves out _sum and _count when a bucket is
                # negative (a sum of signed samples can fall, so it is no counter); _count
                # is one all the same, and _sum still gives rate(_sum) / rate(_count).
                family.add_metric(
                    list(labels.values()), list(zip(LABELS, cumulative, strict=True)), None
                )
                family.add_sample(f"{pm.name}_count", labels, cumulative[-1])
                family.add_sample(f"{pm.name}_sum", labels, t.sums.get(name, 0.0) * pm.scale)
        yield family
