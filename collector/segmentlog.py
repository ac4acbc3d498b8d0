"""An append-only, checksummed, segmented log: the collector's write-ahead log and outbox.

Each record is ``<length u32><crc32 u32><payload>`` (little-endian). Segments are files named
by a zero-padded number; a new one starts when the current one passes ``segment_bytes``.
Opening a log checks the last segment: a torn or corrupt tail (a crash mid-write) is cut off
with a warning, never fatal. Whole segments are deleted once nothing needs them, so disk use
stays bounded over a long run.

>>> import tempfile
>>> log = SegmentLog(tempfile.mkdtemp(), segment_bytes=1 << 20, fsync=False)
>>> end = log.append(b"hello"); _ = log.flush()
>>> [payload for _, payload in log.read_from(Position(0, 0))]
[b'hello']
"""

from __future__ import annotations

import logging
import os
import struct
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

log = logging.getLogger("rlpulse.collector.log")
HEADER = struct.Struct("<II")
MAX_RECORD = 256 * 1024 * 1024


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


def _scan(path: Path) -> tuple[int, int]:
    """Return (valid length, records) of a segment file, stopping at the first bad record."""
    good = records = 0
    with path.open("rb") as f:
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


class SegmentLog:
    """Writer side (one thread); :meth:`read_from` may run in other threads up to
    :attr:`flushed`."""

    def __init__(self, directory: str | Path, segment_bytes: int, fsync: bool) -> None:
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.segment_bytes = segment_bytes
        self.fsync = fsync
        self.truncated_bytes = 0
        segments = self.segments()
        current = segments[-1] if segments else 0
        path = self._path(current)
        if path.exists():
            size = path.stat().st_size
            good, _ = _scan(path)
            if good < size:
                self.truncated_bytes = size - good
                log.warning(
                    "%s: cut a torn or corrupt tail of %d bytes (a crash mid-write)",
                    path,
                    size - good,
                )
                with path.open("r+b") as f:
                    f.truncate(good)
        self._segment = current
        self._file: BinaryIO = path.open("ab")
        self._offset = self._file.tell()
        self.flushed = Position(self._segment, self._offset)

    def _path(self, segment: int) -> Path:
        return self.dir / f"{segment:016d}.log"

    def segments(self) -> list[int]:
        return sorted(int(p.stem) for p in self.dir.glob("*.log") if p.stem.isdigit())

    @property
    def end(self) -> Position:
        """Position after the last appended record (flushed or not)."""
        return Position(self._segment, self._offset)

    def append(self, payload: bytes) -> Position:
        """Append one record; return the position after it. Visible to readers after flush."""
        if self._offset >= self.segment_bytes:
            self._rotate()
        self._file.write(HEADER.pack(len(payload), zlib.crc32(payload)))
        self._file.write(payload)
        self._offset += HEADER.size + len(payload)
        return Position(self._segment, self._offset)

    def _rotate(self) -> None:
        self._file.flush()
        if self.fsync:
            os.fsync(self._file.fileno())
        self._file.close()
        self._segment += 1
        self._offset = 0
        self._file = self._path(self._segment).open("ab")

    def flush(self) -> Position:
        """Hand appended records to the OS (and to disk with ``fsync``); return the end."""
        self._file.flush()
        if self.fsync:
            os.fsync(self._file.fileno())
        self.flushed = Position(self._segment, self._offset)
        return self.flushed

    def read_from(
        self, start: Position, stop: Position | None = None
    ) -> Iterator[tuple[Position, bytes]]:
        """Records from ``start`` up to ``stop`` (default: what is flushed), each with the
        position after it."""
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
                    payload = f.read(length)
                    if len(payload) < length or zlib.crc32(payload) != crc:
                        log.warning(
                            "%s: corrupt record at offset %d; skipping the rest of the segment",
                            self._path(segment),
                            offset,
                        )
                        break
                    offset += HEADER.size + length
                    yield Position(segment, offset), payload

    def delete_before(self, segment: int) -> int:
        """Delete whole segments numbered below ``segment`` (never the current one)."""
        removed = 0
        for s in self.segments():
            if s < min(segment, self._segment):
                self._path(s).unlink(missing_ok=True)
                removed += 1
        return removed

    def disk_bytes(self) -> int:
        return sum(p.stat().st_size for p in self.dir.glob("*.log"))

    def close(self) -> None:
        if not self._file.closed:
            self.flush()
            self._file.close()
