"""Durable state under faults, one piece at a time: failed writes leave nothing half written,
damage is judged against what was acknowledged, a damaged outbox is recovered and its losses
counted, and a failed jsonl write is written once (issue 22; the end-to-end versions, with real
kills and a real full disk, are in tests/integration/test_state_faults.py and
test_disk_full.py)."""

from __future__ import annotations

import errno
import json
import os
from collections.abc import Mapping
from pathlib import Path

import pytest

from rlpulse.collector.config import CollectorConfig
from rlpulse.collector.durability.durable import DurableState
from rlpulse.collector.durability.outbox import OutboxReader
from rlpulse.collector.durability.segmentlog import Position, SegmentLog, inspect, read_mark
from rlpulse.collector.durability.statefiles import StateError
from rlpulse.collector.durability.statelock import StateDirInUse
from rlpulse.collector.sinks.jsonl import JsonlSink
from rlpulse.schemas import protocol
from rlpulse.schemas.record import StepRecord
from tests.support.segments import segment_records

LIMITS = protocol.Limits(max_bytes=1 << 20, max_names=1000, max_name_length=200)


class FailingWrites:
    """``os.pwrite`` that writes ``partial`` bytes, then fails with ENOSPC ``times`` times."""

    def __init__(self, times: int, partial: int = 3) -> None:
        self.times = times
        self.partial = partial
        self.real = os.pwrite

    def __call__(self, fd: int, data: bytes, offset: int) -> int:
        if self.times:
            self.times -= 1
            self.real(fd, bytes(data[: self.partial]), offset)
            raise OSError(errno.ENOSPC, "No space left on device")
        return self.real(fd, data, offset)


class FailingAppends:
    """``os.write`` that writes ``partial`` bytes, then fails with ENOSPC ``times`` times."""

    def __init__(self, times: int, partial: int = 3) -> None:
        self.times = times
        self.partial = partial
        self.real = os.write

    def __call__(self, fd: int, data: bytes) -> int:
        if self.times:
            self.times -= 1
            self.real(fd, bytes(data[: self.partial]))
            raise OSError(errno.ENOSPC, "No space left on device")
        return self.real(fd, data)


class Replayed:
    """The aggregator and delivery sides of recovery, recording what they are given."""

    def __init__(self) -> None:
        self.emitted: list[int] = []
        self.messages = 0

    def handle(self, msg, now, position=None, replay=False) -> None:
        self.messages += 1

    def note_emitted(self, record: StepRecord) -> None:
        self.emitted.append(record.step)

    def oldest_position(self) -> object:
        return None

    def snapshot(self) -> dict:
        return {}

    def restore(self, snapshot: Mapping, now: float = 0.0) -> None:
        pass

    def note_replayed(self, msg) -> None:
        pass


def config(tmp_path: Path, **extra) -> CollectorConfig:
    return CollectorConfig(state_dir=str(tmp_path / "state"), **extra)


def step(n: int) -> StepRecord:
    return StepRecord(run="r", step=n, metrics={"x": float(n)})


# ---------------------------------------------------------------------- the log


def test_a_failed_flush_leaves_no_half_record_and_the_retry_writes_it_once(
    tmp_path, monkeypatch
) -> None:
    log = SegmentLog(tmp_path, segment_bytes=1 << 20, fsync=False, mark=True)
    log.append(b"first")
    log.flush()
    size = (tmp_path / f"{0:016d}.log").stat().st_size
    log.append(b"second")
    monkeypatch.setattr(os, "pwrite", FailingWrites(times=2))
    with pytest.raises(OSError):
        log.flush()
    assert (tmp_path / f"{0:016d}.log").stat().st_size == size  # cut back
    assert log.pending_bytes > 0 and read_mark(tmp_path) == Position(0, size)
    with pytest.raises(OSError):
        log.flush()
    log.flush()
    assert [p for _, p in log.read_from(Position(0, 0))] == [b"first", b"second"]
    assert read_mark(tmp_path) == log.flushed
    log.close()


