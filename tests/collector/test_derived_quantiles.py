"""collector.derived: histogram quantiles from a step's merged bucket counts, and the serving
totals (Prometheus counters) across steps, including after a restart."""

from __future__ import annotations

import math

import numpy as np

from rlpulse.collector.output.derived import Throughput, histogram_quantiles
from rlpulse.schemas import metrics as M, serving as S
from rlpulse.schemas.histogram import BOUNDS, bucket_counts, quantile
from rlpulse.schemas.reductions import Stat

P99 = M.SERVE_LATENCY_P99.name
SUMMARY = M.SERVE_LATENCY_SUMMARY.output_names()


def merged(*replicas: list[float]) -> dict[str, float]:
    """A step as the collector merges it: each replica's bucket counts summed (SUM), the
    summary's min and max pooled; what each replica logs comes from Histogram.observe."""
    out: dict[str, float] = {}
    for latencies in replicas:
        for name, value in M.SERVE_LATENCY.observe(latencies).items():
            if name == M.SERVE_LATENCY.name:
                xs = np.asarray(value)
                lo, hi = out.get(SUMMARY[Stat.MIN], math.inf), out.get(SUMMARY[Stat.MAX], -math.inf)
                out[SUMMARY[Stat.MIN]], out[SUMMARY[Stat.MAX]] = (
                    min(lo, xs.min()),
                    max(hi, xs.max()),
                )
            else:
                out[name] = out.get(name, 0.0) + float(value)  # type: ignore[arg-type]
    return out


def test_quantiles_of_merged_replicas_are_those_of_the_pooled_samples() -> None:
    rng = np.random.default_rng(0)
    a = rng.lognormal(np.log(0.02), 0.3, 500).tolist()  # a fast replica
    b = rng.lognormal(np.log(0.2), 0.5, 50).tolist()  # a slow one, with fewer requests
    step = merged(a, b)
    out = histogram_quantiles(M.SERVE_LATENCY, step)
    pooled = sorted(a + b)
    counts = bucket_counts(pooled)
    for q, entry in M.SERVE_LATENCY.quantile_entries.items():
        expected = quantile(counts, q, low=pooled[0], high=pooled[-1])
        assert out[entry.name] == expected
        truth = pooled[math.ceil(q * len(pooled)) - 1]
        # exact to bucket resolution: the same bucket as the true sample quantile
        assert np.searchsorted(BOUNDS, out[entry.name]) == np.searchsorted(BOUNDS, truth)
    # a mean of the replicas' p99s would be nowhere near: the slow replica is 8% of requests
    assert out[P99] > 0.1


def test_throughput_derive_adds_quantiles_and_serving_totals() -> None:
    t = Throughput(window=1)
    s0 = {
        S.SERVE_REQUESTS.name: 3.0,
        S.SERVE_ERRORS.format(kind=S.OVERLOADED): 1.0,
        S.SERVE_ERRORS.format(kind=S.EMPTY_PROMPT): 1.0,
        S.SERVE_TOKENS_GENERATED.name: 7.0,
        **merged([0.01, 0.02, 0.03]),
    }
    t.derive(1.0, s0)
    s1 = {
        S.SERVE_REQUESTS.name: 0.0,
        S.SERVE_ERRORS.format(kind=S.OVERLOADED): 0.0,
        S.SERVE_TOKENS_GENERATED.name: 0.0,
    }
    t.derive(2.0, s1)
    assert s0[S.SERVE_REQUESTS_TOTAL.name] == 3.0 and s0[S.SERVE_ERRORS_TOTAL.name] == 2.0
    assert s0[S.SERVE_TOKENS_GENERATED_TOTAL.name] == 7.0
    assert 0.01 <= s0[M.SERVE_LATENCY_P50.name] <= s0[P99] <= 0.03
    # an idle window: totals carry on, no quantile without a sample
    assert s1[S.SERVE_REQUESTS_TOTAL.name] == 3.0 and s1[S.SERVE_ERRORS_TOTAL.name] == 2.0
    assert P99 not in s1
    # after a restart the totals continue from the last emitted step
    again = Throughput(window=1)
    again.resume(2.0, s1)
    s2 = {S.SERVE_REQUESTS.name: 2.0, S.SERVE_ERRORS.format(kind=S.INTERNAL): 1.0}
    again.derive(3.0, s2)
    assert s2[S.SERVE_REQUESTS_TOTAL.name] == 5.0 and s2[S.SERVE_ERRORS_TOTAL.name] == 3.0


def test_a_training_step_gets_no_serving_metrics() -> None:
    step = {M.SYSTEM_STEP_TOKENS.name: 100.0}
    Throughput(window=1).derive(1.0, step)
    assert not [name for name in step if name.startswith("serve/")]
