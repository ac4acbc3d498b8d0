"""NaN and infinities a producer dropped are on /metrics (``rlpulse_nonfinite_samples_total``),
as they are in the producer's stats() and the jsonl record: a producer's encoder logs them,
the aggregator merges the step, the sink serves it, and a real HTTP scrape reads the count."""

from __future__ import annotations

import math
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from rlpulse.collector.config import CollectorConfig
from rlpulse.collector.output.promnames import NONFINITE, prom_metric
from rlpulse.collector.runs.aggregator import Aggregator
from rlpulse.collector.sinks.base import SinkContext
from rlpulse.collector.sinks.prometheus import PrometheusSink
from rlpulse.producer.encode import Encoder
from rlpulse.producer.stats import Counters
from rlpulse.schemas import CATALOG, protocol as P
from rlpulse.schemas.record import StepRecord

PID = 0x51


def _step_records(payloads: list[dict]) -> list[StepRecord]:
    """Each payload logged at its step by one producer, as its encoder sends it."""
    encoder = Encoder(CATALOG, {}, Counters(), lambda key, msg: None)
    entries = [encoder.entry(step, 1.0 + step, p) for step, p in enumerate(payloads)]
    records: list[StepRecord] = []
    agg = Aggregator(records.append, CollectorConfig(grace_s=30.0, settle_s=0.0))
    hello = P.encode_hello(
        PID, 0, run="r", role="actor_train", rank=0, world_size=1, tables=encoder.tables
    )
    agg.handle(P.decode(hello), 0.0)
    agg.handle(P.decode(P.encode_metrics(PID, 1, entries, done=len(payloads) - 1)), 0.0)
    agg.poll(0.0)
    return records


def _scrape(sink: PrometheusSink) -> dict[tuple[str, frozenset], float]:
    host, port = sink.address
    with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_nan_and_inf_are_counted_on_a_real_scrape() -> None:
    records = _step_records(
        [
            {"actor/loss": math.nan, "actor/entropy": 1.0},
            {"actor/loss": math.inf, "actor/entropy": -math.inf},
            {"actor/loss": 0.5, "actor/entropy": 1.5},
        ]
    )
    assert [r.step for r in records] == [0, 1, 2]
    assert records[0].nonfinite == {"actor/loss": 1}  # the jsonl record's count
    sink = PrometheusSink.from_kwargs({"host": "127.0.0.1", "port": 0}, SinkContext())
    sink.open()
    try:
        for record in records:
            sink.write(record)
        got = {
            dict(labels)["metric"]: (value, dict(labels)["run"])
            for (name, labels), value in _scrape(sink).items()
            if name == NONFINITE
        }
    finally:
        sink.close()
    loss, entropy = (prom_metric(n).name for n in ("actor/loss", "actor/entropy"))
    assert got == {loss: (2.0, "r"), entropy: (1.0, "r")}  # summed over the steps


def test_no_family_before_a_nonfinite_sample() -> None:
    sink = PrometheusSink.from_kwargs({"host": "127.0.0.1", "port": 0}, SinkContext())
    sink.open()
    try:
        sink.write(StepRecord(run="r", step=0, metrics={"actor/loss": 1.0}))
        assert not any(name == NONFINITE for name, _ in _scrape(sink))
    finally:
        sink.close()
