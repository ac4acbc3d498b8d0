"""Producers whose deliveries drift apart lose nothing: 16 producers in one process log 1,000
steps of 60 scalars as fast as they can, in lockstep. Their sender threads deliver at
different paces, so some run far ahead of the collector's ``max_open_steps`` window; the
collector holds those back (leaves them unacknowledged, then asks them to resend) instead of
emitting the laggards' steps partial and dropping their data as late."""

from __future__ import annotations

import json
import subprocess
import time

from rlpulse.collector.launch import start_collector
from rlpulse.producer import Producer
from tests.support.net import free_port

RANKS, STEPS, NAMES = 16, 1000, 60


def test_producers_ahead_are_held_back_and_no_step_is_partial(tmp_path) -> None:
    out = tmp_path / "out.jsonl"
    config = {
        "track_with": ["jsonl"],
        "tracker_kwargs": {"jsonl": {"path": str(out)}},
        "settle_s": 0,
        "max_open_steps": 64,
    }
    bind = f"tcp://127.0.0.1:{free_port()}"
    log = tmp_path / "collector.log"
    collector = start_collector(config, bind=bind, stderr=log.open("w"), stdout=subprocess.DEVNULL)
    names = [f"flow/m{i}" for i in range(NAMES)]
    producers = [
        Producer(bind, run="flow", role="actor_train", rank=r, world_size=RANKS)
        for r in range(RANKS)
    ]
    try:
        for step in range(STEPS):
            for r, p in enumerate(producers):
                p.log({name: float(r + step) for name in names}, step=step)
        for p in producers:
            p.close(timeout=120)
        stats = [p.stats() for p in producers]
    finally:
        assert collector.stop() == 0
    assert all(s["unacked"] == 0 and s["dropped_late"] == 0 for s in stats), stats[0]
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["step"] for r in records] == list(range(STEPS))
    partial = [r["step"] for r in records if r["partial"]]
    assert partial == []
    mean = sum(range(RANKS)) / RANKS
    for r in records:
        assert r["metrics"]["flow/m0"] == mean + r["step"], r["step"]
    text = log.read_text()
    assert "0 late" in text.splitlines()[-1] or " late" not in text.splitlines()[-1]


def test_a_producer_held_back_sends_each_message_once(tmp_path) -> None:
    """A run whose other roles may still be starting (nothing declared) keeps its first steps
    open for ``settle_s``; a producer logging every millisecond fills the window at once and
    is held back. What it sent meanwhile is kept and applied as steps go out, so it sends
    each message once. (Dropped and asked for again, 2,000 ``log()`` calls became 12,948
    messages.)"""
    out = tmp_path / "out.jsonl"
    config = {"track_with": ["jsonl"], "tracker_kwargs": {"jsonl": {"path": str(out)}}}
    bind = f"tcp://127.0.0.1:{free_port()}"
    log = tmp_path / "collector.log"
    collector = start_collector(config, bind=bind, stderr=log.open("w"), stdout=subprocess.DEVNULL)
    data = {f"flow/m{i}": float(i) for i in range(NAMES)}
    try:
        producer = Producer(bind, run="burst", role="actor_train")
        for step in range(STEPS):
            producer.log(data, step=step)
            time.sleep(0.001)
        producer.close(timeout=60)
        stats = producer.stats()
    finally:
        assert collector.stop() == 0
    assert stats["unacked"] == 0 and stats["resent_messages"] == 0, stats
    # at most one data message per log(); the rest are its hello, heartbeats and goodbye
    assert stats["sent_messages"] < 1.1 * STEPS, stats
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["step"] for r in records] == list(range(STEPS))
    assert not any(r["partial"] for r in records)
    assert "queue full" not in log.read_text()
