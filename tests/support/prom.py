"""Reading a Prometheus text exposition: every sample by name and labels."""

from __future__ import annotations

import urllib.request

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

Samples = dict[tuple[str, frozenset], float]
"""``(name, frozenset of (label, value))`` -> value."""


def samples(text: str) -> Samples:
    """Every sample of an exposition text, keyed by its name and labels."""
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def scrape_url(url: str) -> Samples:
    """:func:`samples` of what ``url`` serves."""
    with urllib.request.urlopen(url, timeout=10) as response:
        return samples(response.read().decode())


def scrape(port: int) -> dict[str, float]:
    """Every sample on ``127.0.0.1:port/metrics``: unlabelled ones by name, others as
    ``name{k=v,...}`` (labels sorted)."""
    url = f"http://127.0.0.1:{port}/metrics"
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()))
            out[f"{s.name}{{{labels}}}" if labels else s.name] = s.value
    return out


def scrape_registry(registry: CollectorRegistry) -> Samples:
    """:func:`samples` of what ``registry`` exposes (no HTTP)."""
    return samples(generate_latest(registry).decode())
