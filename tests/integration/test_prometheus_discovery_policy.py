"""A real collector's ``/sd`` lists only the registered endpoints its ``sd_targets`` admits
(issue 22, item 15): real producers register URLs, one of them a cloud metadata address; the
collector never fetches a registered URL, and everything here stays on loopback (the metadata
URL is only a string in a registration). The refusals are counted on ``/metrics`` from
start-up, and a bad ``sd_targets`` exits 2 naming the entry."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import yaml

from rlpulse.collector.launch import CollectorProcess, start_collector
from rlpulse.producer import Producer
from tests.support.net import free_port
from tests.support.prom import scrape
from tests.support.waiting import eventually

REFUSED = "rlpulse_collector_scrape_targets_refused_total"
METADATA = "http://169.254.169.254/latest/meta-data"


def get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:
        return response.read().decode()


def refused(port: int) -> float:
    """The refusal counter on the collector's /metrics (KeyError when it is not there)."""
    return scrape(port)[REFUSED]


def sd(port: int) -> list[str]:
    return sorted(g["targets"][0] for g in json.loads(get(f"http://127.0.0.1:{port}/sd")))


@contextmanager
def collector_with(tmp_path: Path, extra: dict[str, Any]) -> Iterator[tuple[CollectorProcess, int]]:
    port = free_port()
    config = {"track_with": ["prometheus"], "tracker_kwargs": {"prometheus": {"port": port}}}
    with (tmp_path / "collector.log").open("w") as log:
        collector = start_collector({**config, **extra}, stderr=log, stdout=subprocess.DEVNULL)
    try:
        yield collector, port
    finally:
        assert collector.stop() == 0


def register(stack: ExitStack, address: str, url: str, rank: int) -> None:
    engine = Producer(
        address, run="sd", role="rollout", rank=rank, world_size=3, metrics_url=url, logs=False
    )
    stack.callback(engine.close)


def test_a_metadata_address_is_not_listed_by_default(tmp_path: Path) -> None:
    with collector_with(tmp_path, {}) as (collector, port), ExitStack() as engines:
        assert refused(port) == 0  # exported from start-up
        register(engines, collector.address, METADATA, 0)
        register(engines, collector.address, "http://127.0.0.1:18000/metrics", 1)
        eventually(lambda: refused(port) == 1 and sd(port) != [], "the registrations at /sd")
        assert sd(port) == ["127.0.0.1:18000"]
        time.sleep(1.2)  # republished twice since: still refused, counted once
        assert sd(port) == ["127.0.0.1:18000"] and refused(port) == 1
    log = (tmp_path / "collector.log").read_text()
    assert f"not listing {METADATA}" in log and "is in sd_targets.deny (169.254.0.0/16)" in log


def test_an_allow_list_lists_only_the_hosts_it_names(tmp_path: Path) -> None:
    policy = {"sd_targets": {"allow": ["127.0.0.2", "*.engines.test"]}}
    with collector_with(tmp_path, policy) as (collector, port), ExitStack() as engines:
        register(engines, collector.address, "http://127.0.0.1:18000/metrics", 0)
        register(engines, collector.address, "http://127.0.0.2:18000/metrics", 1)
        register(engines, collector.address, "http://db.internal.test:5432/metrics", 2)
        eventually(lambda: refused(port) == 2, "two refusals")
        eventually(lambda: sd(port) == ["127.0.0.2:18000"], "the allowed endpoint at /sd")
    log = (tmp_path / "collector.log").read_text()
    assert "127.0.0.1 is not in sd_targets.allow" in log
    assert "db.internal.test is not in sd_targets.allow" in log


def test_a_bad_sd_targets_exits_2_naming_the_entry(tmp_path: Path) -> None:
    path = tmp_path / "collector.yaml"
    path.write_text(yaml.safe_dump({"sd_targets": {"allow": ["127.0.0.0/8", "10.0.0.1/8"]}}))
    done = subprocess.run(
        [sys.executable, "-m", "rlpulse.collector", "--config", str(path)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    line = done.stderr.strip().splitlines()[-1]
    assert line.startswith("rlpulse-collector: configuration error: sd_targets.allow[1]: "), line
    assert "has host bits set" in line
