"""Two tiers: relays merge their own ranks and forward states to a root, whose output is what
one collector of every rank would write: exact, every step once, nothing partial, also when a
relay is SIGKILLed and restarted on its state_dir."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from tests.integration.collectors import SPAWN, relay, root, wait_for_steps
from tests.integration.workload import expected, run_rank
from tests.support.net import free_port

RANKS, STEPS = 6, 40
LAYOUT = [("actor_train", r) for r in range(RANKS)]


def ranks(addresses: list[str], run: str, **kwargs) -> list:
    """Ranks 0..RANKS-1, split over ``addresses`` round-robin, started together."""
    procs = [
        SPAWN.Process(
            target=run_rank,
            args=(addresses[rank % len(addresses)], run, role, rank, RANKS, STEPS),
            kwargs=kwargs,
        )
        for role, rank in LAYOUT
    ]
    for p in procs:
        p.start()
    return procs


def check(out: Path, run: str) -> None:
    records = [json.loads(line) for line in out.read_text().splitlines()]
    mine = [r for r in records if r["run"] == run]
    assert [r["step"] for r in mine] == list(range(STEPS)), "every step once, in order"
    for record in mine:
        assert not record["partial"] and record["ranks"] == RANKS, record["missing"]
        want = expected(LAYOUT, record["step"])
        for name, value in want.items():
            assert record["metrics"][name] == pytest.approx(value, rel=1e-12, abs=1e-12), name


def test_two_relays_and_a_root_write_what_one_collector_would(tmp_path) -> None:
    top, out = root(tmp_path)
    relays = [
        relay(tmp_path, f"relay{i}", top.address, f"tcp://127.0.0.1:{free_port()}")
        for i in range(2)
    ]
    procs = ranks([r.address for r in relays], "tiers", pause=0.01)
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    wait_for_steps(out, "tiers", STEPS)
    for r in relays:
        assert r.stop() == 0
    assert top.stop() == 0
    check(out, "tiers")


def test_a_relay_killed_and_restarted_on_its_state_dir_loses_and_repeats_nothing(
    tmp_path,
) -> None:
    top, out = root(tmp_path)
    binds = [f"tcp://127.0.0.1:{free_port()}" for _ in range(2)]
    relays = [relay(tmp_path, f"relay{i}", top.address, binds[i]) for i in range(2)]
    procs = ranks(binds, "crash", pause=0.05, close_timeout_s=60)
    # Every rank has reached its relay once the root has a step (a step needs all six): on a
    # loaded machine the rank processes took longer than a fixed 2 s to start, so the kill
    # came before they had connected, and those closing while the relay was down gave up as
    # producers that never reached a collector (80 calls lost).
    wait_for_steps(out, "crash", 2)
    relays[0].proc.kill()  # SIGKILL mid-run: nothing flushed, nothing said
    relays[0].proc.wait()
    time.sleep(1.0)
    relays[0] = relay(tmp_path, "relay0", top.address, binds[0])
    for p in procs:
        p.join(180)
        assert p.exitcode == 0
    wait_for_steps(out, "crash", STEPS)
    for r in relays:
        assert r.stop() == 0
    assert top.stop() == 0
    check(out, "crash")
