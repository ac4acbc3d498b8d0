"""Registered metrics endpoints: who is listed for Prometheus' service discovery, in what
format, and that a producer that only registers an endpoint is never waited for."""

from __future__ import annotations

import io
import json
from typing import Any

from rlpulse.collector.config import CollectorConfig
from rlpulse.collector.output.discovery import (
    SD_PATH,
    Discovery,
    ScrapeTarget,
    sd_groups,
    with_discovery,
)
from rlpulse.collector.runs.aggregator import Aggregator
from rlpulse.schemas import protocol as P
from rlpulse.schemas.record import StepRecord
from tests.collector import helpers
from tests.collector.helpers import TIMING, Declaring, metrics

URL = "http://10.0.0.7:8000/metrics"


def hello(pid: int, role: str = "rollout", rank: int = 0, ws: int = 1, **kw: Any) -> P.Hello:
    """A rollout engine's hello by default, from host ``node-<pid>``."""
    return helpers.hello(pid, role=role, rank=rank, ws=ws, host=f"node-{pid}", **kw)


def listed(agg: Aggregator, now: float) -> list[tuple[str, str, int]]:
    return sorted((t.url, t.role, t.rank) for t in agg.membership.scrape_targets(now))


def test_the_sd_document_is_prometheus_http_sd_format() -> None:
    targets = [
        ScrapeTarget(URL, "r", "rollout", 3, "node-7"),
        ScrapeTarget("https://[fd00::7]:9443", "r", "reward", 0, "node-8"),
    ]
    assert sd_groups(targets) == [
        {
            "targets": ["10.0.0.7:8000"],
            "labels": {
                "__scheme__": "http",
                "__metrics_path__": "/metrics",
                "run": "r",
                "role": "rollout",
                "rank": "3",
                "host": "node-7",
            },
        },
        {
            "targets": ["[fd00::7]:9443"],
            "labels": {
                "__scheme__": "https",
                "__metrics_path__": "/metrics",
                "run": "r",
                "role": "reward",
                "rank": "0",
                "host": "node-8",
            },
        },
    ]
    assert sd_groups([]) == []  # "no targets" is an empty list, never an error


def test_publishing_swaps_in_a_sorted_list_without_duplicates() -> None:
    d = Discovery()
    assert d.targets() == ()
    b, a = ScrapeTarget(URL, "r", "rollout", 1, "h"), ScrapeTarget(URL, "r", "rollout", 0, "h")
    d.publish([b, a, b])
    assert d.targets() == (a, b)
    d.publish([])
    assert d.targets() == ()


def call(app: Any, path: str, method: str = "GET") -> tuple[str, dict[str, str], bytes]:
    got: dict[str, Any] = {}

    def start_response(status: str, headers: list[tuple[str, str]]) -> None:
        got["status"], got["headers"] = status, dict(headers)

    environ = {"PATH_INFO": path, "REQUEST_METHOD": method, "wsgi.input": io.BytesIO()}
    body = b"".join(app(environ, start_response))
    return got["status"], got["headers"], body


def test_the_wsgi_route_answers_sd_and_leaves_the_rest_to_metrics() -> None:
    def metrics_app(environ: dict, start_response: Any) -> list[bytes]:
        start_response("200 OK", [("Content-Type", "text/plain")])
        return [b"# metrics\n"]

    target = ScrapeTarget(URL, "r", "rollout", 0, "h")
    app = with_discovery(metrics_app, lambda: (target,))
    status, headers, body = call(app, SD_PATH)
    assert status == "200 OK" and headers["Content-Type"] == "application/json"
    assert json.loads(body) == sd_groups([target])
    assert call(app, "/metrics")[2] == b"# metrics\n"
    assert call(app, SD_PATH, "POST")[0].startswith("405")

    def broken() -> tuple[ScrapeTarget, ...]:
        raise RuntimeError("boom")

    assert call(with_discovery(metrics_app, broken), SD_PATH)[0].startswith("500")
    assert call(with_discovery(metrics_app, broken), "/metrics")[0] == "200 OK"


