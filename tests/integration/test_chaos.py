"""Chaos: a multi-rank job through a root and two relays while ranks are restarted,
collectors are SIGKILLed, the root's disk fills up and frees, and garbage arrives on every
socket. Every emitted step is checked against numpy: exact and complete, or flagged partial
naming the missing ranks, with the present ranks' data exact. Never wrong and complete.

Marked slow: ``make test-slow`` or
``scripts/in-netns.sh .venv/bin/python -m pytest -m slow tests/integration/test_chaos.py``.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import time
from pathlib import Path

import pytest
import zmq

from rlpulse.collector.launch import start_collector
from tests.integration.collectors import SPAWN, relay
from tests.integration.workload import expected, run_rank
from tests.support.net import free_port

RANKS, STEPS, RUN = 4, 60, "chaos"
LAYOUT = [("actor_train", r) for r in range(RANKS)]


def root_config(tmp_path: Path, state: Path) -> dict:
    return {
        "track_with": ["jsonl"],
        "tracker_kwargs": {"jsonl": {"path": str(tmp_path / "root.jsonl")}},
        "state_dir": str(state),
        "settle_s": 0,
        "grace_s": 120,
        "liveness_s": 60,
        "checkpoint_s": 0.5,
        "segment_bytes": 256 * 1024,
    }


def garbage(address: str, rng: random.Random) -> None:
    """A burst of junk frames: random bytes, truncated msgpack, a lying header."""
    ctx = zmq.Context.instance()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(address)
    for _ in range(20):
        sock.send(bytes(rng.randrange(256) for _ in range(rng.randrange(1, 300))))
    sock.send(b"\x94\x16\x01\x02")  # a metrics tag with nothing behind it
    time.sleep(0.2)
    sock.close()


def tmpfs(path: Path, size: str) -> bool:
    path.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        return False
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)])
    return done.returncode == 0


@pytest.mark.slow
def test_chaos_never_wrong_and_complete(tmp_path) -> None:
    rng = random.Random(7)
    disk = tmp_path / "disk"
    mounted = tmpfs(disk, "16m")
    state = disk / "root-state"
    root_bind = f"tcp://127.0.0.1:{free_port()}"
    log = (tmp_path / "root.log").open("a")
    config = root_config(tmp_path, state)

    def start_root():
        return start_collector(config, bind=root_bind, stderr=log, stdout=subprocess.DEVNULL)

    root = start_root()
    binds = [f"tcp://127.0.0.1:{free_port()}" for _ in range(2)]
    relays = [relay(tmp_path, f"relay{i}", root_bind, binds[i]) for i in range(2)]
    procs = {
        rank: SPAWN.Process(
            target=run_rank,
            args=(binds[rank % 2], RUN, "actor_train", rank, RANKS, STEPS),
            kwargs={"pause": 0.1, "close_timeout_s": 90, "die_mid": 20 if rank == 1 else None},
        )
        for _, rank in LAYOUT
    }
    for p in procs.values():
        p.start()
    try:
        # A rank dies halfway through step 20 and its restart logs step 20 again.
        procs[1].join(120)
        assert procs[1].exitcode == -9
        procs[1] = SPAWN.Process(
            target=run_rank,
            args=(binds[1], RUN, "actor_train", 1, RANKS, STEPS),
            kwargs={"pause": 0.1, "close_timeout_s": 90, "first_step": 20},
        )
        procs[1].start()
        garbage(root_bind, rng)
        garbage(binds[0], rng)
        # The root is killed and comes back on its state_dir; so is a relay.
        time.sleep(1.0)
        root.proc.kill()
        root.proc.wait()
        time.sleep(0.5)
        root = start_root()
        relays[0].proc.kill()
        relays[0].proc.wait()
        relays[0] = relay(tmp_path, "relay0", root_bind, binds[0])
        garbage(binds[1], rng)
        if mounted:  # the root's disk fills up, then frees
            filler = disk / "filler"
            with filler.open("wb") as f, pytest.raises(OSError):
                while True:
                    f.write(b"\0" * (1 << 20))
                    f.flush()
            time.sleep(3.0)
            filler.unlink()
        for p in procs.values():
            p.join(180)
            assert p.exitcode == 0
        for r in relays:
            assert r.stop() == 0
        assert root.stop() == 0
    finally:
        for r in relays:
            r.kill()
        root.kill()
        if mounted:
            subprocess.run(["umount", "-l", str(disk)])
    # Every fault really happened.
    root_log = (tmp_path / "root.log").read_text()
    relay_log = (tmp_path / "relay1.log").read_text()
    assert "recovered from" in root_log and "registered from a new process" in relay_log
    assert "rejected a malformed message" in root_log
    if mounted:
        assert "cannot write the state" in root_log
    records = [json.loads(line) for line in (tmp_path / "root.jsonl").read_text().splitlines()]
    mine = [r for r in records if r["run"] == RUN]
    assert [r["step"] for r in mine] == list(range(STEPS)), "every step once, in order"
    for record in mine:
        missing = set(record["missing"])
        present = [(role, rank) for role, rank in LAYOUT if f"{role}/{rank}" not in missing]
        assert record["partial"] == bool(missing)
        if not record["partial"]:
            assert record["ranks"] == RANKS, record["step"]
        want = expected(present, record["step"])
        for name, value in want.items():
            got = record["metrics"][name]
            assert got == pytest.approx(value, rel=1e-9, abs=1e-12), (record["step"], name)
