"""rlpulse.producer.engines: a vLLM server's /metrics text read, differenced and merged.

The texts are real: two vLLM servers' scrapes before and after a window of completions
(``data/vllm-scrapes.json.gz``, recorded by ``data/record_vllm_scrapes.py``), checked against
what the completions' responses said and against prometheus_client's own parser; and texts
prometheus_client writes from random metrics (label values with quotes, backslashes, newlines,
commas and braces)."""

from __future__ import annotations

import gzip
import json
import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from rlpulse.producer.engines import ParseError, Reading, Window, difference, merge, parse
from rlpulse.producer.values import Fraction, Weighted
from rlpulse.producer.vllm_stats import COUNTERS, GAUGES, HISTOGRAMS
from rlpulse.schemas import engine as E
from rlpulse.schemas.histogram import bucket_counts
from rlpulse.schemas.metrics import CATALOG

DATA = Path(__file__).with_name("data") / "vllm-scrapes.json.gz"
RECORDED = json.loads(gzip.decompress(DATA.read_bytes()))


def reference(text: str) -> dict[str, float]:
    """prometheus_client's reading of ``text``: each counter's ``_total`` summed over labels,
    each gauge's largest value, each histogram's buckets, count and sum summed over labels."""
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name.endswith("_created"):
                continue
            key = s.name + (f"@{float(s.labels['le'])}" if "le" in s.labels else "")
            if family.type == "gauge":
                out[key] = max(out.get(key, -math.inf), s.value)
            else:
                out[key] = out.get(key, 0.0) + s.value
    return out


def flat(reading: Reading) -> dict[str, float]:
    """``reading`` keyed as :func:`reference` keys it (the names this module reads)."""
    out = {f"{name}_total": v for name, v in reading.counters.items()}
    out.update(reading.gauges)
    for name, h in reading.histograms.items():
        out.update({f"{name}_bucket@{b}": c for b, c in zip(h.bounds, h.cumulative, strict=True)})
        out[f"{name}_bucket@inf"] = out[f"{name}_count"] = h.count
        out[f"{name}_sum"] = h.sum
    return out


@pytest.mark.parametrize("key", ["a", "b"])
@pytest.mark.parametrize("when", ["before", "after"])
def test_a_real_scrape_reads_as_prometheus_client_reads_it(key: str, when: str) -> None:
    text = RECORDED[key][when]
    reading = parse(text)
    ours, theirs = flat(reading), reference(text)
    assert ours and set(ours) <= set(theirs)
    assert {k: theirs[k] for k in ours} == ours
    assert set(reading.counters) == set(COUNTERS)
    assert set(reading.gauges) == set(GAUGES)
    assert set(reading.histograms) == set(HISTOGRAMS)
    assert set(reading.finished) == {"stop", "length", "abort", "error", "repetition"}


@pytest.mark.parametrize("key", ["a", "b"])
def test_a_window_is_what_its_requests_received(key: str) -> None:
    """The change between the real scrapes equals what the responses of the completions sent
    in between said; each histogram counts one sample per request (inter-token latency: one
    per generated token after a request's first)."""
    answered = RECORDED[key]["answered"]
    w = difference(parse(RECORDED[key]["before"]), parse(RECORDED[key]["after"]))
    m = w.metrics()
    assert m[E.ENGINE_GENERATION_TOKENS.name] == answered["completion_tokens"]
    assert m[E.ENGINE_PROMPT_TOKENS.name] == answered["prompt_tokens"]
    assert m[E.ENGINE_REQUESTS.name] == answered["requests"]
    finished = {r: m[E.ENGINE_FINISHED.format(reason=r)] for r in answered["reasons"]}
    assert finished == answered["reasons"]
    assert (
        sum(v for n, v in m.items() if n.startswith("rollout/engine/finished/"))
        == (answered["requests"])
    )
    for histogram in (E.ENGINE_TTFT, E.ENGINE_E2E_LATENCY, E.ENGINE_QUEUE_TIME):
        assert sum(m.get(b, 0) for b in histogram.bucket_names) == answered["requests"]
        assert m[histogram.name].weight == answered["requests"]
    itl = answered["completion_tokens"] - answered["requests"]
    assert sum(m.get(b, 0) for b in E.ENGINE_ITL.bucket_names) == itl
    assert m[E.ENGINE_SERVERS.name] == 1 and not w.rebinned and not w.resets
    assert isinstance(m[E.ENGINE_PREFIX_CACHE_HIT_RATE.name], Fraction)
    for name in m:  # every name is the catalog's
        assert CATALOG.resolve(name).known, name


