"""Large messages from producers that never register (issue 38, item 7): a real collector
process, real ZeroMQ sockets on loopback, its resident memory read from ``/proc``.

Before: 150 messages of 7.7 MB took the collector from 48 to 752 MB, kept after the senders
left (ZeroMQ read the connections ahead of the collector's own 64 MiB bound on what it keeps
for unregistered producers, and glibc kept the freed blocks). Now the memory the burst adds
stays near that bound, each message dropped is counted, and a real producer is served
exactly afterwards.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import zmq

from rlpulse.collector.intake.delivery import MAX_HELD_BYTES
from rlpulse.producer import Producer
from rlpulse.producer.config import ProducerConfig
from rlpulse.schemas import protocol, protocol_v1
from tests.integration.collectors import live_collector
from tests.support.prom import scrape

MB = 1024 * 1024
SLACK = 48 * MB
"""Beyond what is held: the decoded copies of the held messages aside, allocator and ZeroMQ
overheads."""


def rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def large_message(version: int, producer: int) -> bytes:
    """A valid data message of about 7.5 MB (under the 8 MiB limit) from ``producer``."""
    if version == 2:
        return protocol.encode_metrics(producer, 1, [(0, 1.0, 0, b"\0" * 320_000, {})] * 24)
    names = [f"big/m{i:05d}" for i in range(10_000)]
    entry = protocol_v1.pack_entry(0, 1.0, names, b"\1" * len(names), b"\0" * 32 * len(names))
    return protocol_v1.encode_metrics(producer, 1, [entry] * 17)


@pytest.mark.parametrize(("version", "count"), [(2, 150), (1, 60)])
def test_large_messages_of_unregistered_producers_stay_bounded(tmp_path, version, count) -> None:
    with live_collector(tmp_path) as live:
        collector, port, out = live.collector, live.port, live.out
        pid = collector.proc.pid
        time.sleep(0.5)
        before = rss(pid)
        ctx = zmq.Context()
        sockets = []
        for i in range(count):  # ten messages a connection, each of its own producer
            if i % 10 == 0:
                sock = ctx.socket(zmq.DEALER)
                sock.setsockopt(zmq.LINGER, 0)
                sock.setsockopt(zmq.SNDTIMEO, 60_000)
                sock.connect(collector.address)
                sockets.append(sock)
            sockets[-1].send(large_message(version, 10_000 + i))
        peak, deadline = before, time.monotonic() + 120
        while scrape(port)["rlpulse_collector_messages_received_total"] < count:
            assert time.monotonic() < deadline, "the collector never received them all"
            peak = max(peak, rss(pid))
            time.sleep(0.05)
        for sock in sockets:
            sock.close()
        ctx.term()
        time.sleep(1.0)
        after = rss(pid)
        metrics = scrape(port)
        held = MAX_HELD_BYTES // len(large_message(version, 1))
        assert metrics["rlpulse_collector_unknown_producer_total"] == count - held
        # What is held, decoded and raw, and no more; before: 704 MB after, 748 MB at the peak
        bound = 2 * MAX_HELD_BYTES + SLACK
        assert after - before < bound, f"{before / MB:.0f} -> {after / MB:.0f} MB"
        assert peak - before < bound + SLACK, f"peak {peak / MB:.0f} MB"

        with Producer(
            collector.address,
            run="after",
            role="actor_train",
            config=ProducerConfig(close_timeout_s=30),
        ) as p:
            for step in range(5):
                p.log({"after/value": float(step)}, step=step)
        assert collector.stop() == 0
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["step"], r["metrics"]["after/value"], r["partial"]) for r in records] == [
        (s, float(s), False) for s in range(5)
    ]
