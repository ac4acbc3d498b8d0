"""A real Prometheus server finds an engine's /metrics through the collector's service
discovery and scrapes it with the run, role and rank the engine registered; the endpoint leaves
the list when its producer closes.

The engine is a loopback ``prometheus_client`` server exporting a vLLM-style gauge; it
registers as a vLLM worker would, with a producer that logs nothing. An engine started from a
shell registers through ``rlpulse register -- COMMAND`` for as long as it runs.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, Gauge, start_http_server

from rlpulse.collector.launch import start_collector
from rlpulse.producer import Producer
from tests.integration.promserver import (
    PROMETHEUS,
    get,
    need,
    prometheus,
    scraped,
    targets,
)
from tests.support.net import free_port
from tests.support.waiting import eventually

RUN, ROLE, RANK = "sd-run", "rollout", 1


@pytest.fixture
def engine() -> Iterator[str]:
    """An engine's /metrics on a free loopback port; yields its URL."""
    registry = CollectorRegistry()
    running = Gauge("vllm:num_requests_running", "Requests running.", registry=registry)
    running.set(3)
    server, thread = start_http_server(0, addr="127.0.0.1", registry=registry)
    yield f"http://127.0.0.1:{server.server_port}/metrics"
    server.shutdown()
    server.server_close()
    thread.join(5)


def sd_list(url: str) -> list[dict] | None:
    body = get(url)
    return None if body is None else json.loads(body)


def test_prometheus_discovers_and_scrapes_a_registered_endpoint(
    tmp_path: Path, engine: str
) -> None:
    need(PROMETHEUS)
    port = free_port()
    config = {"track_with": ["prometheus"], "tracker_kwargs": {"prometheus": {"port": port}}}
    with (tmp_path / "collector.log").open("w") as log:
        collector = start_collector(config, stderr=log, stdout=subprocess.DEVNULL)
    sd = f"http://127.0.0.1:{port}/sd"
    try:
        assert sd_list(sd) == [], "nothing registered yet: an empty list, not an error"
        producer = Producer(
            collector.address,
            run=RUN,
            role=ROLE,
            rank=RANK,
            world_size=2,
            metrics_url=engine,
            logs=False,
        )
        eventually(lambda: bool(sd_list(sd)), "the endpoint at /sd")
        address = engine.removeprefix("http://").removesuffix("/metrics")
        assert sd_list(sd) == [
            {
                "targets": [address],
                "labels": {
                    "__scheme__": "http",
                    "__metrics_path__": "/metrics",
                    "run": RUN,
                    "role": ROLE,
                    "rank": str(RANK),
                    "host": socket.gethostname(),
                },
            }
        ]
        jobs = (
            f"  - job_name: engines\n    http_sd_configs: [{{url: '{sd}', refresh_interval: 1s}}]\n"
        )
        with prometheus(tmp_path, jobs) as base:
            # prometheus_client writes the colon as "_" in OpenMetrics, which Prometheus asks
            # for first; either spelling is the engine's gauge.
            (found,) = scraped(base, '{__name__=~"vllm.num_requests_running"}')
            labels = found["metric"]
            assert {k: labels.get(k) for k in ("run", "role", "rank", "job", "instance")} == {
                "run": RUN,
                "role": ROLE,
                "rank": str(RANK),
                "job": "engines",
                "instance": address,
            }
            assert found["value"][1] == "3"
            (up,) = scraped(base, f'up{{job="engines", run="{RUN}", rank="{RANK}"}}')
            assert up["value"][1] == "1"

            producer.close()  # the engine goes: its endpoint leaves /sd, then Prometheus
            eventually(lambda: sd_list(sd) == [], "the endpoint to leave /sd")
            eventually(lambda: targets(base) == [], "Prometheus to drop the target")
    finally:
        assert collector.stop() == 0


def test_register_lists_an_engine_started_from_the_shell_while_it_runs(tmp_path: Path) -> None:
    """``rlpulse register ... -- COMMAND``, as a vLLM user would run it."""
    port = free_port()
    config = {"track_with": ["prometheus"], "tracker_kwargs": {"prometheus": {"port": port}}}
    with (tmp_path / "collector.log").open("w") as log:
        collector = start_collector(config, stderr=log, stdout=subprocess.DEVNULL)
    sd, url = f"http://127.0.0.1:{port}/sd", "http://127.0.0.1:8000/metrics"
    go = tmp_path / "go"
    engine = f"import pathlib, time\nwhile not pathlib.Path({str(go)!r}).exists(): time.sleep(0.05)"
    try:
        register = ["--collector", collector.address, "--url", url, "--run", RUN, "--role", ROLE]
        engine_cmd = [sys.executable, "-c", engine + "\nraise SystemExit(5)"]
        command = [
            str(Path(sys.executable).parent / "rlpulse"),
            "register",
            *register,
            "--",
            *engine_cmd,
        ]
        proc = subprocess.Popen(command, stderr=subprocess.PIPE, text=True)
        eventually(lambda: bool(sd_list(sd)), "the endpoint at /sd")
        (group,) = sd_list(sd) or []
        assert group["targets"] == ["127.0.0.1:8000"] and group["labels"]["role"] == ROLE
        go.touch()  # the engine exits: so does register, with its status, and says goodbye
        assert proc.wait(20) == 5, proc.stderr.read() if proc.stderr else ""
        eventually(lambda: sd_list(sd) == [], "the endpoint to leave /sd")
    finally:
        assert collector.stop() == 0
