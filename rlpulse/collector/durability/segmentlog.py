"""An append-only, checksummed, segmented log: the collector's write-ahead log and outbox.

Each record is ``<length u32><crc32 u32><payload>`` (little-endian). Segments are files named
by a zero-padded number; a new one starts when the current one passes ``segment_bytes``.
Whole segments are deleted once nothing needs them, so disk use stays bounded over a long run.

Appending only queues a record in memory; :meth:`SegmentLog.flush` writes what is queued and
raises ``OSError`` (a full disk) having left every file as it was before: a failed write is
never half in a file, and stays queued to be written by the next flush.

Opening a log checks the last segment: a torn or corrupt tail (a crash mid-write) is cut off
with a warning, and new records then go to a new segment, never below a place a reader may
have reached before the cut. Whether a cut lost records that mattered is for the owner to
judge before opening (:func:`inspect`, and with ``mark`` the end of the last successful flush,
:func:`read_mark`).

>>> import tempfile
>>> log = SegmentLog(tempfile.mkdtemp(), segment_bytes=1 << 20, fsync=False)
>>> end = log.append(b"hello"); _ = log.flush()
>>> [payload for _, payload in log.read_from(Position(0, 0))]
[b'hello']
"""

from __future__ import annotations

import contextlib
import logging
import os
import struct
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from rlpulse.collector.ratelog import RateLimitedLog

log = logging.getLogger("rlpulse.collector.log")
HEADER = struct.Struct("<II")
MAX_RECORD = 256 * 1024 * 1024
WRITE_BEHIND = 4 * 1024 * 1024
"""Queued bytes past which ``append`` writes them out early (a failure waits for ``flush``)."""
MARK_FILE = "flushed"
_MARK = struct.Struct("<QQI")


@dataclass(frozen=True, order=True)
class Position:
    """A place in the log: segment number and byte offset in it."""

    segment: int
    offset: int

    def to_json(self) -> list[int]:
        return [self.segment, self.offset]

    @classmethod
    def from_json(cls, obj: list[int]) -> Position:
        return cls(int(obj[0]), int(obj[1]))


@dataclass(frozen=True)
class Damage:
    """Where a log stops being readable: the first bad record (or a missing segment file).

    ``last`` says it is in the last segment, where a crash mid-write leaves a torn tail;
    anywhere else no crash explains it.
    """

    path: Path
    offset: int
    size: int
    last: bool


def _scan(path: Path, start: int = 0) -> tuple[int, int]:
    """Return (valid length, records) of a segment file from ``start``, stopping at the first
    bad record."""
    good, records = start, 0
    with path.open("rb") as f:
        f.seek(start)
        while True:
            header = f.read(HEADER.size)
            if len(header) < HEADER.size:
                break
            length, crc = HEADER.unpack(header)
            if length > MAX_RECORD:
                break
            payload = f.read(length)
            if len(payload) < length or zlib.crc32(payload) != crc:
                break
            good += HEADER.size + length
            records += 1
    return good, records


def segment_path(directory: Path, segment: int) -> Path:
    """The file of ``segment`` of the log in ``directory``."""
    return directory / f"{segment:016d}.log"


def _segments(directory: Path) -> list[int]:
    return sorted(int(p.stem) for p in directory.glob("*.log") if p.stem.isdigit())


def inspect(directory: str | Path, start: Position) -> tuple[Position, Damage | None]:
    """Check the records of the log in ``directory`` from ``start`` on, without changing
    anything: the end of what reads back intact, and the first damage (None when there is
    none). Read-only, for the owner to decide before opening whether a cut would lose data."""
    directory = Path(directory)
    segments = [s for s in _segments(directory) if s >= start.segment]
    end = start
    if segments and segments[0] != start.segment and start.offset > 0:
        return end, Damage(segment_path(directory, start.segment), 0, 0, last=False)
    for i, segment in enumerate(segments):
        path = segment_path(directory, segment)
        last = i == len(segments) - 1
        if i and segment != segments[i - 1] + 1:  # a segment file is missing
            missing = segment_path(directory, segments[i - 1] + 1)
            return end, Damage(missing, 0, 0, last=False)
        first = start.offset if segment == start.segment else 0
        size = path.stat().st_size
        if first > size:
            return Position(segment, size), Damage(path, size, size, last)
        good, _ = _scan(path, first)
        end = Position(segment, good)
        if good < size:
            return end, Damage(path, good, size, last)
    return end, None