def test_close_on_a_full_disk_reports_and_does_not_raise(tmp_path, monkeypatch, caplog) -> None:
    log = SegmentLog(tmp_path, segment_bytes=1 << 20, fsync=False)
    log.append(b"never written")
    monkeypatch.setattr(os, "pwrite", FailingWrites(times=100))
    log.close()
    log.close()
    assert "could not be written at close" in caplog.text


def test_a_cut_tail_sends_new_records_to_a_new_segment(tmp_path) -> None:
    log = SegmentLog(tmp_path, segment_bytes=1 << 20, fsync=False)
    for i in range(3):
        log.append(b"record %d" % i)
    log.close()
    segment = tmp_path / f"{0:016d}.log"
    segment.write_bytes(segment.read_bytes()[:-3])
    reopened = SegmentLog(tmp_path, segment_bytes=1 << 20, fsync=False)
    end = reopened.append(b"after")
    reopened.flush()
    assert end.segment == 1  # never below a reader that had reached the cut bytes
    assert [p for _, p in reopened.read_from(Position(0, 0))][-1] == b"after"


def test_inspect_tells_a_torn_tail_from_damage_in_the_middle(tmp_path) -> None:
    log = SegmentLog(tmp_path, segment_bytes=40, fsync=False)
    for i in range(6):
        log.append(b"r" * 30 + bytes([i]))
    log.close()
    first, last = log.segments()[0], log.segments()[-1]
    assert inspect(tmp_path, Position(first, 0)) == (log.flushed, None)
    path = tmp_path / f"{last:016d}.log"
    path.write_bytes(path.read_bytes()[:-2])
    _, damage = inspect(tmp_path, Position(first, 0))
    assert damage is not None and damage.last
    path = tmp_path / f"{first:016d}.log"
    data = bytearray(path.read_bytes())
    data[20] ^= 1
    path.write_bytes(bytes(data))
    _, damage = inspect(tmp_path, Position(first, 0))
    assert damage is not None and not damage.last and damage.path == path


# ---------------------------------------------------------------------- the write-ahead log


def wal_with_messages(tmp_path: Path, n: int) -> CollectorConfig:
    cfg = config(tmp_path)
    state = DurableState(tmp_path / "state", cfg)
    for pid in range(n):
        state.log_input(protocol.encode_done(pid + 1, 1, 0))
    state.commit()
    state.close()
    return cfg


def test_a_torn_tail_past_the_acknowledged_end_is_cut(tmp_path) -> None:
    cfg = wal_with_messages(tmp_path, 3)
    segment = (tmp_path / "state") / "wal" / f"{0:016d}.log"
    with segment.open("ab") as f:
        f.write(b"\x50\x00\x00\x00half a record")  # appended, never flushed nor acknowledged
    state = DurableState(tmp_path / "state", cfg)
    replayed = Replayed()
    assert state.recover(replayed, replayed, LIMITS, 0.0)["truncated_bytes"] > 0
    assert replayed.messages == 3


@pytest.mark.parametrize("damage", ["flip", "truncate", "boundary", "delete"])
def test_a_write_ahead_log_short_of_what_was_acknowledged_refuses_to_start(
    tmp_path, damage
) -> None:
    cfg = wal_with_messages(tmp_path, 3)
    segment = (tmp_path / "state") / "wal" / f"{0:016d}.log"
    offset, size = segment_records(segment)[1]
    data = bytearray(segment.read_bytes())
    if damage == "flip":
        data[offset + size - 1] ^= 1
        segment.write_bytes(bytes(data))
    elif damage == "truncate":
        segment.write_bytes(bytes(data[: offset + 3]))
    elif damage == "boundary":  # whole records gone: only the flushed mark tells
        segment.write_bytes(bytes(data[:offset]))
    else:
        segment.unlink()
    before = segment.read_bytes() if segment.exists() else None
    with pytest.raises(StateError) as refused:
        DurableState(tmp_path / "state", cfg)
    assert "write-ahead log" in str(refused.value) and "mv " in str(refused.value)
    assert str(segment) in str(refused.value)
    assert (segment.read_bytes() if segment.exists() else None) == before  # left as it was