def test_two_real_servers_merge_exactly() -> None:
    """Counts add, bucket counts add per bucket, the mean pools over both servers' samples,
    gauges take the larger: the merged window is what both servers' requests received."""
    windows = [difference(parse(RECORDED[k]["before"]), parse(RECORDED[k]["after"])) for k in "ab"]
    one, two = (w.metrics() for w in windows)
    both = merge(windows).metrics()
    answered = [RECORDED[k]["answered"] for k in "ab"]
    assert both[E.ENGINE_GENERATION_TOKENS.name] == sum(a["completion_tokens"] for a in answered)
    assert both[E.ENGINE_REQUESTS.name] == sum(a["requests"] for a in answered)
    assert both[E.ENGINE_SERVERS.name] == 2
    for name in set(one) | set(two):
        a, b, merged = one.get(name), two.get(name), both.get(name)
        if isinstance(a, Weighted) or isinstance(b, Weighted):
            parts = [v for v in (a, b) if v is not None]
            assert merged.weight == sum(v.weight for v in parts)
            assert merged.value == pytest.approx(
                sum(v.value * v.weight for v in parts) / merged.weight, rel=1e-12
            )
        elif isinstance(a, Fraction):
            assert merged == Fraction(a.numerator + b.numerator, a.denominator + b.denominator)
        elif name in GAUGES.values():
            assert merged == max(a, b)
        elif name != E.ENGINE_SERVERS.name:
            assert merged == (a or 0) + (b or 0), name


def test_a_restart_counts_from_the_restart() -> None:
    """A counter lower than before: the server restarted, so the window is its later reading
    alone (as Prometheus' rate() reads a reset), and says so."""
    after, before = parse(RECORDED["a"]["before"]), parse(RECORDED["a"]["after"])
    w = difference(before, after)  # backwards: every counter went down
    assert w.resets == 1
    assert w.metrics()[E.ENGINE_GENERATION_TOKENS.name] == after.counters["vllm:generation_tokens"]


def test_vllm_default_buckets_land_on_catalog_bounds_and_custom_ones_are_rebinned() -> None:
    """A vLLM default bucket bound is a catalog bound, so the bucket's count stays in it; a
    custom bound is not, so its count goes to the smallest catalog bucket above (counted)."""
    for family, histogram in HISTOGRAMS.items():
        bounds = parse(RECORDED["a"]["after"]).histograms[family].bounds
        assert set(bounds) <= set(histogram.bounds), family
    text = (
        'vllm:time_to_first_token_seconds_bucket{le="0.0123"} 2.0\n'
        'vllm:time_to_first_token_seconds_bucket{le="+Inf"} 3.0\n'
        "vllm:time_to_first_token_seconds_count 3.0\n"
        "vllm:time_to_first_token_seconds_sum 5.5\n"
    )
    w = difference(Reading(), parse(text))
    assert w.rebinned == {"vllm:time_to_first_token_seconds"}
    m = w.metrics()
    assert m[E.ENGINE_TTFT.buckets.format(le="0.0126")] == 2
    assert m[E.ENGINE_TTFT.buckets.format(le="inf")] == 1
    assert m[E.ENGINE_TTFT.name] == Weighted(5.5 / 3, 3.0)


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ('vllm:generation_tokens_total{engine="0" 4.0', "never closed|unreadable labels"),
        ("vllm:generation_tokens_total", "no value"),
        ("vllm:generation_tokens_total{} abc", "not a number"),
        ('vllm:e2e_request_latency_seconds_bucket{le="x"} 1', "le='x'"),
        ('vllm:e2e_request_latency_seconds_bucket{le="1.0"} 1', "no \\+Inf bucket"),
    ],
)
def test_unreadable_text_is_refused_naming_the_problem(text: str, says: str) -> None:
    with pytest.raises(ParseError, match=says):
        parse(text)


