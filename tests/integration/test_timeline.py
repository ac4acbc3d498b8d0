"""Timelines end to end: three producer processes time a phase with ``Producer.phase``, rank 2
slower; the collector writes the run's trace file, sends each step as an OTLP trace to a
loopback receiver decoding the real protobuf, names rank 2 the straggler in the jsonl, and
exports it on /metrics with cluster and phase labels."""

from __future__ import annotations

import json
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from rlpulse.collector.launch import start_collector
from rlpulse.collector.sinks.trace import trace_path
from rlpulse.schemas import metrics as M
from tests.support.net import free_port

pytest.importorskip("opentelemetry.exporter.otlp.proto.http.trace_exporter")
from tests.collector.sinks.otlp_receiver import Receiver
from tests.integration.collectors import SPAWN

RANKS, STEPS, SLOW = 3, 4, 2
LAG = M.STRAGGLER.format(cluster="actor_train", phase="train_step", stat="lag")
SLOWEST = M.STRAGGLER.format(cluster="actor_train", phase="train_step", stat="slowest_rank")


def rank_main(address: str, rank: int) -> None:
    from rlpulse.producer import Producer

    with Producer(address, run="tl", role="actor_train", rank=rank, world_size=RANKS) as p:
        for step in range(STEPS):
            with p.phase("actor_train/train_step", step=step):
                time.sleep(0.05 + (0.25 if rank == SLOW else 0.0))
            p.step_done(step)


def test_phases_become_a_trace_file_otlp_traces_and_straggler_metrics(tmp_path: Path) -> None:
    receiver = Receiver()
    port = free_port()
    config = {
        "track_with": ["jsonl", "trace", "otlp", "prometheus"],
        "tracker_kwargs": {
            "jsonl": {"path": str(tmp_path / "m.jsonl")},
            "trace": {"dir": str(tmp_path / "traces")},
            "otlp": {"endpoint": receiver.url},
            "prometheus": {"host": "127.0.0.1", "port": port},
        },
        "settle_s": 0,
    }
    log = (tmp_path / "collector.log").open("w")
    collector = start_collector(config, stderr=log, stdout=subprocess.DEVNULL)
    try:
        procs = [SPAWN.Process(target=rank_main, args=(collector.address, r)) for r in range(RANKS)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(60)
            assert p.exitcode == 0
        deadline = time.monotonic() + 30
        out = tmp_path / "m.jsonl"
        while time.monotonic() < deadline and (
            not out.exists() or len(out.read_text().splitlines()) < STEPS
        ):
            time.sleep(0.05)
        scrape = (
            urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
        )
    finally:
        collector.stop()
        receiver.server.shutdown()
    records = [json.loads(line) for line in (tmp_path / "m.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == list(range(STEPS))
    for r in records:
        assert r["metrics"][SLOWEST] == SLOW
        assert 0.15 < r["metrics"][LAG] < 1.0, r["metrics"][LAG]
    assert (
        f'rlpulse_straggler_slowest_rank{{cluster="actor_train",phase="train_step",role="",run="tl"}} {float(SLOW)}'
        in scrape
    )
    events = json.loads(trace_path(tmp_path / "traces", "tl").read_text())
    spans = [e for e in events if e.get("ph") == "X" and e.get("name") == "train_step"]
    assert sorted((e["args"]["step"], e["tid"]) for e in spans) == [
        (s, r) for s in range(STEPS) for r in range(RANKS)
    ]
    for e in spans:
        floor = 0.05 + (0.25 if e["tid"] == SLOW else 0.0)
        assert e["dur"] >= floor * 1e6, "a span lasts at least the phase's sleep"
    otlp = receiver.spans()
    assert len({s.trace_id for s in otlp}) == STEPS, "one trace per step"
    assert sum(s.name == "actor_train/train_step" for s in otlp) == STEPS * RANKS
