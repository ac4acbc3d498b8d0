"""The policy server's latency and errors on /metrics: a real Prometheus histogram and counters,
summed over every reporting window the sink was given (issue 26.1).

Each record is what the collector emits for one 1 s window of the server: the window's bucket
counts, the pooled mean/max/min of its latencies, its requests and its errors by kind (every
kind, zeros included). A 15 s scrape sees many windows; it must see their sum, not the last
window's buckets mixed with older ones.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from rlpulse.collector.sinks.base import SinkContext
from rlpulse.collector.sinks.prometheus import PrometheusSink
from rlpulse.schemas import serving as S
from rlpulse.schemas.histogram import BOUNDS, bucket_counts
from rlpulse.schemas.record import StepRecord
from rlpulse.schemas.reductions import Stat
from tests.support.prom import scrape_registry

HIST = "rlpulse_serve_latency_seconds"


def window(step: int, latencies: list[float], errors: dict[str, int] | None = None) -> StepRecord:
    """The collector's record of one reporting window of the server."""
    metrics: dict[str, float] = {S.SERVE_REQUESTS.name: float(len(latencies))}
    for kind in S.ERROR_KINDS:
        metrics[S.SERVE_ERRORS.format(kind=kind)] = float((errors or {}).get(kind, 0))
    for name, value in S.SERVE_LATENCY.observe(latencies).items():
        if isinstance(value, np.ndarray):
            out = S.SERVE_LATENCY_SUMMARY.output_names()
            metrics[out[Stat.MEAN]] = float(value.mean())
            metrics[out[Stat.MAX]] = float(value.max())
            metrics[out[Stat.MIN]] = float(value.min())
        else:
            metrics[name] = float(value)
    return StepRecord(run="srv", step=step, metrics=metrics, roles=dict.fromkeys(metrics, "serve"))


def buckets(got: dict[tuple[str, frozenset], float]) -> dict[str, float]:
    return {dict(labels)["le"]: v for (name, labels), v in got.items() if name == f"{HIST}_bucket"}


LABELS = frozenset({("run", "srv"), ("role", "serve")})


@pytest.fixture
def sink() -> Iterator[PrometheusSink]:
    sink = PrometheusSink.from_kwargs({"port": 0}, SinkContext())
    yield sink
    sink.close()


def test_latency_is_a_cumulative_histogram_over_every_window(sink: PrometheusSink) -> None:
    windows = [[0.010, 0.011, 0.2], [0.5, 0.012], []]  # traffic, traffic, then none
    for step, latencies in enumerate(windows):
        sink.write(window(step, latencies))
    got = scrape_registry(sink.registry)
    every = [x for w in windows for x in w]
    counts = np.cumsum(bucket_counts(every))
    le = [*(f"{b:g}" for b in BOUNDS), "+Inf"]
    assert buckets(got) == {label: float(c) for label, c in zip(le, counts, strict=True)}
    assert got[(f"{HIST}_count", LABELS)] == 5
    assert got[(f"{HIST}_sum", LABELS)] == pytest.approx(sum(every))
    assert buckets(got)["0.0126"] == 3  # 0.010, 0.011 (window 0) and 0.012 (window 1)
    # no per-window bucket gauges or quantiles of the last busy window left behind
    stale = [n for n, _ in got if n.startswith(("rlpulse_serve_latency_bucket", f"{HIST[:-8]}_p"))]
    assert stale == []


def test_an_idle_server_exports_its_histogram_at_zero_from_the_first_window(
    sink: PrometheusSink,
) -> None:
    sink.write(window(0, []))
    got = scrape_registry(sink.registry)
    assert set(buckets(got).values()) == {0.0} and len(buckets(got)) == len(BOUNDS) + 1
    assert got[(f"{HIST}_count", LABELS)] == 0


def test_errors_are_counters_by_kind_summed_over_windows(sink: PrometheusSink) -> None:
    sink.write(window(0, [0.01] * 3, {S.OVERLOADED: 2, S.EMPTY_PROMPT: 1}))
    sink.write(window(1, [0.01], {S.OVERLOADED: 1}))
    sink.write(window(2, []))  # a window without errors does not reset them
    got = scrape_registry(sink.registry)
    errors = {
        dict(labels)["kind"]: v
        for (name, labels), v in got.items()
        if name == "rlpulse_serve_errors_total"
    }
    assert errors == {**dict.fromkeys(S.ERROR_KINDS, 0.0), S.OVERLOADED: 3.0, S.EMPTY_PROMPT: 1.0}
    # no gauge of the last window's errors per kind (rlpulse_serve_errors_overloaded...)
    assert [n for n, _ in got if n.startswith("rlpulse_serve_errors_") and "total" not in n] == []


def test_text_exposition_declares_a_histogram_and_a_counter(sink: PrometheusSink) -> None:
    sink.write(window(0, [0.01], {S.INTERNAL: 1}))
    sink.write(StepRecord(run="other", step=0, metrics={S.SERVE_REQUESTS.name: 0.0}))
    text = generate_latest(sink.registry).decode()
    assert f"# TYPE {HIST} histogram" in text
    assert "# TYPE rlpulse_serve_errors_total counter" in text
    assert text.count(f"# TYPE {HIST} ") == 1  # one family, a series per run
    families = {f.name: f for f in text_string_to_metric_families(text)}
    runs = {s.labels["run"] for s in families[HIST].samples}
    assert runs == {"srv", "other"}