def read_mark(directory: str | Path) -> Position | None:
    """The end of the last successful flush of the log in ``directory`` (kept with ``mark``);
    None when it was never written or cannot be read (it only tightens checks)."""
    try:
        data = (Path(directory) / MARK_FILE).read_bytes()
    except FileNotFoundError:
        return None
    if len(data) != _MARK.size:
        return None
    segment, offset, crc = _MARK.unpack(data)
    if zlib.crc32(data[:16]) != crc:
        return None
    return Position(segment, offset)


class SegmentLog:
    """Writer side (one thread); :meth:`read_from` may run in other threads up to
    :attr:`flushed`.

    ``mark``: after each flush, record its end in a small file (:func:`read_mark`), so that
    opening can tell a crash's torn tail (after it) from lost records (before it).
    ``keep``: a record boundary from which the owner has checked the log (:func:`inspect`);
    opening never cuts anything before it.
    """

    def __init__(
        self,
        directory: str | Path,
        segment_bytes: int,
        fsync: bool,
        *,
        mark: bool = False,
        keep: Position | None = None,
    ) -> None:
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.segment_bytes = segment_bytes
        self.fsync = fsync
        self.truncated_bytes = 0
        self._ratelog = RateLimitedLog(log)
        segments = self.segments()
        current = segments[-1] if segments else 0
        offset = 0
        path = self._path(current)
        if path.exists():
            size = path.stat().st_size
            # Only what follows ``keep`` can be a torn tail: a bad record before it is damage
            # the owner has judged (inspect), and cutting there would drop every record after.
            start = 0
            if keep is not None and keep.segment >= current:
                start = keep.offset if keep.segment == current else size
            offset, _ = _scan(path, min(start, size))
            if offset < size:
                self.truncated_bytes = size - offset
                log.warning(
                    "%s: cut a torn or corrupt tail of %d bytes (a crash mid-write)",
                    path,
                    size - offset,
                )
                with path.open("r+b") as f:
                    f.truncate(offset)
                # A sink's cursor may lie past the cut: new records go to a new segment, so
                # none is ever written below a place a reader has already reached.
                current, offset = current + 1, 0
        self._segment = current
        self._offset = offset
        self._pending: list[tuple[int, int, bytearray]] = []
        """Appended, not yet written: (segment, offset in it, records)."""
        self._pending_bytes = 0
        self._write_failed = False
        self._fd: int | None = None
        self._fd_segment = -1
        self._mark_path = self.dir / MARK_FILE if mark else None
        self._mark_fd: int | None = None
        self._marked: Position | None = None
        self._closed = False
        self.flushed = Position(self._segment, self._offset)

    def _path(self, segment: int) -> Path:
        return segment_path(self.dir, segment)

    def segments(self) -> list[int]:
        return _segments(self.dir)

    @property
    def end(self) -> Position:
        """Position after the last appended record (flushed or not)."""
        return Position(self._segment, self._offset)

    @property
    def pending_bytes(self) -> int:
        """Appended bytes not written yet (after a failed flush: what waits for the disk)."""
        return self._pending_bytes

    def append(self, payload: bytes) -> Position:
        """Queue one record; return the position after it. Never raises: written and visible
        to readers after :meth:`flush`."""
        if self._offset >= self.segment_bytes:
            self._segment += 1
            self._offset = 0
        size = HEADER.size + len(payload)
        if self._pending and self._pending[-1][0] == self._segment:
            chunk = self._pending[-1][2]
        else:
            chunk = bytearray()
            self._pending.append((self._segment, self._offset, chunk))
        chunk += HEADER.pack(len(payload), zlib.crc32(payload))
        chunk += payload
        self._offset += size
        self._pending_bytes += size
        if self._pending_bytes >= WRITE_BEHIND and not self._write_failed:
            try:
                self._write_pending()
            except OSError:
                self._write_failed = True  # kept queued; flush() reports it
        return Position(self._segment, self._offset)

    def _open_segment(self, segment: int) -> int:
        if self._fd_segment != segment:
            self._close_fd()
            self._fd = os.open(self._path(segment), os.O_WRONLY | os.O_CREAT, 0o644)
            self._fd_segment = segment
        assert self._fd is not None
        return self._fd

    def _close_fd(self) -> None:
        if self._fd is not None:
            fd, self._fd, self._fd_segment = self._fd, None, -1
            try:
                if self.fsync:
                    os.fsync(fd)
            finally:
                os.close(fd)

    def _write_pending(self) -> None:
        """Write queued records in order. On failure the file is cut back to where the failed
        chunk starts (no half record) and the chunk stays queued; the ``OSError`` propagates."""
        while self._pending:
            segment, start, chunk = self._pending[0]
            fd = self._open_segment(segment)
            try:
                with memoryview(chunk) as view:
                    done = 0
                    while done < len(view):
                        done += os.pwrite(fd, view[done:], start + done)
            except OSError:
                with contextlib.suppress(OSError):  # shrinking a file works on a full disk
                    os.ftruncate(fd, start)
                raise
            self._pending.pop(0)
            self._pending_bytes -= len(chunk)

    def flush(self) -> Position:
        """Write appended records (and fsync them with ``fsync``); return the end. Raises
        ``OSError`` when they cannot be written: nothing of them is then in the files, they
        stay queued, and the next flush tries again."""
        self._write_failed = False
        self._write_pending()
        fd = self._open_segment(self._segment)  # the end's segment exists once marked
        if self.fsync:
            os.fsync(fd)
        self.flushed = Position(self._segment, self._offset)
        self._write_mark()
        return self.flushed

    def _write_mark(self) -> None:
        if self._mark_path is None or self.flushed == self._marked:
            return
        head = struct.pack("<QQ", self.flushed.segment, self.flushed.offset)
        try:
            if self._mark_fd is None:
                self._mark_fd = os.open(self._mark_path, os.O_WRONLY | os.O_CREAT, 0o644)
            os.pwrite(self._mark_fd, head + struct.pack("<I", zlib.crc32(head)), 0)
        except OSError as exc:  # a stale mark only makes the start-up check less strict
            self._ratelog.warn(
                "mark", f"{self._mark_path}: cannot record the end of the log ({exc.strerror})"
            )
            return
        self._marked = self.flushed

    def read_from(
        self, start: Position, stop: Position | None = None
    ) -> Iterator[tuple[Position, bytes]]:
        """Records from ``start`` up to ``stop`` (default: what is flushed), each with the
        position after it. A corrupt record ends its segment (warned at most every few
        seconds); reading goes on with the next one."""
        stop = stop or self.flushed
        for segment in self.segments():
            if segment < start.segment or segment > stop.segment:
                continue
            offset = start.offset if segment == start.segment else 0
            try:
                f = self._path(segment).open("rb")
            except FileNotFoundError:
                continue
            with f:
                f.seek(offset)
                while segment < stop.segment or offset < stop.offset:
                    header = f.read(HEADER.size)
                    if len(header) < HEADER.size:
                        break
                    length, crc = HEADER.unpack(header)
                    payload = f.read(length) if length <= MAX_RECORD else b""
                    if len(payload) < length or zlib.crc32(payload) != crc:
                        path = self._path(segment)
                        self._ratelog.warn(
                            f"corrupt:{path}:{offset}",
                            f"{path}: corrupt record at offset {offset}; skipping the rest of "
                            "the segment",
                        )
                        break
                    offset += HEADER.size + length
                    yield Position(segment, offset), payload

    def delete_before(self, segment: int) -> int:
        """Delete whole segments numbered below ``segment`` (never the current one)."""
        removed = 0
        for s in self.segments():
            if s < min(segment, self._segment, self.flushed.segment):
                self._path(s).unlink(missing_ok=True)
                removed += 1
        return removed

    def disk_bytes(self) -> int:
        return sum(p.stat().st_size for p in self.dir.glob("*.log"))

    def close(self) -> None:
        """Write what is queued and close. Never raises: records that cannot be written (a
        full disk) are reported in an error and dropped."""
        if self._closed:
            return
        self._closed = True
        try:
            self.flush()
        except OSError as exc:
            log.error(
                "%s: %d bytes of records could not be written at close (%s)",
                self.dir,
                self._pending_bytes,
                exc.strerror,
            )
        finally:
            self._pending.clear()
            self._pending_bytes = 0
            with contextlib.suppress(OSError):
                self._close_fd()
            if self._mark_fd is not None:
                os.close(self._mark_fd)
                self._mark_fd = None
