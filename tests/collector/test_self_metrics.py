"""Every counter the collector keeps about itself is declared once, with its exported name, and
shows on /metrics (``derived_logged`` and ``world_size_conflict`` were once counted and never
exported)."""

from __future__ import annotations

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from rlpulse.collector.health import Health, exported
from rlpulse.collector.sinks.base import SinkContext
from rlpulse.collector.sinks.prometheus import PrometheusSink


def test_every_counter_of_health_is_declared() -> None:
    health = Health()
    counted = {k for k, v in vars(health).items() if isinstance(v, int) and not isinstance(v, bool)}
    declared = {m.key for m in Health.declared()}
    assert counted == declared
    assert {"derived_logged", "world_size_conflict", "unapplied"} <= declared


def test_every_self_metric_is_on_the_prometheus_page() -> None:
    health = Health(
        sinks=lambda: {
            "jsonl": {"queue_depth": 0, "written": 3, "errors": 0, "dropped": 0, "lag_seconds": 0.0}
        }
    )
    for n, metric in enumerate(Health.declared(), start=1):
        setattr(health, metric.key, n)  # a distinct value each, to see it arrive unchanged
    sink = PrometheusSink(SinkContext(health=health.snapshot), port=0)
    text = generate_latest(sink.registry).decode()
    samples = {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}
    families = {f.name: f for f in text_string_to_metric_families(text)}
    for metric in exported():
        family = metric.name.removesuffix("_total") if metric.kind == "counter" else metric.name
        assert family in families, metric.name
        assert families[family].documentation == metric.help
    for n, metric in enumerate(Health.declared(), start=1):
        assert samples[metric.name] == n, metric.name
