"""Nothing is sent twice over a live connection (issue 38, item 9): producers resend only
what the collector asks for, and wait while it is silent. Before, every producer resent its
whole unacknowledged buffer every ``resend_s`` (2 s) while the collector was frozen."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

from rlpulse.collector.launch import start_collector
from rlpulse.producer import Producer
from tests.support.net import free_port

RANKS, NAMES = 2, 20


def test_a_frozen_collector_gets_nothing_twice(tmp_path) -> None:
    out = tmp_path / "out.jsonl"
    config = {
        "track_with": ["jsonl"],
        "tracker_kwargs": {"jsonl": {"path": str(out)}},
        "liveness_s": 60,
        "grace_s": 60,
    }
    bind = f"tcp://127.0.0.1:{free_port()}"
    log = tmp_path / "collector.log"
    collector = start_collector(config, bind=bind, stderr=log.open("w"), stdout=subprocess.DEVNULL)
    roles = {"actor_train": RANKS}
    names = [f"resend/m{i}" for i in range(NAMES)]
    producers = [
        Producer(
            bind, run="frozen", role="actor_train", rank=r, world_size=RANKS, expected_roles=roles
        )
        for r in range(RANKS)
    ]
    try:
        for step in range(50):
            for r, p in enumerate(producers):
                p.log({n: float(r + step) for n in names}, step=step)
        assert all(p.flush(10) for p in producers)
        os.kill(collector.proc.pid, signal.SIGSTOP)
        try:
            for step in range(50, 100):  # sent, and unacknowledged while it is frozen
                for r, p in enumerate(producers):
                    p.log({n: float(r + step) for n in names}, step=step)
                time.sleep(0.01)
            time.sleep(7.0)  # 3.5 x resend_s
        finally:
            os.kill(collector.proc.pid, signal.SIGCONT)
        for p in producers:
            p.close(timeout=30)
        stats = [p.stats() for p in producers]
    finally:
        assert collector.stop() == 0
    assert [s["resent_messages"] for s in stats] == [0] * RANKS, stats
    assert all(s["unacked"] == s["dropped_send"] == s["unconfirmed"] == 0 for s in stats)
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["step"] for r in records] == list(range(100))
    assert not any(r["partial"] for r in records)
    mean = sum(range(RANKS)) / RANKS
    assert all(r["metrics"]["resend/m0"] == mean + r["step"] for r in records)
    assert " 0 duplicates" in log.read_text().splitlines()[-1]
