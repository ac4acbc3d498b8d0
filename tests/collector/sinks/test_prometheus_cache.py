"""The text of /metrics kept between scrapes (issue 24): never stale, byte for byte what
prometheus_client renders from the registry, in every format it offers.

The sink renders what the written steps decide once per write and the health counters once per
change; these tests change one or the other between scrapes and look for the change.
"""

from __future__ import annotations

import gzip
import math
import threading
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from prometheus_client import generate_latest
from prometheus_client.exposition import choose_encoder

from rlpulse.collector.sinks import promexport
from rlpulse.collector.sinks.base import SinkContext
from rlpulse.collector.sinks.prometheus import PrometheusSink
from rlpulse.schemas.record import StepRecord
from tests.support.prom import samples

OPENMETRICS = "application/openmetrics-text;version=1.0.0;q=0.5,text/plain;version=0.0.4;q=0.3"
"""What a Prometheus server asks for: OpenMetrics first."""
FORMATS = [None, "text/plain;version=0.0.4", OPENMETRICS]
RUN = frozenset({("run", "r")})
ADV = ("rlpulse_time_adv_seconds", frozenset({("run", "r"), ("role", "")}))


@pytest.fixture
def health() -> dict[str, Any]:
    return {"messages_received": 1, "malformed": {}, "sinks": {"jsonl": {"written": 1}}}


