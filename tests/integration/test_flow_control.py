"""Producers whose deliveries drift apart lose nothing: 16 producers in one process log 1,000
steps of 60 scalars as fast as they can, in lockstep. Their sender threads deliver at
different paces, so some run far ahead of the collector's ``max_open_steps`` window; the
collector holds those back (leaves them unacknowledged, then asks them to resend) instead of
emitting the laggards' steps partial and dropping their data as late."""

from __future__ import annotations

import json
import subprocess

from rlpulse.collector.launch import start_collector
from rlpulse.producer import Producer
from tests.integration.test_reliability import free_port

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
