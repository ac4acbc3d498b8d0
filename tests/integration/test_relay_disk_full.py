"""A relay whose ``state_dir`` fills (issue 38, item 3), for real: a root, two relays (one on
a small tmpfs that the test fills for longer than the root's ``liveness_s``), and ranks behind
both, all separate processes on loopback.

Before: the stalled relay stopped heartbeating, the root presumed its ranks dead after
``liveness_s`` and emitted the steps waiting for them partial; nothing on the root said why.
Now the relay keeps heartbeating with its disk state, the root's /metrics shows it, and every
step is complete and exact.
"""

from __future__ import annotations

import json
import subprocess
import time

import pytest

from rlpulse.collector.launch import start_collector
from tests.integration.collectors import SPAWN
from tests.integration.workload import expected, run_rank
from tests.support.disk import fill, small_disk
from tests.support.net import free_port
from tests.support.prom import scrape
from tests.support.waiting import eventually

RANKS, STEPS, LIVENESS_S, STALL_S = 4, 150, 3.0, 8.0
LAYOUT = [("actor_train", r) for r in range(RANKS)]


def test_a_relay_with_a_full_state_disk_keeps_its_ranks_alive_and_says_so(tmp_path) -> None:
    port = free_port()
    out = tmp_path / "root.jsonl"
    common = {"settle_s": 1, "grace_s": 120, "max_open_steps": 1000}
    root = start_collector(
        {
            **common,
            "track_with": ["jsonl", "prometheus"],
            "tracker_kwargs": {"jsonl": {"path": str(out)}, "prometheus": {"port": port}},
            "liveness_s": LIVENESS_S,
        },
        stderr=(tmp_path / "root.log").open("w"),
        stdout=subprocess.DEVNULL,
    )
    with small_disk(tmp_path / "disk", "8m") as disk:
        relays = [
            start_collector(
                {
                    **common,
                    "upstream": root.address,
                    "state_dir": str(where / "state"),
                    "liveness_s": 60,
                    "segment_bytes": 256 * 1024,
                },
                stderr=(tmp_path / f"relay{i}.log").open("w"),
                stdout=subprocess.DEVNULL,
            )
            for i, where in enumerate((disk, tmp_path))
        ]
        procs = [
            SPAWN.Process(
                target=run_rank,
                args=(relays[rank % 2].address, "stall", role, rank, RANKS, STEPS),
                kwargs={"pause": 0.05, "close_timeout_s": 120},
            )
            for role, rank in LAYOUT
        ]
        try:
            for p in procs:
                p.start()
            eventually(  # every rank under way through both relays
                lambda: out.exists() and len(out.read_text().splitlines()) >= 10,
                "the first steps at the root",
                120,
            )
            filler = fill(disk)  # relay 0 can no longer write its state
            eventually(
                lambda: scrape(port).get("rlpulse_collector_relays_state_unwritable") == 1,
                "the root to hear that the relay's state_dir is full",
                15,
            )
            time.sleep(STALL_S)  # well past the root's liveness_s
            stalled = scrape(port)
            filler.unlink()
            for p in procs:
                p.join(180)
                assert p.exitcode == 0
            eventually(
                lambda: out.exists() and len(out.read_text().splitlines()) >= STEPS,
                "every step at the root",
                120,
            )
            eventually(
                lambda: scrape(port)["rlpulse_collector_relays_state_unwritable"] == 0,
                "the root to hear that the relay's state_dir is writable again",
                15,
            )
        finally:
            for p in procs:
                p.kill()
            for r in relays:
                r.stop()
    assert root.stop() == 0

    assert stalled["rlpulse_collector_relay_disk_errors_total"] > 0
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["step"] for r in records] == list(range(STEPS))
    partial = [r["step"] for r in records if r["partial"]]
    assert not partial, f"{len(partial)} of {STEPS} steps partial: {partial[:10]}..."
    for record in records:
        assert record["ranks"] == RANKS
        for name, value in expected(LAYOUT, record["step"]).items():
            assert record["metrics"][name] == pytest.approx(value, rel=1e-12, abs=1e-12), name
