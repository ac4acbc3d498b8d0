"""A vLLM server's own metrics over a window of time, from its Prometheus ``/metrics`` text:
the parsing, the difference between two scrapes and the merge across servers.

* :func:`parse` reads one scrape (the Prometheus text format, version 0.0.4, as vLLM's
  ``prometheus_client`` writes it; OpenMetrics text reads too) into a :class:`Reading`: the
  counters vLLM's in-process path reads (``rlpulse.producer.vllm_stats.COUNTERS``) summed over
  their labels, ``vllm:request_success`` by ``finished_reason``, the gauges
  (``engine_stats.GAUGES``, the largest over a server's engines) and the histograms
  (``engine_stats.HISTOGRAMS``: cumulative bucket counts, sum and count, summed over labels).
* :func:`difference` of the readings at a window's two ends is a :class:`Window`: each
  counter's change, each histogram's change per bucket (laid onto the catalog histogram's
  bounds, which hold vLLM's default ones: ``rlpulse.schemas.engine``), and the gauges' largest
  value of the readings taken in between (:meth:`Window.peak`).
* :func:`merge` adds windows of several servers exactly (counts add, bucket counts add per
  bucket, gauges take the maximum), and :meth:`Window.metrics` spells the result under the same
  catalog names the in-process path logs (``rollout/engine/...``).

A counter that went down between two scrapes means the server restarted: the window then
counts from the restart (its later reading alone, as Prometheus' ``rate()`` does) and says so
(:attr:`Window.resets`). A server bucket bound that is no catalog bound (a server started with
custom buckets) lands in the smallest catalog bucket above it (:attr:`Window.rebinned`): counts
stay exact, quantiles coarser.

>>> text = '''# TYPE vllm:generation_tokens counter
... vllm:generation_tokens_total{engine="0"} 40.0
... vllm:num_requests_running{engine="0"} 3.0
... '''
>>> before = parse(text)
>>> after = parse(text.replace("40.0", "52.0"))
>>> w = difference(before, after)
>>> w.metrics()["rollout/engine/generation_tokens"], w.metrics()["rollout/engine/requests_running"]
(12, 3.0)
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rlpulse.producer.values import Fraction, Weighted
from rlpulse.producer.vllm_stats import COUNTERS, FINISHED_REASON, GAUGES, HISTOGRAMS
from rlpulse.schemas import engine as E
from rlpulse.schemas.histogram import Histogram

SUCCESS = "vllm:request_success"
"""The counter of finished requests (in ``COUNTERS``), labelled by ``finished_reason``."""
_REASON = re.compile(r"[A-Za-z0-9_.\-]+")
"""A finish reason that can be one segment of a catalog name."""
_SUFFIXES = ("_total", "_bucket", "_count", "_sum")


class ParseError(ValueError):
    """A ``/metrics`` text this module cannot read: the line number and what is wrong."""


@dataclass(frozen=True)
class Buckets:
    """One histogram of one scrape: cumulative counts at each finite bound (increasing), the
    count of every sample (the ``+Inf`` bucket), and the samples' sum."""

    bounds: tuple[float, ...]
    cumulative: tuple[float, ...]
    count: float
    sum: float

    def counts(self) -> np.ndarray:
        """Samples per bucket: one per bound, then those above the last."""
        cumulative = np.asarray((*self.cumulative, self.count), dtype=np.float64)
        return np.diff(cumulative, prepend=0.0)


@dataclass(frozen=True)
class Reading:
    """What one scrape of one server says (see :func:`parse`)."""

    counters: Mapping[str, float] = field(default_factory=dict)
    finished: Mapping[str, float] = field(default_factory=dict)
    gauges: Mapping[str, float] = field(default_factory=dict)
    histograms: Mapping[str, Buckets] = field(default_factory=dict)

    @property
    def empty(self) -> bool:
        """Nothing of vLLM's (a server started with ``--disable-log-stats``, or no vLLM)."""
        return not (self.counters or self.gauges or self.histograms)


