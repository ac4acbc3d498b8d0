"""schemas.histogram: bucket counts merge exactly, and quantiles read off them are exact to
bucket resolution (the estimate and the true sample quantile share a bucket)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from rlpulse.collector.output.promnames import prom_metric
from rlpulse.schemas import CATALOG, Reduction, engine, metrics as M
from rlpulse.schemas.histogram import (
    BOUNDS,
    INF,
    Histogram,
    bound_label,
    bucket_counts,
    quantile,
    quantile_label,
)

QS = (0.5, 0.9, 0.95, 0.99, 0.999)
samples = st.lists(
    st.floats(min_value=1e-5, max_value=300.0, allow_nan=False), min_size=1, max_size=300
)


def bucket_of(x: float) -> int:
    """Index of the bucket (previous bound, bound] holding x; len(BOUNDS) above the last."""
    for i, b in enumerate(BOUNDS):
        if x <= b:
            return i
    return len(BOUNDS)


def true_quantile(xs: list[float], q: float) -> float:
    """The smallest sample with at least q * n samples at or below it."""
    ordered = sorted(xs)
    return ordered[math.ceil(q * len(ordered)) - 1]


def test_bounds_are_log_spaced_ten_per_decade_from_1ms_to_100s() -> None:
    assert len(BOUNDS) == 51 and BOUNDS[0] == 0.001 and BOUNDS[-1] == 100.0
    assert BOUNDS[10::10] == (0.01, 0.1, 1.0, 10.0, 100.0)
    ratios = np.diff(np.log10(BOUNDS))
    assert np.allclose(ratios, 0.1, atol=0.003)  # 3 significant digits
    labels = [bound_label(b) for b in BOUNDS]
    assert [float(s) for s in labels] == list(BOUNDS)
    assert len(set(labels)) == len(labels)


def test_bucket_counts_follow_le() -> None:
    # a sample equal to a bound is in that bound's bucket, as Prometheus' le says
    counts = bucket_counts([0.001, 0.0010001, 100.0, 100.5, float("inf"), float("nan")])
    assert counts[0] == 1 and counts[1] == 1 and counts[50] == 1 and counts[51] == 1
    assert counts.sum() == 4 and len(counts) == len(BOUNDS) + 1


@settings(max_examples=200, deadline=None)
@given(samples, samples)
def test_counts_merge_exactly(a: list[float], b: list[float]) -> None:
    np.testing.assert_array_equal(bucket_counts(a) + bucket_counts(b), bucket_counts(a + b))


@settings(max_examples=300, deadline=None)
@given(samples, st.sampled_from(QS), st.booleans())
def test_quantile_is_exact_to_bucket_resolution(xs: list[float], q: float, clamp: bool) -> None:
    counts = bucket_counts(xs)
    low, high = (min(xs), max(xs)) if clamp else (None, None)
    estimate = quantile(counts, q, low=low, high=high)
    truth = true_quantile(xs, q)
    assert estimate is not None
    if bucket_of(truth) < len(BOUNDS) or clamp:
        assert bucket_of(estimate) == bucket_of(truth), (estimate, truth)
    else:  # above the last bound, without the max: the last bound, as Prometheus says
        assert estimate == BOUNDS[-1]
    if clamp:
        assert min(xs) <= estimate <= max(xs)


def test_quantile_interpolates_within_the_bucket_as_prometheus_does() -> None:
    bounds = (1.0, 2.0, 4.0)
    counts = [2, 0, 6, 2]  # 10 samples: 2 in (0, 1], 6 in (2, 4], 2 above 4
    assert quantile(counts, 0.1, bounds) == 0.5  # rank 1 of 2 in (0, 1]
    assert quantile(counts, 0.5, bounds) == 3.0  # rank 5: 3 of 6 into (2, 4]
    assert quantile(counts, 0.95, bounds) == 4.0  # in the last bucket: the last bound
    assert quantile(counts, 0.95, bounds, high=6.0) == 5.5  # ... or up to the max when known
    assert quantile([0, 0, 0, 0], 0.5, bounds) is None


def test_quantile_refuses_nonsense() -> None:
    with pytest.raises(ValueError, match="strictly between 0 and 1"):
        quantile([1, 0], 1.0, (1.0,))
    with pytest.raises(ValueError, match="3 bucket counts for 1 bounds"):
        quantile([1, 0, 0], 0.5, (1.0,))


def test_a_declaration_makes_buckets_summary_and_derived_quantiles() -> None:
    h = Histogram("x/latency", "s", "Seconds.", count_unit="calls", quantiles=(0.5, 0.999))
    assert h.labels[-1] == INF and len(h.labels) == len(BOUNDS) + 1
    assert h.buckets.reduction is Reduction.SUM and h.buckets.unit == "calls"
    assert h.buckets.match("x/latency/bucket/0.0126") == {"le": "0.0126"}
    assert h.buckets.match("x/latency/bucket/0.0127") is None  # not a bound: not a bucket
    assert h.summary.reduction is Reduction.MEAN
    assert [e.name for e in h.entries[1:]] == ["x/latency/p50", "x/latency/p99.9"]
    assert all(e.derived and e.unit == "s" for e in h.entries[1:])
    assert quantile_label(0.95) == "p95"
    out = h.observe([0.002, 0.002, float("nan"), 5.0])
    assert out["x/latency/bucket/0.002"] == 2 and out["x/latency/bucket/5.01"] == 1
    np.testing.assert_array_equal(out["x/latency"], [0.002, 0.002, 5.0])
    assert h.observe([]) == {} and h.observe([float("nan")]) == {}


@pytest.mark.parametrize(
    ("kw", "says"),
    [
        ({"bounds": (1.0, 1.0)}, "increase strictly"),
        ({"bounds": (0.0, 1.0)}, "positive finite"),
        ({"bounds": (1.0, 1.0000001)}, "distinct exact short spellings"),
        ({"quantiles": (0.5, 1.0)}, "strictly between 0 and 1"),
    ],
)
def test_bad_declarations_are_refused(kw: dict, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        Histogram("x", "s", "h", count_unit="calls", **kw)


@pytest.mark.parametrize("h", [M.SERVE_LATENCY, *engine.HISTOGRAMS], ids=lambda h: h.name)
def test_the_histograms_are_in_the_catalog(h: Histogram) -> None:
    """The policy server's latency and the rollout engine's four (rlpulse.schemas.engine)."""
    assert (M.SERVE_LATENCY, *engine.HISTOGRAMS) == M.HISTOGRAMS
    assert h.buckets in CATALOG.templates
    for entry in h.entries:
        assert CATALOG.entries[entry.name] is entry
    assert CATALOG.resolve(f"{h.name}/p99").derived
    assert CATALOG.resolve(f"{h.name}/bucket/inf").reduction is Reduction.SUM
    # every bucket has its own Prometheus series (no two bounds sanitize to one name)
    names = {prom_metric(n).name for n in h.bucket_names}
    assert len(names) == len(h.bucket_names)
