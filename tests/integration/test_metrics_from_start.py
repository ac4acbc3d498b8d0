"""A live collector's /metrics has every reject reason at 0 before any message arrives, and a
run's token and sample counters at 0 from its first step (issue 17, item 6)."""

from __future__ import annotations

import socket
import subprocess
import time
import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from rlpulse.collector.launch import start_collector
from rlpulse.collector.promnames import prom_metric
from rlpulse.producer import Producer
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