def parse(text: str) -> Reading:
    """The vLLM metrics of one ``/metrics`` scrape; :class:`ParseError` names the first line
    it cannot read among those it needs (other families' lines are skipped unread)."""
    counters: dict[str, float] = {}
    finished: dict[str, float] = {}
    gauges: dict[str, float] = {}
    buckets: dict[str, dict[float, float]] = {}
    totals: dict[str, dict[str, float]] = {}
    for number, name, labels, value in _samples(text):
        family, suffix = _family(name)
        if family in COUNTERS and suffix in ("_total", ""):
            counters[family] = counters.get(family, 0.0) + value
            if family == SUCCESS:
                reason = labels.get(FINISHED_REASON, "")
                finished[reason] = finished.get(reason, 0.0) + value
        elif name in GAUGES:
            gauges[name] = max(gauges.get(name, -math.inf), value)
        elif family in HISTOGRAMS and suffix == "_bucket":
            le = labels.get("le")
            try:
                bound = float(le) if le is not None else math.nan
            except ValueError:
                bound = math.nan
            if math.isnan(bound):
                raise ParseError(f"line {number}: a bucket of {family} with le={le!r}")
            at = buckets.setdefault(family, {})
            at[bound] = at.get(bound, 0.0) + value
        elif family in HISTOGRAMS and suffix in ("_count", "_sum"):
            total = totals.setdefault(family, {})
            total[suffix] = total.get(suffix, 0.0) + value
    histograms = {}
    for family, per in buckets.items():
        bounds = tuple(sorted(b for b in per if math.isfinite(b)))
        count = per.get(math.inf, totals.get(family, {}).get("_count", math.nan))
        if math.isnan(count):
            raise ParseError(f"{family} has buckets but no +Inf bucket and no _count")
        histograms[family] = Buckets(
            bounds,
            tuple(per[b] for b in bounds),
            count,
            totals.get(family, {}).get("_sum", 0.0),
        )
    return Reading(counters, finished, gauges, histograms)


def _family(name: str) -> tuple[str, str]:
    for suffix in _SUFFIXES:
        if name.endswith(suffix):
            return name[: -len(suffix)], suffix
    return name, ""


_WANTED = (*COUNTERS, *GAUGES, *HISTOGRAMS)


def _samples(text: str) -> Iterator[tuple[int, str, dict[str, str], float]]:
    """``(line number, name, labels, value)`` of every sample line of a wanted family."""
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#") or not line.startswith(_WANTED):
            continue
        brace = line.find("{")
        space = line.find(" ")
        if brace != -1 and (space == -1 or brace < space):
            name = line[:brace]
            labels, rest = _labels(line, brace + 1, number)
        else:
            if space == -1:
                raise ParseError(f"line {number}: a sample with no value: {line[:120]!r}")
            name, labels, rest = line[:space], {}, line[space:]
        fields = rest.split()
        if not fields:
            raise ParseError(f"line {number}: a sample with no value: {line[:120]!r}")
        try:
            value = float(fields[0])
        except ValueError:
            raise ParseError(f"line {number}: {fields[0][:40]!r} is not a number") from None
        yield number, name, labels, value


def _labels(line: str, at: int, number: int) -> tuple[dict[str, str], str]:
    """The labels of ``line`` from just after its ``{``, and the text after the ``}``."""
    labels: dict[str, str] = {}
    n = len(line)
    while True:
        while at < n and line[at] in " ,":
            at += 1
        if at < n and line[at] == "}":
            return labels, line[at + 1 :]
        eq = line.find("=", at)
        if eq == -1 or eq + 1 >= n or line[eq + 1] != '"':
            raise ParseError(f"line {number}: unreadable labels: {line[:120]!r}")
        key = line[at:eq].strip()
        value: list[str] = []
        at = eq + 2
        while True:
            if at >= n:
                raise ParseError(f"line {number}: a label value never closed: {line[:120]!r}")
            c = line[at]
            if c == "\\" and at + 1 < n:
                nxt = line[at + 1]
                value.append("\n" if nxt == "n" else nxt)
                at += 2
            elif c == '"':
                at += 1
                break
            else:
                value.append(c)
                at += 1
        labels[key] = "".join(value)