class CheckpointedAt(Replayed):
    """Recovery's side with an open step whose first data is at ``oldest``."""

    def __init__(self, oldest: Position) -> None:
        super().__init__()
        self.oldest = oldest

    def oldest_position(self) -> object:
        return self.oldest


def test_damage_before_the_checkpoints_cut_is_never_cut_as_a_torn_tail(tmp_path, caplog) -> None:
    """Issue 38, item 1: a flipped byte in a record the checkpoint no longer needs was cut as a
    torn tail, taking every acknowledged record after it (the open steps' data) with it."""
    cfg = config(tmp_path)
    state = DurableState(tmp_path / "state", cfg)
    for pid in range(6):
        state.log_input(protocol.encode_done(pid + 1, 1, 0))
    state.commit()
    segment = (tmp_path / "state") / "wal" / f"{0:016d}.log"
    spans = segment_records(segment)
    state.maybe_checkpoint(CheckpointedAt(Position(0, spans[2][0])), Replayed(), [], force=True)
    state.close()
    data = bytearray(segment.read_bytes())
    data[spans[0][0] + spans[0][1] - 1] ^= 1  # a byte of a record before the cut
    segment.write_bytes(bytes(data))

    state = DurableState(tmp_path / "state", cfg)
    replayed = Replayed()
    counts = state.recover(replayed, replayed, LIMITS, 0.0)
    assert replayed.messages == 4 and counts["truncated_bytes"] == 0  # every record after it
    assert segment.read_bytes() == bytes(data)  # nothing cut
    assert f"{segment} is damaged at byte {spans[0][0]}" in caplog.text
    state.log_input(protocol.encode_done(7, 1, 0))  # new records follow the intact ones
    state.commit()
    state.close()
    replayed = Replayed()
    DurableState(tmp_path / "state", cfg).recover(replayed, replayed, LIMITS, 0.0)
    assert replayed.messages == 5


def test_a_second_state_on_one_state_dir_is_refused_until_the_first_closes(tmp_path) -> None:
    """Issue 38, item 13: nothing locked ``state_dir``; a second collector wrote into it."""
    cfg = config(tmp_path)
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / "lock").write_text("999999999\n")  # left by a dead process: stale
    first = DurableState(tmp_path / "state", cfg)
    assert (tmp_path / "state" / "lock").read_text() == f"{os.getpid()}\n"
    with pytest.raises(StateDirInUse) as refused:
        DurableState(tmp_path / "state", cfg)
    message = str(refused.value)
    assert message.startswith("state_dir: ") and f"pid {os.getpid()}" in message
    assert "its own state_dir" in message and str(tmp_path / "state" / "lock") in message
    first.close()
    first.close()
    DurableState(tmp_path / "state", cfg).close()


def test_the_log_stays_under_two_segments_however_fast_it_grows(tmp_path) -> None:
    """Issue 38's soak: at 20 MB/s, a checkpoint every ``checkpoint_s`` let the write-ahead log
    reach three 64 MiB segments. Here no time passes at all; the log's growth alone is due."""
    segment = 64 * 1024
    cfg = config(tmp_path, segment_bytes=segment, checkpoint_s=3600.0)
    state = DurableState(tmp_path / "state", cfg)
    recent = CheckpointedAt(Position(0, 0))  # the open steps need only the last record
    largest = 0
    for pid in range(5000):
        recent.oldest = state.log_input(protocol.encode_done(pid + 1, 1, 0) + bytes(100))
        state.maybe_checkpoint(recent, Replayed(), [])
        largest = max(largest, state.wal.disk_bytes() + state.wal.pending_bytes)
    state.close()
    assert state.wal.end.segment > 5 and largest < 2 * segment


# ---------------------------------------------------------------------- files that do not parse


