"""A real Prometheus server scrapes the Prometheus sink; PromQL returns what the jsonl sink wrote,
and ``promtool check metrics`` finds nothing to complain about in a live scrape.

Needs the ``prometheus`` and ``promtool`` binaries (Debian package ``prometheus``, installed by
``scripts/install-system-deps.sh``, which ``make test`` runs first).
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from rlpulse.collector.output.promnames import prom_metric
from rlpulse.collector.sinks.base import SinkContext
from rlpulse.collector.sinks.prometheus import PrometheusSink
from tests.collector.sinks.conftest import jsonl_view, make_records
from tests.integration.promserver import (
    PROMETHEUS,
    PROMTOOL,
    get,
    need,
    prometheus as prometheus_server,
    query,
    scraped,
    static_job,
)
from tests.support.net import free_port

HEALTH = {
    "messages_received": 7,
    "events_received": 70,
    "malformed": {"undecodable": 1},
    "late": 0,
    "partial_steps": 0,
    "steps_emitted": 3,
    "producers": 2,
    "producer_dropped": 0,
    "sinks": {
        "jsonl": {"queue_depth": 0, "written": 3, "errors": 0, "dropped": 0, "lag_seconds": 0.0}
    },
}


@pytest.fixture
def sink() -> Iterator[PrometheusSink]:
    sink = PrometheusSink.from_kwargs(
        {"host": "127.0.0.1", "port": 0}, SinkContext(health=lambda: HEALTH)
    )
    sink.open()
    yield sink
    sink.close()


@pytest.fixture
def prometheus(tmp_path: Path, sink: PrometheusSink) -> Iterator[str]:
    host, port = sink.address
    with prometheus_server(tmp_path, static_job(f"{host}:{port}")) as base:
        yield base


def test_promql_returns_what_the_jsonl_sink_wrote(
    tmp_path: Path, sink: PrometheusSink, prometheus: str
) -> None:
    records = make_records("run-1", 3)
    for record in records:
        sink.write(record)
    expected = jsonl_view(records, tmp_path / "out.jsonl")[("run-1", 2)]

    names = [
        "time/rollout",
        "critic/score/mean",
        "system/tokens",
        "memory/actor_train/train_step/end/onload/max_allocated/0",
    ]
    promql = {n: f'{prom_metric(n).name}{{run="run-1"}}' for n in names}
    scraped(prometheus, promql[names[-1]])
    for name in names:
        (series,) = query(prometheus, promql[name])
        # Derived metrics have no role; Prometheus drops an empty label.
        assert series["metric"].get("role", "") == records[-1].roles.get(name, ""), name
        assert float(series["value"][1]) == expected[name] * prom_metric(name).scale, name

    (health,) = query(prometheus, 'rlpulse_sink_written_total{sink="jsonl"}')
    assert float(health["value"][1]) == 3
    (up,) = query(prometheus, 'up{job="rlpulse"}')
    assert up["value"][1] == "1"


def test_promtool_finds_nothing_wrong_with_a_live_scrape(sink: PrometheusSink) -> None:
    need(PROMTOOL)
    for record in make_records("run-1", 2):  # every catalog name, and one outside it
        sink.write(record)
    host, port = sink.address
    scrape = get(f"http://{host}:{port}/metrics")
    assert scrape is not None and b"rlpulse_system_tokens_total" in scrape
    check = subprocess.run(
        [PROMTOOL, "check", "metrics"], input=scrape, capture_output=True, timeout=60
    )
    assert (check.returncode, check.stdout + check.stderr) == (0, b"")


def test_collector_daemon_end_to_end(tmp_path: Path) -> None:
    """Producer -> collector daemon (jsonl + prometheus sinks) -> Prometheus server -> PromQL."""
    need(PROMETHEUS)
    from rlpulse.collector.launch import start_collector
    from rlpulse.producer.client import Producer

    out, port = tmp_path / "out.jsonl", free_port()
    config = {
        "track_with": ["jsonl", "prometheus"],
        "tracker_kwargs": {"jsonl": {"path": str(out)}, "prometheus": {"port": port}},
    }
    with (tmp_path / "collector.log").open("w") as log:
        collector = start_collector(config, stderr=log, stdout=subprocess.DEVNULL)
    try:
        producer = Producer(collector.address, run="e2e", role="actor_train")
        for step in range(3):
            producer.log({"time/rollout": 1.25 + step, "critic/score": [0.5, 1.0, step]}, step=step)
        producer.close()
        deadline = time.monotonic() + 30
        while not out.exists() or len(out.read_text().splitlines()) < 3:
            assert time.monotonic() < deadline, "the collector never emitted 3 steps"
            time.sleep(0.2)
        last = json.loads(out.read_text().splitlines()[-1])
        assert last["step"] == 2
        with prometheus_server(tmp_path, static_job(f"127.0.0.1:{port}")) as base:
            for name in ("time/rollout", "critic/score/mean", "critic/score/max"):
                pm = prom_metric(name)
                (series,) = scraped(base, f'{pm.name}{{run="e2e"}}')
                assert series["metric"]["role"] == "actor_train"
                assert float(series["value"][1]) == last["metrics"][name] * pm.scale, name
            (emitted,) = scraped(base, "rlpulse_collector_steps_emitted_total")
            assert float(emitted["value"][1]) == 3
            (written,) = scraped(base, 'rlpulse_sink_written_total{sink="jsonl"}')
            assert float(written["value"][1]) == 3
    finally:
        assert collector.stop() == 0