@pytest.fixture
def sink(health: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> Iterator[PrometheusSink]:
    # The process metrics read once: two renderings of the registry are then comparable.
    monkeypatch.setattr(promexport, "PROCESS_REFRESH_S", math.inf)
    sink = PrometheusSink.from_kwargs({"port": 0}, SinkContext(health=lambda: health))
    sink.open()
    yield sink
    sink.close()


def get(sink: PrometheusSink, accept: str | None = None, query: str = "") -> tuple[bytes, Any]:
    host, port = sink.address
    request = urllib.request.Request(f"http://{host}:{port}/metrics{query}")
    if accept is not None:
        request.add_header("Accept", accept)
    with urllib.request.urlopen(request, timeout=10) as response:
        return response.read(), response.headers


def scrape(sink: PrometheusSink) -> dict[tuple[str, frozenset], float]:
    body, _ = get(sink)
    return samples(body.decode())


def test_a_scrape_after_a_write_shows_the_new_step(sink: PrometheusSink) -> None:
    sink.write(StepRecord(run="r", step=0, metrics={"time/adv": 0.25}))
    assert scrape(sink)[("rlpulse_run_step", RUN)] == 0
    assert scrape(sink)[ADV] == 0.25  # a second scrape of the same step, from the kept text
    sink.write(StepRecord(run="r", step=1, metrics={"time/adv": 0.5, "time/rollout": 2.0}))
    got = scrape(sink)
    assert got[("rlpulse_run_step", RUN)] == 1
    assert got[ADV] == 0.5
    assert got[("rlpulse_time_rollout_seconds", frozenset({("run", "r"), ("role", "")}))] == 2.0
    text = generate_latest(sink.registry).decode()  # the registry sees the same
    assert 'rlpulse_run_step{run="r"} 1.0' in text


def test_a_health_counter_increment_shows_on_the_next_scrape(
    sink: PrometheusSink, health: dict[str, Any]
) -> None:
    sink.write(StepRecord(run="r", step=0, metrics={"time/adv": 0.25}))
    assert scrape(sink)[("rlpulse_collector_messages_received_total", frozenset())] == 1
    health["messages_received"] = 2
    health["malformed"] = {"undecodable": 3}
    health["sinks"]["jsonl"]["written"] = 5
    got = scrape(sink)
    assert got[("rlpulse_collector_messages_received_total", frozenset())] == 2
    assert got[("rlpulse_collector_malformed_total", frozenset({("reason", "undecodable")}))] == 3
    assert got[("rlpulse_sink_written_total", frozenset({("sink", "jsonl")}))] == 5
    assert got[ADV] == 0.25


def test_a_new_run_and_an_evicted_one_show_on_the_next_scrape(health: dict[str, Any]) -> None:
    sink = PrometheusSink.from_kwargs(
        {"port": 0, "max_runs": 1}, SinkContext(health=lambda: health)
    )
    sink.open()
    try:
        sink.write(StepRecord(run="a", step=0, metrics={"time/adv": 1.0}))
        assert ("rlpulse_run_step", frozenset({("run", "a")})) in scrape(sink)
        sink.write(StepRecord(run="b", step=0, metrics={"time/adv": 1.0}))
        runs = {dict(k)["run"] for n, k in scrape(sink) if n == "rlpulse_run_step"}
        assert runs == {"b"}
    finally:
        sink.close()


@pytest.mark.parametrize("accept", FORMATS)
def test_the_body_is_what_prometheus_client_renders_from_the_registry(
    sink: PrometheusSink, health: dict[str, Any], records: list[StepRecord], accept: str | None
) -> None:
    encoder, content_type = choose_encoder(accept)
    for record in records:
        sink.write(record)
        for _ in range(2):  # built, then kept
            body, headers = get(sink, accept)
            assert body == encoder(sink.registry)
            assert headers["Content-Type"] == content_type
        health["messages_received"] += 1
    assert body.count(b"# EOF") == (1 if accept == OPENMETRICS else 0)


def test_gzip_and_a_name_filter_are_served_as_prometheus_client_serves_them(
    sink: PrometheusSink, records: list[StepRecord]
) -> None:
    sink.write(records[0])
    host, port = sink.address
    request = urllib.request.Request(f"http://{host}:{port}/metrics")
    request.add_header("Accept-Encoding", "gzip")
    with urllib.request.urlopen(request, timeout=10) as response:
        assert response.headers["Content-Encoding"] == "gzip"
        assert gzip.decompress(response.read()) == generate_latest(sink.registry)
    body, _ = get(sink, query="?name[]=rlpulse_run_step")
    # prometheus_client's answer, whatever it is (empty: the sink's collectors declare no names)
    assert body == generate_latest(sink.registry.restricted_registry(["rlpulse_run_step"]))


def test_a_metric_named_like_a_health_metric_shows_while_health_lacks_it(
    sink: PrometheusSink, health: dict[str, Any]
) -> None:
    sink.write(StepRecord(run="r", step=0, metrics={"collector/messages_received_total": 7.0}))
    name = "rlpulse_collector_messages_received_total"
    assert scrape(sink)[(name, frozenset())] == 1  # the collector's own counter wins
    del health["messages_received"]
    assert scrape(sink)[(name, frozenset({("run", "r"), ("role", "")}))] == 7


def test_scrapes_on_many_threads_during_writes_see_steps_in_order(sink: PrometheusSink) -> None:
    steps = 200
    seen: dict[int, list[int]] = {}
    errors: list[BaseException] = []

    def scraper(index: int) -> None:
        mine = seen.setdefault(index, [])
        try:
            while not mine or mine[-1] < steps - 1:
                got = scrape(sink)
                step = int(got.get(("rlpulse_run_step", RUN), -1))
                if step >= 0:
                    assert got[ADV] == step  # the value written with that step, never older
                mine.append(step)
        except BaseException as exc:  # reported by the test's thread below
            errors.append(exc)

    threads = [threading.Thread(target=scraper, args=(i,)) for i in range(3)]
    for thread in threads:
        thread.start()
    for step in range(steps):
        sink.write(StepRecord(run="r", step=step, metrics={"time/adv": float(step)}))
    for thread in threads:
        thread.join(timeout=60)
    assert errors == [] and not any(thread.is_alive() for thread in threads)
    for mine in seen.values():
        assert mine == sorted(mine) and mine[-1] == steps - 1
