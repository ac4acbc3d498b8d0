"""Counters on /metrics exist before their first increment (issue 17, item 6): every reject
reason at 0 from start-up, and each run's token and sample counters at 0 from its first step,
so that increase() and the malformed-messages alert see the first burst."""

from __future__ import annotations

from rlpulse.collector.health import Health
from rlpulse.collector.output.promnames import prom_metric
from rlpulse.collector.sinks.base import SinkContext
from rlpulse.collector.sinks.prometheus import PrometheusSink
from rlpulse.schemas import metrics as M
from rlpulse.schemas.errors import REJECT_REASONS
from rlpulse.schemas.record import StepRecord
from tests.support.prom import scrape_registry

MALFORMED = "rlpulse_collector_malformed_total"
TOKENS = prom_metric(M.SYSTEM_TOKENS.name).name
SAMPLES = prom_metric(M.SYSTEM_SAMPLES.name).name


def malformed(got: dict[tuple[str, frozenset], float]) -> dict[str, float]:
    return {dict(labels)["reason"]: v for (name, labels), v in got.items() if name == MALFORMED}


def test_every_reject_reason_is_exported_at_zero_before_any_reject() -> None:
    health = Health()
    sink = PrometheusSink.from_kwargs({"port": 0}, SinkContext(health=health.snapshot))
    assert malformed(scrape_registry(sink.registry)) == dict.fromkeys(REJECT_REASONS, 0.0)
    health.reject("bad_version")
    health.reject("bad_version")
    assert malformed(scrape_registry(sink.registry)) == {
        **dict.fromkeys(REJECT_REASONS, 0.0),
        "bad_version": 2.0,
    }
    assert "bad_frames" in REJECT_REASONS


def test_a_run_has_token_and_sample_counters_from_its_first_step() -> None:
    sink = PrometheusSink.from_kwargs({"port": 0}, SinkContext())
    assert not any(
        name in (TOKENS, SAMPLES) for name, _ in scrape_registry(sink.registry)
    )  # no run yet
    sink.write(StepRecord(run="r", step=0, metrics={M.TIME_ROLLOUT.name: 1.0}))
    run = frozenset({("run", "r"), ("role", "")})
    got = scrape_registry(sink.registry)
    assert (got[(TOKENS, run)], got[(SAMPLES, run)]) == (0.0, 0.0)
    metrics = {M.SYSTEM_TOKENS.name: 4096.0, M.SYSTEM_SAMPLES.name: 8.0}
    sink.write(StepRecord(run="r", step=1, metrics=metrics))
    got = scrape_registry(sink.registry)
    assert (got[(TOKENS, run)], got[(SAMPLES, run)]) == (4096.0, 8.0)
