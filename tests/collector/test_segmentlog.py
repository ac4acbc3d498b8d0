"""The log reads back what was appended, survives torn tails, rotates and deletes segments."""

from __future__ import annotations

from rlpulse.collector.durability.segmentlog import Position, SegmentLog

DEFAULTS = {"segment_bytes": 64 << 20, "fsync": False}

START = Position(0, 0)


def payloads(log: SegmentLog, start: Position = START) -> list[bytes]:
    return [p for _, p in log.read_from(start)]


def test_append_flush_read_and_resume_from_a_position(tmp_path) -> None:
    log = SegmentLog(tmp_path, **DEFAULTS)
    ends = [log.append(f"r{i}".encode()) for i in range(5)]
    assert payloads(log) == []  # nothing flushed yet
    log.flush()
    assert payloads(log) == [b"r0", b"r1", b"r2", b"r3", b"r4"]
    assert payloads(log, ends[2]) == [b"r3", b"r4"]
    log.close()
    again = SegmentLog(tmp_path, **DEFAULTS)
    again.append(b"r5")
    again.flush()
    assert payloads(again)[-2:] == [b"r4", b"r5"]


def test_torn_tail_is_cut_with_a_warning_and_never_fatal(tmp_path, caplog) -> None:
    log = SegmentLog(tmp_path, **DEFAULTS)
    for i in range(3):
        log.append(f"record-{i}".encode())
    log.close()
    (segment,) = tmp_path.glob("*.log")
    data = segment.read_bytes()
    segment.write_bytes(data[:-4])  # a crash mid-write
    reopened = SegmentLog(tmp_path, **DEFAULTS)
    assert reopened.truncated_bytes > 0 and "torn or corrupt tail" in caplog.text
    assert payloads(reopened) == [b"record-0", b"record-1"]
    reopened.append(b"after")
    reopened.flush()
    assert payloads(reopened) == [b"record-0", b"record-1", b"after"]


def test_corrupt_bytes_stop_the_scan_at_the_bad_record(tmp_path) -> None:
    log = SegmentLog(tmp_path, **DEFAULTS)
    for i in range(3):
        log.append(b"x" * 20 + bytes([i]))
    log.close()
    (segment,) = tmp_path.glob("*.log")
    data = bytearray(segment.read_bytes())
    data[40] ^= 0xFF  # inside the second record's payload: its checksum no longer matches
    segment.write_bytes(bytes(data))
    assert len(payloads(SegmentLog(tmp_path, **DEFAULTS))) == 1


def test_rotation_and_deletion_keep_disk_bounded(tmp_path) -> None:
    log = SegmentLog(tmp_path, segment_bytes=100, fsync=False)
    for _i in range(50):
        log.append(b"y" * 40)
    log.flush()
    assert len(log.segments()) > 10
    before = log.disk_bytes()
    log.delete_before(log.end.segment)
    assert log.segments() == [log.end.segment] and log.disk_bytes() < before
