"""Behind a relay, what the root leaves out as late reaches the producer's ``stats()``
(issue 38, item 4: producers showed 0 dropped after the root had counted late entries)."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

from rlpulse.collector.launch import start_collector
from rlpulse.producer import Producer
from tests.support.net import free_port

STEPS = 10


def test_the_roots_late_verdict_reaches_a_producer_behind_a_relay(tmp_path: Path) -> None:
    config = {
        "track_with": ["jsonl"],
        "tracker_kwargs": {"jsonl": {"path": str(tmp_path / "root.jsonl")}},
        "settle_s": 0,
        "grace_s": 0.5,  # the root emits steps partial soon after the fast rank finishes them
        "liveness_s": 60,
    }
    root = start_collector(
        config, stderr=(tmp_path / "root.log").open("w"), stdout=subprocess.DEVNULL
    )
    bind = f"tcp://127.0.0.1:{free_port()}"
    relay = start_collector(
        {"upstream": root.address, "settle_s": 0, "grace_s": 60, "liveness_s": 60},
        bind=bind,
        stderr=(tmp_path / "relay.log").open("w"),
        stdout=subprocess.DEVNULL,
    )
    roles = {"actor_train": 2}
    try:
        fast = Producer(
            root.address, run="late", role="actor_train", rank=0, world_size=2, expected_roles=roles
        )
        slow = Producer(
            bind, run="late", role="actor_train", rank=1, world_size=2, expected_roles=roles
        )
        assert slow.flush(10)  # registered at the relay, and the relay at the root
        for step in range(STEPS):
            fast.log({"actor/clipfrac": 0.1}, step=step)
        fast.close(timeout=10)
        time.sleep(2.0)  # past the root's grace_s: every step goes out without rank 1
        for step in range(STEPS):
            slow.log({"actor/clipfrac": 0.2}, step=step)
        slow.step_done(STEPS)
        assert slow.flush(10)
        deadline = time.monotonic() + 10
        while slow.stats()["dropped_late"] < STEPS and time.monotonic() < deadline:
            time.sleep(0.5)  # the root's verdict comes back with a later acknowledgement
            slow.flush(5)
        stats = slow.stats()
        slow.close(timeout=10)
    finally:
        assert relay.stop() == 0
        assert root.stop() == 0
    last = (tmp_path / "root.log").read_text().splitlines()[-1]
    assert f" {STEPS} late" in last, last  # the root left them out, and said so
    assert stats["dropped_late"] == STEPS, stats
