"""Reading the collector's segment files (``rlpulse.collector.durability.segmentlog``) record by record,
to damage one where a test means to."""

from __future__ import annotations

from pathlib import Path

from rlpulse.collector.durability.segmentlog import HEADER


def segment_records(path: Path) -> list[tuple[int, int]]:
    """(offset, size) of every whole record in a segment file (a record cut short at its
    end is left out)."""
    data, out, offset = path.read_bytes(), [], 0
    while offset + HEADER.size <= len(data):
        length, _ = HEADER.unpack_from(data, offset)
        if offset + HEADER.size + length > len(data):
            break
        out.append((offset, HEADER.size + length))
        offset += HEADER.size + length
    return out