def test_a_rank_with_an_endpoint_is_listed_until_it_says_goodbye() -> None:
    agg = Aggregator(lambda r: None, CollectorConfig(**TIMING))
    agg.handle(hello(1, metrics_url=URL), 0.0)
    agg.handle(hello(2, role="actor_train"), 0.0)  # no endpoint: not listed
    assert listed(agg, 0.0) == [(URL, "rollout", 0)]
    (target,) = agg.membership.scrape_targets(0.0)
    assert (target.run, target.host) == ("r", "node-1")
    agg.handle(P.Bye(1, 1, {}), 1.0)
    assert listed(agg, 1.0) == []


def test_a_silent_or_replaced_producer_is_unlisted() -> None:
    agg = Aggregator(lambda r: None, CollectorConfig(**TIMING))
    agg.handle(hello(1, metrics_url=URL), 0.0)
    assert listed(agg, 9.0) == [(URL, "rollout", 0)]
    assert listed(agg, 10.0) == []  # silent for liveness_s
    agg.handle(P.Heartbeat(1, 1, {}), 10.5)
    assert listed(agg, 11.0) == [(URL, "rollout", 0)]  # alive again
    other = "http://10.0.0.8:8000/metrics"
    agg.handle(hello(3, metrics_url=other), 12.0)  # a new process for rollout/0
    assert listed(agg, 12.0) == [(other, "rollout", 0)]


def test_a_repeated_hello_gives_a_restored_producer_its_endpoint_back() -> None:
    before = Aggregator(lambda r: None, CollectorConfig(**TIMING))
    before.handle(hello(1, metrics_url=URL), 0.0)
    after = Aggregator(lambda r: None, CollectorConfig(**TIMING))
    after.restore(before.snapshot(), 0.0)  # endpoints are not saved: hellos repeat them
    assert listed(after, 0.0) == []
    after.handle(hello(1, metrics_url=URL), 1.0)
    assert listed(after, 1.0) == [(URL, "rollout", 0)]


def test_an_endpoint_only_producer_is_listed_but_never_waited_for() -> None:
    out: list[StepRecord] = []
    agg = Aggregator(out.append, CollectorConfig(**TIMING))
    # Two rollout engines registered with logs=False, and one training rank.
    agg.handle(hello(10, rank=0, ws=2, metrics_url=URL, logs=False), 0.0)
    agg.handle(hello(11, rank=1, ws=2, metrics_url="http://h2:8000/metrics", logs=False), 0.0)
    feed = Declaring(agg)
    feed.handle(hello(1, role="actor_train"), 0.0)
    feed.handle(metrics(1, 0, {"time/rollout": 2.0}), 0.0)
    agg.handle(P.Done(1, 2, 0), 0.0)
    agg.poll(0.1)
    (record,) = out
    assert (record.step, record.partial, record.missing) == (0, False, ())
    assert set(agg.membership.runs["r"].roles) == {"actor_train"}
    assert listed(agg, 0.1) == [(URL, "rollout", 0), ("http://h2:8000/metrics", "rollout", 1)]
    agg.handle(P.Heartbeat(10, 1, {"logged": 0}), 5.0)
    assert agg.health.producer_stats[10] == {"logged": 0}
    agg.handle(P.Bye(11, 1, {}), 5.0)
    assert listed(agg, 5.0) == [(URL, "rollout", 0)]


def test_data_from_an_endpoint_only_producer_is_dropped_and_counted() -> None:
    out: list[StepRecord] = []
    agg = Aggregator(out.append, CollectorConfig(**TIMING))
    agg.handle(hello(10, metrics_url=URL, logs=False), 0.0)
    agg.handle(metrics(10, 0, {"time/rollout": 2.0}), 0.0)
    agg.flush()
    assert out == [] and agg.health.malformed["bad_field"] == 1
    assert "r" not in agg.runs  # no run was opened for it
