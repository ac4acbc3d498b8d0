"""A live collector's /metrics has every reject reason at 0 before any message arrives, and a
run's token and sample counters at 0 from its first step (issue 17, item 6)."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from rlpulse.collector.health import PRODUCER_ERRORS, PRODUCER_INVALID
from rlpulse.collector.launch import start_collector
from rlpulse.collector.output.promnames import prom_metric
from rlpulse.producer import Producer
from rlpulse.producer.buffers import Buffers
from rlpulse.schemas import metrics as M
from rlpulse.schemas.errors import REJECT_REASONS
from tests.support.net import free_port
from tests.support.prom import scrape_url


@dataclass
class Live:
    """A live collector (jsonl and Prometheus sinks): its address, /metrics and jsonl file."""

    address: str
    url: str
    out: Path


@pytest.fixture
def live(tmp_path: Path) -> Iterator[Live]:
    port, out = free_port(), tmp_path / "out.jsonl"
    config = {
        "track_with": ["prometheus", "jsonl"],
        "tracker_kwargs": {"prometheus": {"port": port}, "jsonl": {"path": str(out)}},
    }
    with (tmp_path / "collector.log").open("w") as log:
        collector = start_collector(config, stderr=log, stdout=subprocess.DEVNULL)
    try:
        yield Live(collector.address, f"http://127.0.0.1:{port}/metrics", out)
    finally:
        assert collector.stop() == 0


def test_counters_exist_before_their_first_increment(live: Live) -> None:
    got = scrape_url(live.url)
    reasons = {
        dict(labels)["reason"]: value
        for (name, labels), value in got.items()
        if name == "rlpulse_collector_malformed_total"
    }
    assert reasons == dict.fromkeys(REJECT_REASONS, 0.0)

    with Producer(live.address, run="fresh", role="driver") as producer:
        producer.log({M.TIME_ROLLOUT.name: 0.5}, step=0)  # no tokens logged yet
    deadline = time.monotonic() + 30
    while not live.out.exists() or not live.out.read_text():
        assert time.monotonic() < deadline, "step 0 never emitted"
        time.sleep(0.05)
    got = scrape_url(live.url)
    run = frozenset({("run", "fresh"), ("role", "")})
    assert got[(prom_metric(M.SYSTEM_TOKENS.name).name, run)] == 0.0
    assert got[(prom_metric(M.SYSTEM_SAMPLES.name).name, run)] == 0.0


def test_values_producers_lost_show_on_the_collectors_page(live: Live, monkeypatch) -> None:
    """A log() call that fails inside the producer (here its copy, as a pooled buffer of
    another shape once made it) and a value it refuses as invalid are counted by the producer
    and, through its goodbye, on the collector's /metrics: at 0 before, then 1 each."""
    errors, invalid = (PRODUCER_ERRORS.name, frozenset()), (PRODUCER_INVALID.name, frozenset())
    got = scrape_url(live.url)
    assert got[errors] == 0.0 and got[invalid] == 0.0

    def broken(self, like):
        raise ValueError("a copy that cannot be made")

    monkeypatch.setattr(Buffers, "take", broken)
    with Producer(live.address, run="lossy", role="driver") as producer:
        producer.log({"bench/samples": np.ones(1024)}, step=0)  # fails: skipped
        producer.log({"bench/x": "not a number", M.TIME_ROLLOUT.name: 0.5}, step=1)
        stats = producer.stats()
    assert stats["errors"] == 1 and stats["invalid"] == 1
    deadline = time.monotonic() + 30
    while (got := scrape_url(live.url))[errors] != 1.0:
        assert time.monotonic() < deadline, "the producer's goodbye never counted"
        time.sleep(0.05)
    assert got[invalid] == 1.0
