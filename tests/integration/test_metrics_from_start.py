"""A live collector's /metrics has every reject reason at 0 before any message arrives, and a
run's token and sample counters at 0 from its first step (issue 17, item 6)."""

from __future__ import annotations

import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import numpy as np
from prometheus_client.parser import text_string_to_metric_families

from rlpulse.collector.launch import start_collector
from rlpulse.collector.promnames import prom_metric
from rlpulse.producer import Producer
from rlpulse.producer.reduce import Buffers
from rlpulse.schemas import metrics as M
from rlpulse.schemas.errors import REJECT_REASONS


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def scrape(url: str) -> dict[tuple[str, frozenset], float]:
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_counters_exist_before_their_first_increment(tmp_path: Path) -> None:
    port, out = free_port(), tmp_path / "out.jsonl"
    config = {
        "track_with": ["prometheus", "jsonl"],
        "tracker_kwargs": {"prometheus": {"port": port}, "jsonl": {"path": str(out)}},
    }
    url = f"http://127.0.0.1:{port}/metrics"
    with (tmp_path / "collector.log").open("w") as log:
        collector = start_collector(config, stderr=log, stdout=subprocess.DEVNULL)
    try:
        got = scrape(url)
        reasons = {
            dict(labels)["reason"]: value
            for (name, labels), value in got.items()
            if name == "rlpulse_collector_malformed_total"
        }
        assert reasons == dict.fromkeys(REJECT_REASONS, 0.0)

        with Producer(collector.address, run="fresh", role="driver") as producer:
            producer.log({M.TIME_ROLLOUT.name: 0.5}, step=0)  # no tokens logged yet
        deadline = time.monotonic() + 30
        while not out.exists() or not out.read_text():
            assert time.monotonic() < deadline, "step 0 never emitted"
            time.sleep(0.05)
        got = scrape(url)
        run = frozenset({("run", "fresh"), ("role", "")})
        assert got[(prom_metric(M.SYSTEM_TOKENS.name).name, run)] == 0.0
        assert got[(prom_metric(M.SYSTEM_SAMPLES.name).name, run)] == 0.0
    finally:
        assert collector.stop() == 0


def test_values_producers_lost_show_on_the_collectors_page(tmp_path: Path, monkeypatch) -> None:
    """A log() call that fails inside the producer (here its copy, as a pooled buffer of
    another shape once made it) and a value it refuses as invalid are counted by the producer
    and, through its goodbye, on the collector's /metrics: at 0 before, then 1 each."""
    port, out = free_port(), tmp_path / "out.jsonl"
    config = {
        "track_with": ["prometheus", "jsonl"],
        "tracker_kwargs": {"prometheus": {"port": port}, "jsonl": {"path": str(out)}},
    }
    url = f"http://127.0.0.1:{port}/metrics"
    with (tmp_path / "collector.log").open("w") as log:
        collector = start_collector(config, stderr=log, stdout=subprocess.DEVNULL)
    try:
        got = scrape(url)
        assert got[("rlpulse_collector_producer_errors_total", frozenset())] == 0.0
        assert got[("rlpulse_collector_producer_invalid_total", frozenset())] == 0.0

        def broken(self, like):
            raise ValueError("a copy that cannot be made")

        monkeypatch.setattr(Buffers, "take", broken)
        with Producer(collector.address, run="lossy", role="driver") as producer:
            producer.log({"bench/samples": np.ones(1024)}, step=0)  # fails: skipped
            producer.log({"bench/x": "not a number", M.TIME_ROLLOUT.name: 0.5}, step=1)
            stats = producer.stats()
        assert stats["errors"] == 1 and stats["invalid"] == 1
        deadline = time.monotonic() + 30
        while True:
            got = scrape(url)
            if got[("rlpulse_collector_producer_errors_total", frozenset())] == 1.0:
                break
            assert time.monotonic() < deadline, "the producer's goodbye never counted"
            time.sleep(0.05)
        assert got[("rlpulse_collector_producer_invalid_total", frozenset())] == 1.0
    finally:
        assert collector.stop() == 0
