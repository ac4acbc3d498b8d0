"""Workers that start together and live for a second: every rank registers, every step is
whole, nothing is left unacknowledged (issue 17: ranks were lost when a producer's first hello
went out while ZeroMQ was still handshaking and nothing sent it again)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest
import zmq.auth

from rlpulse.collector.launch import start_collector
from rlpulse.producer import Producer
from rlpulse.wire.transport import CurveKeys, load_curve

ROOT = Path(__file__).resolve().parents[2]


def collect(tmp_path: Path, **extra: object) -> tuple:
    out = tmp_path / "out.jsonl"
    log = tmp_path / "collector.log"
    config = {"track_with": ["jsonl"], "tracker_kwargs": {"jsonl": {"path": str(out)}}, **extra}
    return start_collector(config, stderr=log.open("w")), out, log


def curve_keys(tmp_path: Path) -> tuple[dict[str, str], CurveKeys]:
    """A collector key pair and one allow-listed worker key (public half only on the
    collector's side), as the README lays them out."""
    for folder in ("server", "worker", "clients"):
        (tmp_path / folder).mkdir()
    server_public, server_secret = zmq.auth.create_certificates(tmp_path / "server", "collector")
    worker_public, worker_secret = zmq.auth.create_certificates(tmp_path / "worker", "worker")
    shutil.copy(worker_public, tmp_path / "clients")
    config = {"server_cert": str(server_secret), "clients_dir": str(tmp_path / "clients")}
    return config, load_curve(str(server_public), str(worker_secret))


def check_whole(out: Path, runs: dict[str, int], steps: int) -> None:
    records = [json.loads(line) for line in out.read_text().splitlines()]
    got = {(r["run"], r["step"]): r for r in records}
    assert len(got) == len(records), "a step was emitted twice"
    assert set(got) == {(run, s) for run in runs for s in range(steps)}
    bad = {k: r["missing"] for k, r in got.items() if r["partial"] or r["ranks"] != runs[k[0]]}
    assert not bad, f"steps missing ranks: {bad}"


@pytest.mark.parametrize("secure", [False, True], ids=["plain", "curve"])
def test_short_lived_producers_started_together_all_register(tmp_path, secure: bool) -> None:
    """16 producers per round released by a barrier, 3 steps each, then close: 8 rounds.
    With CurveZMQ the handshake is longer, so a hello sent as soon as TCP connects is
    refused more often: the case that lost most ranks."""
    curve = None
    if secure:
        server, curve = curve_keys(tmp_path)
        collector, out, log = collect(tmp_path, curve=server)
    else:
        collector, out, log = collect(tmp_path)
    ranks, rounds, steps = 16, 8, 3
    stats: list[dict[str, int]] = []

    def worker(run: str, rank: int, gate: threading.Barrier) -> None:
        gate.wait()
        p = Producer(
            collector.address,
            run=run,
            role="actor_train",
            rank=rank,
            world_size=ranks,
            curve=curve,
        )
        for step in range(steps):
            p.log({"actor/pg_loss": float(rank + step)}, step=step)
        p.close()
        stats.append(p.stats())

    try:
        for n in range(rounds):
            gate = threading.Barrier(ranks)
            threads = [
                threading.Thread(target=worker, args=(f"round{n}", r, gate)) for r in range(ranks)
            ]
            for t in threads:
                t.start()
            for t in threads:
                t.join(30)
    finally:
        assert collector.stop() == 0
    assert len(stats) == ranks * rounds
    assert all(s["unacked"] == 0 and s["dropped_send"] == 0 for s in stats), stats
    check_whole(out, {f"round{n}": ranks for n in range(rounds)}, steps)
    assert "0 entries never applied" in log.read_text()


WORKER = textwrap.dedent(
    """
    import sys
    from rlpulse.producer import Producer, Weighted
    from rlpulse.schemas import metrics as M

    rank = int(sys.argv[1])
    p = Producer(sys.argv[2], run=sys.argv[3], role="actor_train", rank=rank, world_size=8)
    for step in range(6):
        p.log({M.ACTOR_PG_LOSS.name: Weighted(0.1 * rank, 100), M.ACTOR_LR.name: 1e-5}, step=step)
    p.close()
    s = p.stats()
    sys.exit(0 if s["unacked"] == 0 and s["dropped_send"] == 0 else 3)
    """
)


def test_readme_worker_pattern_eight_processes_started_together(tmp_path) -> None:
    """The README's "Logging from a worker" pattern in 8 processes launched at once, 3 times."""
    collector, out, _ = collect(tmp_path)
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    try:
        for n in range(3):
            procs = [
                subprocess.Popen(
                    [sys.executable, str(script), str(r), collector.address, f"run{n}"], env=env
                )
                for r in range(8)
            ]
            assert [p.wait(60) for p in procs] == [0] * 8
    finally:
        assert collector.stop() == 0
    check_whole(out, {f"run{n}": 8 for n in range(3)}, 6)