def test_a_damaged_checkpoint_or_cursor_names_the_file(tmp_path) -> None:
    cfg = config(tmp_path)
    state = DurableState(tmp_path / "state", cfg)
    replayed = Replayed()
    state.maybe_checkpoint(replayed, replayed, ["jsonl"], force=True)
    OutboxReader(state, "jsonl").save()
    state.close()
    cursor = (tmp_path / "state") / "cursors" / "jsonl.json"
    cursor.write_text('{"position": [0, ')
    state = DurableState(tmp_path / "state", cfg)
    with pytest.raises(StateError, match=r"jsonl\.json") as refused:
        OutboxReader(state, "jsonl")
    assert "delete it" in str(refused.value)
    state.close()
    checkpoint = (tmp_path / "state") / "checkpoint.json"
    checkpoint.write_text(json.dumps({"wal": [0, 0]}))  # valid JSON, missing fields
    with pytest.raises(StateError, match=r"checkpoint\.json"):
        DurableState(tmp_path / "state", cfg)


# ---------------------------------------------------------------------- the outbox


def drain(reader: OutboxReader) -> list[int]:
    """What the sink worker does: write what is new, commit every record."""
    written = []
    while reader.available():
        batch = reader.read()
        for position, _, record in batch:
            if not reader.done(record):
                written.append(record.step)
            reader.commit(position, record)
    return written


def test_a_damaged_outbox_counts_the_steps_a_sink_lost_and_never_repeats_one(tmp_path) -> None:
    cfg = config(tmp_path)
    state = DurableState(tmp_path / "state", cfg)
    replayed = Replayed()
    behind, ahead = OutboxReader(state, "behind"), OutboxReader(state, "ahead")
    for n in range(5):
        state.emit(step(n))
    state.commit()
    assert drain(behind) == [0, 1, 2, 3, 4]
    for n in range(5, 10):
        state.emit(step(n))
    state.maybe_checkpoint(replayed, replayed, ["behind", "ahead"], force=True)
    for n in range(10, 15):  # emitted after the checkpoint: rebuilt from the log if lost
        state.emit(step(n))
    state.commit()
    assert drain(ahead) == list(range(15))
    state.close()

    segment = (tmp_path / "state") / "outbox" / f"{0:016d}.log"
    offset, _ = segment_records(segment)[7]  # steps 7 to 14 gone; 7 to 9 were before the checkpoint
    segment.write_bytes(segment.read_bytes()[: offset + 5])
    state = DurableState(tmp_path / "state", cfg)
    state.recover(replayed, replayed, LIMITS, 0.0)
    for n in range(10, 17):  # what replaying the write-ahead log emits again, then new steps
        state.emit(step(n))
    state.commit()
    behind, ahead = OutboxReader(state, "behind"), OutboxReader(state, "ahead")
    assert drain(behind) == [5, 6, *range(10, 17)] and behind.lost == 3
    assert drain(ahead) == [15, 16] and ahead.lost == 0


def test_a_cursor_the_disk_refuses_is_kept_and_saved_later(tmp_path, monkeypatch) -> None:
    cfg = config(tmp_path)
    state = DurableState(tmp_path / "state", cfg)
    reader = OutboxReader(state, "jsonl")
    state.emit(step(0))
    state.commit()
    (position, _, record), *_ = reader.read()

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "replace", full)
    reader.commit(position, record)
    assert reader.unsaved and reader.write_errors == 1
    assert not list((tmp_path / "state" / "cursors").iterdir())  # no temporary file left
    monkeypatch.undo()
    reader.save()
    assert not reader.unsaved and OutboxReader(state, "jsonl").position == position


# ---------------------------------------------------------------------- the jsonl sink


def test_a_failed_jsonl_write_leaves_no_torn_line_and_is_written_once(
    tmp_path, monkeypatch
) -> None:
    sink = JsonlSink(tmp_path / "out.jsonl")
    sink.open()
    sink.write(step(0))
    monkeypatch.setattr(os, "write", FailingAppends(times=2, partial=10))
    for _ in range(2):
        with pytest.raises(OSError):
            sink.write(step(1))
    sink.write(step(1))  # the fan-out's retry
    sink.close()
    lines = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert [line["step"] for line in lines] == [0, 1]
