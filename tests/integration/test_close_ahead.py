"""A rank that finishes far ahead of the others loses nothing at ``close()`` (issue 38, item
11). Two ranks on a fresh collector: rank 0 logs 400 steps at once and closes with the default
``close_timeout_s`` while rank 1 is still near the start. Rank 0 is held back by the open-step
window, as designed; a held-back producer is not a dead collector: its close hands what the
collector holds back over, and every step comes out complete and exact."""

from __future__ import annotations

import json
import re
import subprocess
import time

import pytest

from rlpulse.collector.launch import start_collector
from rlpulse.producer import Producer
from tests.support.net import free_port

STEPS = 400


@pytest.mark.parametrize("durable", [False, True], ids=["memory", "state_dir"])
def test_a_rank_far_ahead_closes_without_losing_its_data(tmp_path, durable: bool) -> None:
    out = tmp_path / "out.jsonl"
    config = {"track_with": ["jsonl"], "tracker_kwargs": {"jsonl": {"path": str(out)}}}
    if durable:  # acknowledged only once in the write-ahead log: a durable handover
        config["state_dir"] = str(tmp_path / "state")
    bind = f"tcp://127.0.0.1:{free_port()}"
    log = tmp_path / "collector.log"
    collector = start_collector(config, bind=bind, stderr=log.open("w"), stdout=subprocess.DEVNULL)
    roles = {"actor_train": 2}
    try:
        fast = Producer(
            bind, run="ahead", role="actor_train", rank=0, world_size=2, expected_roles=roles
        )
        slow = Producer(
            bind, run="ahead", role="actor_train", rank=1, world_size=2, expected_roles=roles
        )
        for step in range(STEPS):
            fast.log({"actor/clipfrac": 0.1}, step=step)
            time.sleep(0.005)  # a training loop's pace: messages leave one by one
        slow.log({"actor/clipfrac": 0.2}, step=0)
        started = time.monotonic()
        fast.close()  # default close_timeout_s: 2 s
        closed_in = time.monotonic() - started
        fast_stats = fast.stats()
        for step in range(1, STEPS):
            slow.log({"actor/clipfrac": 0.2}, step=step)
            time.sleep(0.002)
        slow.close(timeout=30)
        slow_stats = slow.stats()
    finally:
        assert collector.stop() == 0
    assert slow_stats["dropped_send"] == slow_stats["unconfirmed"] == 0, slow_stats
    assert fast_stats["dropped_send"] == 0 and fast_stats["unconfirmed"] == 0, fast_stats
    assert closed_in < 2.0  # acknowledged, not given up on
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["step"] for r in records] == list(range(STEPS))
    partial = [r["step"] for r in records if r["partial"]]
    assert partial == [], f"{len(partial)} of {STEPS} steps partial"
    assert all(abs(r["metrics"]["actor/clipfrac"] - 0.15) < 1e-12 for r in records)
    last = log.read_text().splitlines()[-1]
    dropped = re.search(r"producers dropped (\d+)", last)
    assert dropped is not None and dropped.group(1) == "0", last
