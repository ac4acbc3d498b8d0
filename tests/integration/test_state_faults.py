"""Damaged state under ``state_dir`` between a kill and a restart: never a wrong number, never a
silent loss (issue 22, items 2, 11 and 12). Real collector processes, real SIGKILLs, the files
damaged on disk as a bad sector or an operator would."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from rlpulse.collector.durability.segmentlog import HEADER
from rlpulse.producer import Producer
from rlpulse.producer.config import ProducerConfig
from tests.integration.collectors import Daemon, Refused, Setup
from tests.support.segments import segment_records


def producer(setup: Setup, rank: int, world_size: int) -> Producer:
    return Producer(
        setup.bind,
        run="faults",
        role="actor_train",
        rank=rank,
        world_size=world_size,
        config=ProducerConfig(close_timeout_s=10),
    )


def value(rank: int, step: int) -> float:
    return 10.0 * step + rank


def flip(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x5A
    path.write_bytes(bytes(data))


def last_segment(directory: Path) -> Path:
    return sorted(directory.glob("*.log"))[-1]


# ---------------------------------------------------------------------- item 2


@pytest.mark.parametrize("damage", ["flip", "truncate", "flip_before_cut"])
def test_a_write_ahead_log_cut_short_never_gives_a_complete_wrong_step(tmp_path, damage) -> None:
    setup = Setup(tmp_path)
    collector = setup.started()
    p0, p1 = producer(setup, 0, 2), producer(setup, 1, 2)
    for step in range(10):
        p0.log({"x": value(0, step)}, step=step)
    for step in range(5):
        p1.log({"x": value(1, step)}, step=step)
    assert p0.flush(30) and p1.flush(30)  # acknowledged: in the write-ahead log
    setup.wait_lines(4)  # steps 0-3 complete; 4-9 wait for rank 1 in the log
    time.sleep(1.0)  # a checkpoint records both producers' progress
    collector.kill()

    wal = last_segment(setup.state / "wal")
    cut = json.loads((setup.state / "checkpoint.json").read_text())["wal"]
    needed = [(o, n) for o, n in segment_records(wal) if o >= cut[1]]
    assert needed, "no open step in the log: nothing to damage"
    if damage == "flip":  # one byte inside the first record open steps need
        offset, size = needed[0]
        flip(wal, offset + HEADER.size + (size - HEADER.size) // 2)
    elif damage == "flip_before_cut":  # issue 38, item 1: a record no open step needs
        before = [(o, n) for o, n in segment_records(wal) if o + n <= cut[1]]
        assert before, "nothing before the checkpoint's cut in the last segment"
        offset, size = before[-1]
        flip(wal, offset + HEADER.size + (size - HEADER.size) // 2)
    else:  # the last acknowledged record loses its second half
        offset, size = needed[-1]
        with wal.open("r+b") as f:
            f.truncate(offset + size // 2)
    damaged = wal.read_bytes()

    restarted = setup.start()
    if damage == "flip_before_cut":  # nothing lost: it starts, and cuts nothing
        assert isinstance(restarted, Daemon), restarted
        assert wal.read_bytes()[: len(damaged)] == damaged
    if isinstance(restarted, Refused):
        # Refusing is safe: it names the file and what to do, and leaves the state as it was.
        assert restarted.returncode == 2, restarted.stderr
        assert "Traceback" not in restarted.stderr
        assert str(wal) in restarted.stderr and "mv " in restarted.stderr, restarted.stderr
        assert wal.read_bytes() == damaged
        p0.close(0.1)
        p1.close(0.1)
        # The fix it names works: a fresh state directory starts.
        setup.state.rename(tmp_path / "state.damaged")
        setup.started().stop()
        return
    # Starting is safe only if no step comes out complete without all its inputs.
    for step in range(10, 13):
        p0.log({"x": value(0, step)}, step=step)
    for step in range(5, 13):
        p1.log({"x": value(1, step)}, step=step)
    p0.close()
    p1.close()
    restarted.stop()
    got = {r["step"]: r for r in setup.lines()}
    assert sorted(got) == list(range(13)), sorted(got)
    for step, record in got.items():
        if not record["partial"]:
            assert record["metrics"]["x"] == pytest.approx(value(0, step) + 0.5), step
    if damage == "flip_before_cut":
        assert not any(r["partial"] for r in got.values())


# ---------------------------------------------------------------------- item 11


@pytest.mark.parametrize("damage", ["flip", "truncate"])
def test_a_damaged_outbox_tail_neither_stalls_a_sink_nor_repeats_steps(tmp_path, damage) -> None:
    setup = Setup(tmp_path)
    collector = setup.started()
    p = producer(setup, 0, 1)
    for step in range(20):
        p.log({"x": value(0, step)}, step=step)
    assert p.flush(30)
    setup.wait_lines(19)  # step 19 completes when step 20 is logged
    time.sleep(1.0)  # the sink's cursor and a checkpoint are saved past every step
    collector.kill()

    outbox = last_segment(setup.state / "outbox")
    offset, size = segment_records(outbox)[-1]
    if damage == "flip":
        flip(outbox, offset + size - 5)
    else:
        with outbox.open("r+b") as f:
            f.truncate(offset + size // 2)

    collector = setup.started()
    for step in range(20, 40):
        p.log({"x": value(0, step)}, step=step)
    p.close()
    deadline = time.monotonic() + 60
    while len(setup.lines()) < 40 and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)  # long enough for a repeating warning to show
    assert collector.stop() == 0
    got = setup.lines()
    assert [r["step"] for r in got] == list(range(40))  # each step once, in order
    assert all(not r["partial"] and r["metrics"]["x"] == value(0, r["step"]) for r in got)
    log = collector.log.read_text()
    warnings = [line for line in log.splitlines() if "corrupt" in line or "torn" in line]
    assert 1 <= len(warnings) <= 2, warnings


# ---------------------------------------------------------------------- item 12


@pytest.mark.parametrize("damaged", ["checkpoint.json", "cursors/jsonl.json"])
def test_a_damaged_checkpoint_or_cursor_exits_2_naming_the_file_and_the_fix(
    tmp_path, damaged
) -> None:
    setup = Setup(tmp_path)
    collector = setup.started()
    with producer(setup, 0, 1) as p:
        for step in range(3):
            p.log({"x": value(0, step)}, step=step)
    setup.wait_lines(3)
    assert collector.stop() == 0
    path = setup.state / damaged
    text = path.read_text()
    path.write_text(text[: len(text) // 2])  # cut mid-document

    refused = setup.start()
    if isinstance(refused, Daemon):
        refused.stop()
        pytest.fail(f"the collector started from a damaged {damaged}")
    assert refused.returncode == 2, refused.stderr
    assert "Traceback" not in refused.stderr, refused.stderr
    assert str(path) in refused.stderr, refused.stderr
    assert "mv " in refused.stderr or "delete it" in refused.stderr, refused.stderr


# ---------------------------------------------------------------------- issue 38, item 13


def test_a_second_collector_on_a_live_state_dir_is_refused_and_a_dead_ones_lock_is_not(
    tmp_path,
) -> None:
    setup = Setup(tmp_path)
    first = setup.started()
    (tmp_path / "second").mkdir()
    second = Setup(tmp_path / "second", state_dir=str(setup.state))  # another port
    p0 = producer(setup, 0, 1)
    for step in range(3):
        p0.log({"x": value(0, step)}, step=step)
    assert p0.flush(30)
    time.sleep(0.5)  # a checkpoint or two
    listing = sorted(p.name for p in setup.state.iterdir())

    refused = second.start()
    assert isinstance(refused, Refused), "a second collector started on a live state_dir"
    assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused.stderr
    line = refused.stderr.strip().splitlines()[-1]
    assert f"is in use by another collector or relay (pid {first.proc.pid}" in line, line
    assert sorted(p.name for p in setup.state.iterdir()) == listing  # nothing written there
    assert (setup.state / "lock").read_text() == f"{first.proc.pid}\n"
    p0.close(10)
    setup.wait_lines(3)

    first.kill()  # its lock file stays; the kernel dropped the lock with the process
    again = second.started()
    assert again.stop() == 0
    assert [line["step"] for line in setup.lines()] == [0, 1, 2]
