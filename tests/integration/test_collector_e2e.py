"""A real collector process, real producer processes, real sockets."""

from __future__ import annotations

import json
import os
import random
import re
import subprocess
import time
from pathlib import Path

import msgpack
import zmq

from rlpulse.collector.launch import start_collector
from rlpulse.schemas import protocol_v1 as V1
from tests.integration.collectors import SPAWN, assert_matches, read_jsonl
from tests.integration.workload import expected, run_rank


def start(tmp_path: Path, **extra):
    out = tmp_path / "out.jsonl"
    log = (tmp_path / "collector.log").open("w")
    config = {"track_with": ["jsonl"], "tracker_kwargs": {"jsonl": {"path": str(out)}}, **extra}
    return (
        start_collector(config, stderr=log, stdout=subprocess.DEVNULL),
        out,
        tmp_path / "collector.log",
    )


def spawn(address: str, run: str, layout: list[tuple[str, int, int]], steps: int, **kwargs) -> list:
    procs = [
        SPAWN.Process(
            target=run_rank,
            args=(address, run, role, rank, ws, steps),
            kwargs=kwargs.get(f"{role}/{rank}", {}),
        )
        for role, rank, ws in layout
    ]
    for proc in procs:
        proc.start()
    return procs


LAYOUT = [("actor_train", r, 6) for r in range(6)] + [("critic", r, 2) for r in range(2)]


def test_eight_producer_processes_every_step_once_with_pooled_values(tmp_path) -> None:
    collector, out, _ = start(tmp_path, grace_s=30)
    procs = spawn(collector.address, "e2e", LAYOUT, steps=25)
    for proc in procs:
        proc.join(60)
        assert proc.exitcode == 0
    assert collector.stop() == 0
    records = read_jsonl(out)
    assert [r["step"] for r in records] == list(range(25))
    ranks = [(role, rank) for role, rank, _ in LAYOUT]
    for record in records:
        assert not record["partial"] and record["ranks"] == 8
        assert_matches(record, expected(ranks, record["step"]))


def test_a_killed_rank_gives_partial_steps_naming_it(tmp_path) -> None:
    collector, out, _ = start(tmp_path, grace_s=1.0, liveness_s=2.0)
    layout = [("actor_train", r, 3) for r in range(3)]
    procs = spawn(
        collector.address,
        "kill",
        layout,
        steps=10,
        pause=0.05,
        **{"actor_train/2": {"die_after": 4}},
    )
    for proc in procs:
        proc.join(60)
    assert procs[2].exitcode == -9 and procs[0].exitcode == 0
    time.sleep(3.0)  # liveness runs out for the dead rank
    assert collector.stop() == 0
    records = {r["step"]: r for r in read_jsonl(out)}
    assert sorted(records) == list(range(10))
    for step in range(4):
        assert not records[step]["partial"]
        assert_matches(records[step], expected([(r, k) for r, k, _ in layout], step))
    for step in range(4, 10):
        assert records[step]["partial"] and records[step]["missing"] == ["actor_train/2"]
    # the dead rank's step-4 data arrived before it died, so it is in the partial step
    assert_matches(records[4], expected([(r, k) for r, k, _ in layout], 4))
    assert_matches(records[7], expected([("actor_train", 0), ("actor_train", 1)], 7))


def garbage(address: str, seconds: float) -> dict[str, int]:
    """Send hostile and broken messages for a while; return what was sent by kind."""
    rng = random.Random(7)
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 1000)
    sock.connect(address)
    nan_entry = V1.pack_entry(
        0,
        1.0,
        ["critic/advantages"],
        bytes([1]),
        b"\x00" * 8 + b"\x00\x00\x00\x00\x00\x00\xf8\x7f" + b"\x00" * 16,
    )
    kinds = {
        "bad_msgpack": lambda: (
            b"\xc1"  # never valid in msgpack; random bytes can parse by chance
            + bytes(rng.getrandbits(8) for _ in range(rng.randint(0, 63)))
        ),
        "bad_envelope": lambda: msgpack.packb({"v": 1, "t": "nope", "p": 1, "q": 0}),
        "bad_version": lambda: msgpack.packb({"v": 99, "t": "metrics", "p": 1, "q": 0, "e": []}),
        "bad_values": lambda: V1.encode_metrics(1234, 0, [nan_entry]),
        "oversized": lambda: b"\x91" + b"\x00" * (2 * 1024 * 1024),
    }
    sent = dict.fromkeys(kinds, 0)
    sent["bad_frames"] = 0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        kind = rng.choice([*kinds, "bad_frames"])
        if kind == "bad_frames":
            sock.send_multipart([b"a", b"b"])
        else:
            sock.send(kinds[kind]())
        sent[kind] += 1
        time.sleep(0.005)
    sock.close()
    ctx.term()
    return sent


def test_garbage_on_the_live_socket_is_counted_and_honest_results_unchanged(tmp_path) -> None:
    collector, out, log = start(tmp_path, grace_s=30, max_message_bytes=1024 * 1024)
    layout = [("actor_train", r, 4) for r in range(4)]
    procs = spawn(collector.address, "hostile", layout, steps=20, pause=0.05)
    sent = garbage(collector.address, 1.5)
    for proc in procs:
        proc.join(60)
        assert proc.exitcode == 0
    assert collector.proc.poll() is None  # still up
    assert collector.stop() == 0
    records = read_jsonl(out)
    assert [r["step"] for r in records] == list(range(20))
    for record in records:
        assert not record["partial"]
        assert_matches(record, expected([(r, k) for r, k, _ in layout], record["step"]))
    summary = log.read_text()
    counted = json.loads(re.search(r"malformed (\{.*?\})", summary).group(1))
    assert counted == {kind: n for kind, n in sent.items() if n}, (counted, sent)
    assert "rejected a malformed message" in summary


def test_sigint_flushes_open_steps_and_exits_zero(tmp_path) -> None:
    collector, out, _ = start(tmp_path, grace_s=600)
    procs = spawn(
        collector.address, "sigint", [("actor_train", 0, 2)], steps=3
    )  # rank 1 never comes
    for proc in procs:
        proc.join(60)
    time.sleep(0.3)
    collector.proc.send_signal(2)
    assert collector.proc.wait(30) == 0
    records = read_jsonl(out)
    assert [r["step"] for r in records] == [0, 1, 2]
    assert all(r["partial"] and r["missing"] == ["actor_train/1"] for r in records)


def test_bad_config_fails_at_start_with_the_field_named(tmp_path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("track_with: [jsonl]\ntracker_kwargs: {jsonl: {}}\n")
    proc = subprocess.run(
        [os.sys.executable, "-m", "rlpulse.collector", "--config", str(bad)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2 and "tracker_kwargs.jsonl.path" in proc.stderr
