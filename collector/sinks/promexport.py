"""``prometheus_client`` glue for the Prometheus sink: metric families built from plain values,
and the collector's own process metrics read at most once a second."""

from __future__ import annotations

import math
import time
from collections.abc import Iterable
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.process_collector import ProcessCollector

PROCESS_REFRESH_S = 1.0
"""How old the collector's own process metrics on /metrics may be."""


def number(value: Any) -> float | None:
    """``value`` as a float when it is a real number (not a bool), else None."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def make_family(
    name: str, help_: str, kind: str, labels: list[str], samples: list[tuple[list[str], float]]
) -> Metric:
    """A counter or gauge family named ``name`` holding ``samples`` (label values, value)."""
    out: Metric
    if kind == "counter":
        out = CounterMetricFamily(name, help_, labels=labels)
    else:
        out = GaugeMetricFamily(name, help_, labels=labels)
    for label_values, value in samples:
        out.add_metric(label_values, value)
    return out


class ProcessSnapshot:
    """``prometheus_client``'s process metrics (CPU, memory, open files), read from /proc at
    most every ``PROCESS_REFRESH_S``: the reads were a third of a scrape's cost, and a second's
    resolution is finer than any scrape interval needs."""

    def __init__(self) -> None:
        self._inner = ProcessCollector(registry=None)
        self._families: list[Metric] = []
        self._read_at = -math.inf

    def collect(self) -> Iterable[Metric]:
        now = time.monotonic()
        if now - self._read_at >= PROCESS_REFRESH_S:
            self._families = list(self._inner.collect())  # replaced whole: safe for other scrapes
            self._read_at = now
        return self._families