@dataclass
class Window:
    """One server's (or, merged, several servers') change over a window, in the catalog's
    terms: counter changes by vLLM name, finished requests by reason, gauge maxima, and per
    catalog histogram its bucket counts (on the catalog's bounds), sum and count."""

    counters: dict[str, float] = field(default_factory=dict)
    finished: dict[str, float] = field(default_factory=dict)
    gauges: dict[str, float] = field(default_factory=dict)
    buckets: dict[str, np.ndarray] = field(default_factory=dict)
    sums: dict[str, float] = field(default_factory=dict)
    servers: int = 1
    resets: int = 0
    """Servers that restarted inside the window (counted from the restart)."""
    rebinned: set[str] = field(default_factory=set)
    """vLLM histograms with a bound that is no catalog bound (see the module docstring)."""

    def peak(self, reading: Reading) -> None:
        """Fold in the gauges of a reading taken inside the window: each keeps its largest."""
        for name, value in reading.gauges.items():
            if math.isfinite(value):
                self.gauges[name] = max(self.gauges.get(name, -math.inf), value)

    def metrics(self) -> dict[str, Any]:
        """``{catalog name: producer value}``: the names ``rlpulse.producer.vllm_stats``'s
        in-process path logs, plus the requests by finish reason and the servers counted."""
        out: dict[str, Any] = {
            entry: round(self.counters.get(counter, 0.0)) for counter, entry in COUNTERS.items()
        }
        queries = out[E.ENGINE_PREFIX_CACHE_QUERIES.name]
        if queries:
            out[E.ENGINE_PREFIX_CACHE_HIT_RATE.name] = Fraction(
                out[E.ENGINE_PREFIX_CACHE_HITS.name], queries
            )
        for reason, count in sorted(self.finished.items()):
            if _REASON.fullmatch(reason):
                out[E.ENGINE_FINISHED.format(reason=reason)] = round(count)
        for gauge, entry in GAUGES.items():
            if gauge in self.gauges:
                out[entry] = self.gauges[gauge]
        for family, counts in self.buckets.items():
            histogram = HISTOGRAMS[family]
            total = float(counts.sum())
            if not total > 0:
                continue
            out.update({histogram.bucket_names[i]: int(counts[i]) for i in np.flatnonzero(counts)})
            out[histogram.name] = Weighted(self.sums.get(family, 0.0) / total, total)
        out[E.ENGINE_SERVERS.name] = self.servers
        return out


def difference(before: Reading, after: Reading) -> Window:
    """What one server did between two of its readings (``after`` the later)."""
    restarted = _restarted(before, after)
    if restarted:  # count from the restart: the later reading alone
        before = Reading(gauges=before.gauges)
    window = Window(
        counters={n: v - before.counters.get(n, 0.0) for n, v in after.counters.items()},
        finished={r: v - before.finished.get(r, 0.0) for r, v in after.finished.items()},
        resets=int(restarted),
    )
    window.peak(before)
    window.peak(after)
    for family, now in after.histograms.items():
        then = before.histograms.get(family)
        change = now.counts() if then is None else now.counts() - then.counts()
        total = now.sum if then is None else now.sum - then.sum
        window.buckets[family] = _onto(HISTOGRAMS[family], now.bounds, change, family, window)
        window.sums[family] = total
    return window


def _restarted(before: Reading, after: Reading) -> bool:
    """Whether a counter went down, or a histogram lost samples or changed its buckets: the
    server restarted between the two readings."""
    if any(after.counters.get(n, 0.0) < v for n, v in before.counters.items()):
        return True
    if any(after.finished.get(r, 0.0) < v for r, v in before.finished.items()):
        return True
    for family, then in before.histograms.items():
        now = after.histograms.get(family)
        if now is None or now.bounds != then.bounds or now.count < then.count:
            return True
    return False


def _onto(
    histogram: Histogram, bounds: tuple[float, ...], counts: np.ndarray, family: str, w: Window
) -> np.ndarray:
    """``counts`` per bucket of ``bounds`` (and one above them), as counts per bucket of the
    catalog ``histogram``: each server bucket lands in the catalog bucket of its upper bound,
    or of the smallest catalog bound above it."""
    catalog = np.asarray(histogram.bounds, dtype=np.float64)
    index = np.searchsorted(catalog, np.asarray(bounds, dtype=np.float64), side="left")
    exact = index < len(catalog)
    exact[exact] = catalog[index[exact]] == np.asarray(bounds)[exact]
    if not exact.all():
        w.rebinned.add(family)
    out = np.zeros(len(histogram.bucket_names), dtype=np.float64)
    np.add.at(out, np.append(index, len(catalog)), counts)
    return out


def merge(windows: Iterable[Window]) -> Window:
    """Several servers' windows as one: counts and bucket counts add, gauges take the
    maximum (the fullest server is the one that preempts), as the catalog merges ranks."""
    out = Window(servers=0)
    for w in windows:
        out.servers += w.servers
        out.resets += w.resets
        out.rebinned |= w.rebinned
        for source, target in ((w.counters, out.counters), (w.finished, out.finished)):
            for name, value in source.items():
                target[name] = target.get(name, 0.0) + value
        for name, value in w.gauges.items():
            out.gauges[name] = max(out.gauges.get(name, -math.inf), value)
        for family, counts in w.buckets.items():
            have = out.buckets.get(family)
            out.buckets[family] = counts.copy() if have is None else have + counts
            out.sums[family] = out.sums.get(family, 0.0) + w.sums.get(family, 0.0)
    return out
