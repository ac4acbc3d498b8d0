"""``prometheus_client`` glue for the Prometheus sink: metric families built from plain values
(the collector's health snapshot among them), the running totals that Prometheus wants as
histograms and counters (:class:`Totals`), the collector's own process metrics read at most
once a second, and the text of /metrics kept between scrapes part by part (:class:`TextCache`)."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.process_collector import ProcessCollector

from rlpulse.collector.health import (
    HTTP_METRICS,
    MALFORMED,
    PRODUCER_METRICS,
    RELAY_METRICS,
    SINK_METRICS,
    Health,
)
from rlpulse.collector.output.promnames import NONFINITE, PromMetric, prom_metric
from rlpulse.schemas import metrics as M
from rlpulse.schemas.errors import REJECT_REASONS
from rlpulse.schemas.histogram import INF, Histogram
from rlpulse.schemas.reductions import Stat

PROCESS_REFRESH_S = 1.0
"""How old the collector's own process metrics on /metrics may be."""


def number(value: Any) -> float | None:
    """``value`` as a float when it is a real number (not a bool), else None."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


Family = CounterMetricFamily | GaugeMetricFamily
"""A family that takes samples (``add_metric``)."""


def make_family(
    name: str,
    help_: str,
    kind: str,
    labels: Sequence[str],
    samples: Iterable[tuple[Sequence[str], float]],
) -> Family:
    """A counter or gauge family named ``name`` holding ``samples`` (label values, value)."""
    out: Family
    if kind == "counter":
        out = CounterMetricFamily(name, help_, labels=labels)
    else:
        out = GaugeMetricFamily(name, help_, labels=labels)
    for label_values, value in samples:
        out.add_metric(label_values, value)
    return out


FamilyData = tuple[str, str, str, tuple[str, ...], tuple[tuple[tuple[str, ...], float], ...]]
"""A counter or gauge family as plain data, :func:`make_family`'s arguments: name, help, kind,
label names, and (label values, value) pairs. Equal data, equal text on /metrics."""


def health_data(health: Mapping[str, Any]) -> tuple[FamilyData, ...]:
    """The collector's health snapshot (``Health.snapshot``) as families; a value that is not
    a number is left out, and every reject reason is there, at 0 until it occurs.

    >>> [(f[0], f[4]) for f in health_data({"late": 3, "sinks": {"jsonl": {"written": 9}}})
    ...  if f[4]]  # doctest: +NORMALIZE_WHITESPACE
    [('rlpulse_collector_late_entries_total', (((), 3.0),)),
     ('rlpulse_sink_written_total', ((('jsonl',), 9.0),))]
    """
    out: list[FamilyData] = []
    for metric in (*Health.declared(), *PRODUCER_METRICS, *HTTP_METRICS):
        value = number(health.get(metric.key))
        if value is not None:
            out.append((metric.name, metric.help, metric.kind, (), (((), value),)))
    malformed = health.get(MALFORMED.key)
    if isinstance(malformed, Mapping):
        # Every known reason from the start, at 0 until it occurs: increase() and the
        # malformed-messages alert need a series before the first reject to see it.
        counts = dict.fromkeys(REJECT_REASONS, 0.0)
        counts.update((str(k), v) for k, v in malformed.items() if number(v) is not None)
        by_reason = tuple(((reason,), float(v)) for reason, v in sorted(counts.items()))
        out.append((MALFORMED.name, MALFORMED.help, MALFORMED.kind, ("reason",), by_reason))
    sinks = health.get("sinks")
    if isinstance(sinks, Mapping):
        for metric in SINK_METRICS:
            samples = []
            for sink_name, stats in sorted(sinks.items()):
                value = number(stats.get(metric.key)) if isinstance(stats, Mapping) else None
                if value is not None:
                    samples.append(((str(sink_name),), value))
            out.append((metric.name, metric.help, metric.kind, ("sink",), tuple(samples)))
    relays = health.get("relays")
    if isinstance(relays, Mapping):
        for metric in RELAY_METRICS:
            rows = []
            for (relay, host), stats in sorted(relays.items()):
                value = number(stats.get(metric.key)) if isinstance(stats, Mapping) else None
                if value is not None:
                    rows.append(((str(relay), str(host)), value))
            out.append((metric.name, metric.help, metric.kind, ("relay", "host"), tuple(rows)))
    return tuple(out)


_ERROR_KINDS: dict[str, str] = {
    M.SERVE_ERRORS.format(kind=k): k for k in M.SERVE_ERRORS.choices["kind"]
}
ERRORS = prom_metric(M.SERVE_ERRORS_TOTAL.name)
"""``rlpulse_serve_errors_total{kind}``: errors by kind, a counter (``sum without (kind)`` is
the catalog's ``serve/errors_total``)."""
REPLACED: frozenset[str] = frozenset(
    {
        *(n for h in M.HISTOGRAMS for n in h.bucket_names),
        *(e.name for h in M.HISTOGRAMS for e in h.quantile_entries.values()),
        *_ERROR_KINDS,
        M.SERVE_ERRORS_TOTAL.name,
    }
)
"""Reported names :class:`Totals` exports instead of a gauge of the latest step: histogram
buckets and quantiles (one window's counts, and quantiles of one window, are the stale mix a
15 s scrape of 1 s windows sees) and errors by kind."""


def _sum_name(histogram: Histogram) -> str:
    return histogram.summary.output_names()[Stat.MEAN]


class Totals:
    """One run's running totals, for metrics whose per-step values Prometheus must see summed:
    each catalog histogram as a Prometheus histogram (cumulative ``_bucket{le}``, ``_sum``,
    ``_count``) and the server's errors as counters by kind. :meth:`add` takes every emitted
    step once; a histogram exists, at 0, from the run's first step that reports a metric of its
    group (``serve/``), so ``rate()`` sees the first request.
    """

    def __init__(self) -> None:
        self.counts: dict[str, np.ndarray] = {}
        self.sums: dict[str, float] = {}
        self.errors: dict[str, float] = {}
        self.roles: dict[str, str] = {}
        self.nonfinite: dict[str, float] = {}
        """Per logged name, the NaN and infinite samples producers dropped (summed)."""
        self.nonfinite_roles: dict[str, str] = {}

    def add(self, metrics: Mapping[str, float], roles: Mapping[str, str]) -> None:
        """Add one emitted step's values."""
        groups = {name.split("/", 1)[0] for name in metrics}
        for h in M.HISTOGRAMS:
            if h.name not in self.counts and h.name.split("/", 1)[0] not in groups:
                continue
            window = np.array([metrics.get(b, 0.0) for b in h.bucket_names], dtype=np.float64)
            counts = self.counts.setdefault(h.name, np.zeros(len(h.bucket_names)))
            counts += window
            mean = metrics.get(_sum_name(h))
            if mean is not None and math.isfinite(mean):  # the pooled mean of the same samples
                self.sums[h.name] = self.sums.get(h.name, 0.0) + mean * float(window.sum())
            else:
                self.sums.setdefault(h.name, 0.0)
            group = h.name.split("/", 1)[0] + "/"
            role = next((r for n, r in roles.items() if r and n.startswith(group)), None)
            if role:
                self.roles[h.name] = role
        for name, kind in _ERROR_KINDS.items():
            if name in metrics:
                self.errors[kind] = self.errors.get(kind, 0.0) + metrics[name]
                self.roles.setdefault(ERRORS.name, roles.get(name, ""))

    def add_nonfinite(self, counts: Mapping[str, int], roles: Mapping[str, str]) -> None:
        """Add one emitted step's ``nonfinite`` counts (``StepRecord.nonfinite``)."""
        for name, n in counts.items():
            self.nonfinite[name] = self.nonfinite.get(name, 0.0) + n
            role = roles.get(name)
            if role:
                self.nonfinite_roles[name] = role

    def copy(self) -> Totals:
        out = Totals()
        out.counts = {k: v.copy() for k, v in self.counts.items()}
        out.sums, out.errors, out.roles = dict(self.sums), dict(self.errors), dict(self.roles)
        out.nonfinite, out.nonfinite_roles = dict(self.nonfinite), dict(self.nonfinite_roles)
        return out


def nonfinite_family(
    runs: Mapping[str, Totals], prom: Callable[[str], PromMetric]
) -> Metric | None:
    """``rlpulse_nonfinite_samples_total{run, role, metric}`` of every run's :class:`Totals`
    (``metric``: the Prometheus name of the metric, ``prom``), or None before any was counted.

    >>> t = Totals()
    >>> t.add_nonfinite({"actor/loss": 2}, {})
    >>> [(s.name, s.labels["metric"], s.value) for s in nonfinite_family({"r": t}, prom_metric)
    ...  .samples]  # doctest: +NORMALIZE_WHITESPACE
    [('rlpulse_nonfinite_samples_total', 'rlpulse_actor_loss', 2.0)]
    """
    if not any(t.nonfinite for t in runs.values()):
        return None
    family = CounterMetricFamily(
        NONFINITE,
        "Samples producers dropped as NaN or infinite, by the metric they were logged as.",
        labels=["run", "role", "metric"],
    )
    for run, t in sorted(runs.items()):
        for name, count in sorted(t.nonfinite.items()):
            family.add_metric([run, t.nonfinite_roles.get(name, ""), prom(name).name], count)
    return family


def total_families(runs: Mapping[str, Totals]) -> Iterator[Metric]:
    """The families of every run's :class:`Totals` (one family per name, a series per run).

    >>> t = Totals()
    >>> t.add({"serve/requests": 2.0, "serve/latency/bucket/0.01": 2.0,
    ...        "serve/latency/mean": 0.009, "serve/errors/overloaded": 1.0}, {})
    >>> [(s.name, s.labels.get("le"), s.value) for f in total_families({"r": t})
    ...  for s in f.samples if s.labels.get("le") in (None, "0.01", "+Inf")]  # doctest: +NORMALIZE_WHITESPACE
    [('rlpulse_serve_latency_seconds_bucket', '0.01', 2.0),
     ('rlpulse_serve_latency_seconds_bucket', '+Inf', 2.0),
     ('rlpulse_serve_latency_seconds_count', None, 2.0),
     ('rlpulse_serve_latency_seconds_sum', None, 0.018),
     ('rlpulse_serve_errors_total', None, 1.0)]
    """
    for h in M.HISTOGRAMS:
        if not any(h.name in t.counts for t in runs.values()):
            continue
        pm = prom_metric(h.name)
        family = HistogramMetricFamily(
            pm.name, f"{h.summary.help} (rlpulse name: {h.name})", labels=["run", "role"]
        )
        le = ["+Inf" if label == INF else label for label in h.labels]
        for run, t in sorted(runs.items()):
            if h.name in t.counts:
                cumulative = np.cumsum(t.counts[h.name]).tolist()
                family.add_metric(
                    [run, t.roles.get(h.name, "")],
                    list(zip(le, cumulative, strict=True)),
                    t.sums.get(h.name, 0.0) * pm.scale,
                )
        yield family
    if any(t.errors for t in runs.values()):
        errors = CounterMetricFamily(ERRORS.name, ERRORS.help, labels=["run", "role", "kind"])
        for run, t in sorted(runs.items()):
            for kind, value in sorted(t.errors.items()):
                errors.add_metric([run, t.roles.get(ERRORS.name, ""), kind], value)
        yield errors


class ProcessSnapshot:
    """``prometheus_client``'s process metrics (CPU, memory, open files), read from /proc at
    most every ``PROCESS_REFRESH_S``: the reads were a third of a scrape's cost, and a second's
    resolution is finer than any scrape interval needs."""

    def __init__(self) -> None:
        self._inner = ProcessCollector(registry=None)
        self._families: list[Metric] = []
        self._read_at = -math.inf
        self._reads = 0

    def current(self) -> tuple[int, list[Metric]]:
        """The families and how many reads of /proc made them: a new number, new values."""
        now = time.monotonic()
        if now - self._read_at >= PROCESS_REFRESH_S:
            # Replaced whole, the list before the number: a scrape on another thread that
            # sees the new number also sees the new families.
            self._families = list(self._inner.collect())
            self._reads += 1
            self._read_at = now
        return self._reads, self._families

    def collect(self) -> Iterable[Metric]:
        return self.current()[1]


Encoder = Callable[[Any], bytes]
"""An exposition format: renders what a collector's ``collect()`` returns
(``prometheus_client.exposition.choose_encoder`` picks one per request)."""


class Families:
    """A collector of fixed families, so that an encoder renders just those."""

    def __init__(self, families: Sequence[Metric]) -> None:
        self._families = families

    def collect(self) -> Sequence[Metric]:
        return self._families


class TextCache:
    """The text of each part of /metrics in each exposition format, rendered again only when
    the part's key (what its families were built from) changes.

    An encoder renders every family on its own and appends a trailer after the last one
    (OpenMetrics' ``# EOF``; nothing in the text format), so the parts' texts joined, and the
    trailer once, are the bytes the encoder makes of all the families at once. Not thread-safe:
    the caller holds a lock.

    >>> from prometheus_client.exposition import choose_encoder
    >>> encoder, content_type = choose_encoder("application/openmetrics-text; version=1.0.0")
    >>> cache = TextCache()
    >>> part = [make_family("up", "Up.", "gauge", [], [([], 1.0)])]
    >>> body = cache.join(encoder, content_type, [("a", 1, part), ("b", 1, part)])
    >>> body.decode().splitlines()  # doctest: +NORMALIZE_WHITESPACE
    ['# HELP up Up.', '# TYPE up gauge', 'up 1.0',
     '# HELP up Up.', '# TYPE up gauge', 'up 1.0', '# EOF']
    """

    MAX_FORMATS = 8
    """Formats kept (a client picks one with its Accept header); the oldest goes first."""

    def __init__(self) -> None:
        self._formats: dict[str, tuple[bytes, dict[str, tuple[Hashable, bytes]]]] = {}

    def join(
        self,
        encoder: Encoder,
        content_type: str,
        parts: Iterable[tuple[str, Hashable, Sequence[Metric]]],
    ) -> bytes:
        """The body for ``content_type``: each ``(slot, key, families)`` part's text, rendered
        by ``encoder`` unless the slot holds it for an equal key already."""
        cached = self._formats.get(content_type)
        if cached is None:
            while len(self._formats) >= self.MAX_FORMATS:
                del self._formats[next(iter(self._formats))]
            cached = self._formats[content_type] = (encoder(Families([])), {})
        trailer, texts = cached
        out = []
        for slot, key, families in parts:
            held = texts.get(slot)
            if held is None or held[0] != key:
                text = encoder(Families(families))
                held = texts[slot] = (key, text[: len(text) - len(trailer)])
            out.append(held[1])
        out.append(trailer)
        return b"".join(out)


_RUN_FAMILIES = (
    ("rlpulse_run_step", "Latest step emitted for the run."),
    (
        "rlpulse_run_step_timestamp_seconds",
        "Producers' wall-clock end of the run's latest step (Unix time).",
    ),
    ("rlpulse_run_ranks", "Producers whose data is in the run's latest step."),
    ("rlpulse_run_step_partial", "1 when the run's latest step was emitted without every rank."),
)


def run_families_of(runs: Mapping[str, tuple], taken: dict[str, str]) -> Iterator[Metric]:
    """Each run's latest step, its time, ranks and partial flag (``runs``: run -> (step,
    time, ranks, partial, ...)), one gauge family each; their names go into ``taken``."""
    for index, (pname, help_) in enumerate(_RUN_FAMILIES):
        family = GaugeMetricFamily(pname, help_, labels=["run"])
        for run, state in sorted(runs.items()):
            family.add_metric([run], float(state[index]))
        taken[pname] = "rlpulse"
        yield family


class FamiliesCollector:
    """A ``prometheus_client`` collector whose ``collect()`` asks ``families`` at each scrape
    (the sink's, kept between scrapes: read only)."""

    def __init__(self, families: Callable[[], Iterator[Metric]]) -> None:
        self._families = families

    def collect(self) -> Iterable[Metric]:
        return list(self._families())

    def describe(self) -> Iterable[Metric]:
        return []  # names depend on what producers log; nothing to check at registration
