"""The Prometheus sink on its own: what /metrics renders after each step, health, TLS.

The scrape by a real Prometheus server is in tests/integration/test_prometheus_server.py.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import shutil
import ssl
import subprocess
import urllib.request
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from rlpulse.collector.output.discovery import ScrapeTarget
from rlpulse.collector.output.promnames import prom_metric
from rlpulse.collector.sinks.base import SinkContext
from rlpulse.collector.sinks.prometheus import PrometheusSink
from rlpulse.collector.sinks.promexport import REPLACED
from rlpulse.schemas.errors import ConfigError
from rlpulse.schemas.record import StepRecord
from tests.collector.sinks.conftest import samples_record
from tests.support.prom import scrape_registry

HEALTH = {
    "messages_received": 12,
    "events_received": 340,
    "malformed": {"bad_version": 2, "undecodable": 1},
    "late": 3,
    "partial_steps": 1,
    "steps_emitted": 9,
    "producers": 4,
    "producer_dropped": 5,
    "sinks": {
        "jsonl": {"queue_depth": 0, "written": 9, "errors": 0, "dropped": 0, "lag_seconds": 0.0},
        "wandb": {"queue_depth": 2, "written": 7, "errors": 3, "dropped": 1, "lag_seconds": 4.5},
    },
}


@pytest.fixture
def sink() -> Iterator[PrometheusSink]:
    sink = PrometheusSink.from_kwargs({"port": 0}, SinkContext(health=lambda: HEALTH))
    yield sink
    sink.close()


def test_latest_values_with_run_and_role_labels_in_base_units(
    sink: PrometheusSink, records: list[StepRecord]
) -> None:
    for record in records:
        sink.write(record)
    got = scrape_registry(sink.registry)
    last = records[-1]
    for name, value in last.metrics.items():
        if name in REPLACED:  # cumulative histograms and counters: test_prometheus_serving.py
            continue
        pm = prom_metric(name)
        labels = frozenset(
            {"run": "r1", "role": last.roles.get(name, ""), **dict(pm.labels)}.items()
        )
        assert got[(pm.name, labels)] == value * pm.scale, name
    assert got[("rlpulse_run_step", frozenset({("run", "r1")}))] == 2
    assert got[("rlpulse_run_ranks", frozenset({("run", "r1")}))] == 2
    assert got[("rlpulse_run_step_timestamp_seconds", frozenset({("run", "r1")}))] == last.time


def test_a_metric_missing_from_a_step_keeps_its_last_value(sink: PrometheusSink) -> None:
    sink.write(StepRecord(run="r", step=0, metrics={"time/rollout": 1.5, "val/score/mean": 0.7}))
    sink.write(StepRecord(run="r", step=1, metrics={"time/rollout": 2.5}, partial=True))
    got = scrape_registry(sink.registry)
    run = frozenset({("run", "r"), ("role", "")})
    assert got[("rlpulse_time_rollout_seconds", run)] == 2.5
    assert got[("rlpulse_val_score_mean", run)] == 0.7
    assert got[("rlpulse_run_step_partial", frozenset({("run", "r")}))] == 1


def test_samples_only_count_rows_and_add_no_family() -> None:
    with_samples = samples_record()
    without = dataclasses.replace(with_samples, samples={})
    scraped = []
    for record in (without, with_samples):
        sink = PrometheusSink.from_kwargs({"port": 0}, SinkContext(health=lambda: HEALTH))
        sink.write(record)
        scraped.append(scrape_registry(sink.registry))
        sink.close()
    # The rows themselves add no family, label or sample (the process's own gauges move).
    assert scraped[1].keys() == scraped[0].keys()
    ours = [{k: v for k, v in got.items() if k[0].startswith("rlpulse_")} for got in scraped]
    assert ours[1] == ours[0]
    rows = {n: s.rows for n, s in with_samples.samples.items()}
    assert rows == {"rollout/samples": 4, "val/samples": 1}
    for name, role in (("rollout/samples", "actor_train"), ("val/samples", "val")):
        labels = frozenset({("run", "r1"), ("role", role)})
        assert scraped[1][(prom_metric(name).name, labels)] == rows[name]


def test_collector_health_is_rendered(sink: PrometheusSink) -> None:
    got = scrape_registry(sink.registry)
    plain = {name: value for (name, labels), value in got.items() if not labels}
    assert plain["rlpulse_collector_messages_received_total"] == 12
    assert plain["rlpulse_collector_events_received_total"] == 340
    assert plain["rlpulse_collector_late_entries_total"] == 3
    assert plain["rlpulse_collector_partial_steps_total"] == 1
    assert plain["rlpulse_collector_steps_emitted_total"] == 9
    assert plain["rlpulse_collector_producers"] == 4
    assert plain["rlpulse_collector_producer_dropped_total"] == 5
    reason = frozenset({("reason", "bad_version")})
    assert got[("rlpulse_collector_malformed_total", reason)] == 2
    wandb = frozenset({("sink", "wandb")})
    assert got[("rlpulse_sink_queue_depth", wandb)] == 2
    assert got[("rlpulse_sink_written_total", wandb)] == 7
    assert got[("rlpulse_sink_errors_total", wandb)] == 3
    assert got[("rlpulse_sink_dropped_total", wandb)] == 1
    assert got[("rlpulse_sink_lag_seconds", wandb)] == 4.5


@pytest.mark.parametrize(
    "health",
    [{}, {"messages_received": "n/a", "sinks": {"x": None}, "malformed": [1]}, None],
)
def test_partial_or_broken_health_never_breaks_a_scrape(
    health: Mapping[str, Any] | None, caplog: pytest.LogCaptureFixture
) -> None:
    def snapshot() -> Mapping[str, Any]:
        if health is None:
            raise RuntimeError("health is broken")
        return health

    sink = PrometheusSink.from_kwargs({"port": 0}, SinkContext(health=snapshot))
    sink.write(StepRecord(run="r", step=0, metrics={"time/adv": 0.25}))
    for _ in range(2):
        got = scrape_registry(sink.registry)
    assert got[("rlpulse_time_adv_seconds", frozenset({("run", "r"), ("role", "")}))] == 0.25
    assert not any(name.startswith("rlpulse_collector_messages") for name, _ in got)
    assert len(caplog.records) == (1 if health is None else 0)  # warned once, not per scrape


def test_two_names_for_one_series_keep_the_first_and_warn(
    sink: PrometheusSink, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING):
        sink.write(StepRecord(run="r", step=0, metrics={"a/b": 1.0, "a_b": 2.0}))
        got = scrape_registry(sink.registry)
        scrape_registry(sink.registry)
    assert [v for (name, _), v in got.items() if name == "rlpulse_a_b"] == [1.0]  # "a/b" < "a_b"
    assert len([r for r in caplog.records if "rlpulse_a_b" in r.getMessage()]) == 1


def test_oldest_runs_are_dropped_beyond_max_runs() -> None:
    sink = PrometheusSink.from_kwargs({"port": 0, "max_runs": 2}, SinkContext())
    for run in ("a", "b", "a", "c"):
        sink.write(StepRecord(run=run, step=0, metrics={"time/adv": 1.0}))
    runs = {
        dict(labels)["run"]
        for name, labels in scrape_registry(sink.registry)
        if name == "rlpulse_run_step"
    }
    assert runs == {"a", "c"}


def test_serves_http_on_a_free_port_and_closes_twice(records: list[StepRecord]) -> None:
    sink = PrometheusSink.from_kwargs({"port": 0}, SinkContext())
    sink.close()  # before open: nothing to do
    sink.open()
    sink.open()  # idempotent
    sink.write(records[0])
    host, port = sink.address
    assert port != 0
    with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=10) as response:
        body = response.read().decode()
    assert 'rlpulse_time_rollout_seconds{role="actor_train",run="r1"}' in body
    assert "process_resident_memory_bytes" in body
    sink.close()
    sink.close()
    with pytest.raises(OSError):
        urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=2)


def test_the_same_server_answers_service_discovery_at_sd() -> None:
    targets: list[ScrapeTarget] = []
    sink = PrometheusSink.from_kwargs({"port": 0}, SinkContext(scrape_targets=lambda: targets))
    sink.open()
    try:
        host, port = sink.address
        sd = f"http://{host}:{port}/sd"
        with urllib.request.urlopen(sd, timeout=10) as response:
            assert response.headers["Content-Type"] == "application/json"
            assert json.loads(response.read()) == []
        targets.append(ScrapeTarget("http://10.0.0.7:8000/metrics", "r1", "rollout", 2, "n7"))
        with urllib.request.urlopen(sd, timeout=10) as response:
            (group,) = json.loads(response.read())
        assert group["targets"] == ["10.0.0.7:8000"]
        assert group["labels"]["rank"] == "2" and group["labels"]["run"] == "r1"
        with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=10) as response:
            assert b"rlpulse_run_step" in response.read()
    finally:
        sink.close()


def test_tls(tmp_path: Path) -> None:
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed (needed to make a test certificate)")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=127.0.0.1",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
            "-keyout",
            str(key),
            "-out",
            str(cert),
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )
    kwargs = {"port": 0, "certfile": str(cert), "keyfile": str(key)}
    sink = PrometheusSink.from_kwargs(kwargs, SinkContext())
    sink.open()
    try:
        sink.write(StepRecord(run="r", step=0, metrics={"time/adv": 0.5}))
        _, port = sink.address
        context = ssl.create_default_context(cafile=str(cert))
        url = f"https://127.0.0.1:{port}/metrics"
        with urllib.request.urlopen(url, timeout=10, context=context) as response:
            assert b'rlpulse_time_adv_seconds{role="",run="r"} 0.5' in response.read()
        with pytest.raises(OSError):  # plain HTTP is refused
            urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read()
    finally:
        sink.close()


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({}, "port"),
        ({"port": "9464"}, "port"),
        ({"port": 70000}, "port"),
        ({"port": True}, "port"),
        ({"port": 1, "host": ""}, "host"),
        ({"port": 1, "certfile": "/nonexistent.pem"}, "keyfile"),
        ({"port": 1, "certfile": "/nonexistent.pem", "keyfile": "/nonexistent.key"}, "certfile"),
        ({"port": 1, "max_runs": 0}, "max_runs"),
        ({"port": 1, "per_rank": True}, "per_rank"),
    ],
)
def test_bad_kwargs_name_the_field(kwargs: dict, field: str) -> None:
    with pytest.raises(ConfigError) as err:
        PrometheusSink.from_kwargs(kwargs, SinkContext())
    assert err.value.field == f"tracker_kwargs.prometheus.{field}"