def test_other_families_are_never_read() -> None:
    """A broken line of a family this module does not need costs nothing."""
    reading = parse('http_requests_total{path="/x 7\nvllm:generation_tokens_total 3\n')
    assert reading.counters == {"vllm:generation_tokens": 3.0}


LABEL = st.text(alphabet=st.sampled_from([*list('ab0 "\\\n,{}='), "é"]), min_size=0, max_size=6)
INCREMENTS = st.lists(st.integers(0, 1000), min_size=1, max_size=4)
SAMPLES = st.lists(st.floats(0.0, 5000.0, allow_nan=False), min_size=0, max_size=30)


@settings(max_examples=60, deadline=None)
@given(
    labels=st.lists(LABEL, min_size=1, max_size=3, unique=True),
    increments=INCREMENTS,
    gauges=st.lists(st.floats(0.0, 1.0), min_size=1, max_size=3),
    samples=SAMPLES,
)
def test_prometheus_clients_text_reads_back_exactly(
    labels: list[str], increments: list[int], gauges: list[float], samples: list[float]
) -> None:
    """Whatever prometheus_client (vLLM's exporter) writes, over any number of engines with any
    label values, reads back as its totals: counters summed, gauges' largest, buckets and
    counts summed per bucket."""
    registry = CollectorRegistry()
    names = ["engine", "model_name"]
    tokens = Counter("vllm:generation_tokens", "t", names, registry=registry)
    success = Counter("vllm:request_success", "s", [*names, "finished_reason"], registry=registry)
    kv = Gauge("vllm:kv_cache_usage_perc", "k", names, registry=registry)
    e2e = Histogram(
        "vllm:e2e_request_latency_seconds",
        "e",
        names,
        buckets=E.VLLM_REQUEST_BOUNDS,
        registry=registry,
    )
    for i, label in enumerate(labels):
        for n in increments:
            tokens.labels(label, str(i)).inc(n)
            success.labels(label, str(i), "length" if n % 2 else "stop").inc(1)
        kv.labels(label, str(i)).set(gauges[i % len(gauges)])
        child = e2e.labels(label, str(i))  # vLLM makes every engine's at start
        for x in samples:
            child.observe(x)
    reading = parse(generate_latest(registry).decode())
    k = len(labels)
    assert reading.counters["vllm:generation_tokens"] == k * sum(increments)
    assert reading.counters["vllm:request_success"] == k * len(increments)
    assert sum(reading.finished.values()) == k * len(increments)
    assert reading.gauges["vllm:kv_cache_usage_perc"] == max(gauges[: min(k, len(gauges))])
    h = reading.histograms["vllm:e2e_request_latency_seconds"]
    assert h.count == k * len(samples)
    expected = k * bucket_counts(samples, E.VLLM_REQUEST_BOUNDS)
    assert h.counts().tolist() == expected.tolist()
    # On the catalog's bounds, each sample counts in the catalog bucket whose upper bound is
    # its vLLM bucket's: the same bound, since the catalog holds vLLM's.
    w = difference(Reading(), reading)
    assert not w.rebinned
    catalog = E.ENGINE_E2E_LATENCY.bounds
    expected = np.zeros(len(catalog) + 1)
    for x in samples:
        i = int(np.searchsorted(E.VLLM_REQUEST_BOUNDS, x, side="left"))
        top = E.VLLM_REQUEST_BOUNDS[i] if i < len(E.VLLM_REQUEST_BOUNDS) else math.inf
        expected[catalog.index(top) if math.isfinite(top) else -1] += k
    assert w.buckets["vllm:e2e_request_latency_seconds"].tolist() == expected.tolist()


def test_an_empty_window_logs_the_counters_at_zero() -> None:
    text = RECORDED["a"]["after"]
    m = difference(parse(text), parse(text)).metrics()
    assert m[E.ENGINE_GENERATION_TOKENS.name] == 0 and m[E.ENGINE_REQUESTS.name] == 0
    assert not any("/bucket/" in n for n in m)
    assert E.ENGINE_TTFT.name not in m
    assert isinstance(merge([]), Window) and merge([]).servers == 0
