"""The collector's durable state under ``state_dir``: nothing accepted is lost in a crash.

* ``wal/``: every accepted message, appended before it is acknowledged (``SegmentLog``).
* ``outbox/``: every emitted step, appended as JSON; sinks read it at their own pace.
* ``cursors/<sink>.json``: how far each sink has written in the outbox.
* ``checkpoint.json``: producers and per-run progress, plus where in the WAL replay starts.

Recovery loads the checkpoint, reads the outbox from the checkpoint on (those steps are never
emitted again, and their throughput and cumulative totals carry on), then replays the WAL from
the checkpoint's cut: every message there was accepted exactly once, so replaying it rebuilds
the open steps exactly. Compaction writes a new checkpoint whose cut is the first WAL record an
open step still needs, then deletes older WAL segments, and outbox segments every sink has
passed: disk use follows the open-step window and the slowest sink, not the run's length.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Protocol

from collector.config import CollectorConfig
from collector.segmentlog import Position, SegmentLog
from schemas import protocol
from schemas.errors import SchemaError
from schemas.record import StepRecord


class Recoverable(Protocol):
    """What recovery needs of the aggregator: replay messages, skip emitted steps, and a
    snapshot of what open steps do not hold (``collector.aggregator.Aggregator``)."""

    def handle(
        self, msg: protocol.Message, now: float, position: object = None, replay: bool = False
    ) -> None: ...

    def note_emitted(self, record: StepRecord) -> None: ...

    def oldest_position(self) -> object: ...

    def snapshot(self) -> dict: ...

    def restore(self, snapshot: Mapping, now: float) -> None: ...


class Sequencer(Protocol):
    """What recovery needs of delivery: where each producer's numbering stands
    (``collector.delivery.Delivery``)."""

    def note_replayed(self, msg: protocol.Message) -> None: ...

    def snapshot(self) -> dict[str, int]: ...

    def restore(self, snapshot: Mapping[str, int]) -> None: ...


log = logging.getLogger("rlpulse.collector.durable")


def write_json_atomic(path: Path, obj: object) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(obj))
    os.replace(tmp, path)


def encode_record(seq: int, record: StepRecord) -> bytes:
    return record.encode(seq=seq, emitted_at=time.time())


def decode_record(payload: bytes) -> tuple[int, float, Any]:
    """An outbox record: a step for the sinks, or (a relay's) a record for the collector above."""
    obj = json.loads(payload)
    if "relay" in obj:
        from collector.relay import RelayRecord

        return int(obj["seq"]), float(obj["emitted_at"]), RelayRecord.from_json(obj["relay"])
    return int(obj["seq"]), float(obj["emitted_at"]), StepRecord.from_json(obj["record"])


class DurableState:
    """Owns the files under ``state_dir``; used from the daemon's main thread (the outbox is
    also read by sink workers, through :class:`OutboxReader`)."""

    def __init__(self, state_dir: str | Path, config: CollectorConfig) -> None:
        self.dir = Path(state_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.wal = SegmentLog(self.dir / "wal", config.segment_bytes, config.fsync)
        self.outbox = SegmentLog(self.dir / "outbox", config.segment_bytes, config.fsync)
        self.cursor_dir = self.dir / "cursors"
        self.cursor_dir.mkdir(exist_ok=True)
        self.checkpoint_path = self.dir / "checkpoint.json"
        self.checkpoint_s = config.checkpoint_s
        self.next_record_seq = 1
        self._last_checkpoint = time.monotonic()

    # ------------------------------------------------------------------ recovery

    def recover(
        self, aggregator: Recoverable, delivery: Sequencer, limits: protocol.Limits, now: float
    ) -> dict[str, int]:
        """Rebuild state from disk; return counts of what was read."""
        wal_from = Position(self.wal.segments()[0] if self.wal.segments() else 0, 0)
        outbox_from = Position(self.outbox.segments()[0] if self.outbox.segments() else 0, 0)
        if self.checkpoint_path.exists():
            checkpoint = json.loads(self.checkpoint_path.read_text())
            aggregator.restore(checkpoint["aggregator"], now)
            delivery.restore(checkpoint["delivery"])
            wal_from = max(wal_from, Position.from_json(checkpoint["wal"]))
            outbox_from = max(outbox_from, Position.from_json(checkpoint["outbox"]))
            self.next_record_seq = int(checkpoint["next_record_seq"])
        steps = 0
        for _, payload in self.outbox.read_from(outbox_from):
            seq, _, record = decode_record(payload)
            aggregator.note_emitted(record)
            self.next_record_seq = max(self.next_record_seq, seq + 1)
            steps += 1
        messages = 0
        start = wal_from
        for end, payload in self.wal.read_from(wal_from):
            try:
                msg = protocol.decode(payload, limits)
            except (
                SchemaError
            ) as exc:  # written by us after validation: only a changed limit gets here
                log.warning(
                    "write-ahead log record at %s no longer decodes (%s); skipped", start, exc
                )
                start = end
                continue
            delivery.note_replayed(msg)
            aggregator.handle(msg, now, position=start, replay=True)
            start = end
            messages += 1
        if steps or messages:
            log.info(
                "recovered from %s: %d emitted steps, %d messages replayed",
                self.dir,
                steps,
                messages,
            )
        return {
            "steps": steps,
            "messages": messages,
            "truncated_bytes": self.wal.truncated_bytes + self.outbox.truncated_bytes,
        }

    # ------------------------------------------------------------------ the write path

    def log_input(self, payload: bytes) -> Position:
        """Append an accepted message; return where it starts."""
        start = self.wal.end
        self.wal.append(payload)
        return start

    def emit(self, record: StepRecord) -> None:
        self.outbox.append(encode_record(self.next_record_seq, record))
        self.next_record_seq += 1

    def commit(self) -> None:
        """Make appended steps and messages durable (before acknowledging them)."""
        self.outbox.flush()
        self.wal.flush()

    # ------------------------------------------------------------------ compaction

    def cursors(self) -> dict[str, Position]:
        out = {}
        for path in self.cursor_dir.glob("*.json"):
            try:
                out[path.stem] = Position.from_json(json.loads(path.read_text())["position"])
            except (ValueError, KeyError, OSError):
                continue
        return out

    def maybe_checkpoint(
        self,
        aggregator: Recoverable,
        delivery: Sequencer,
        sinks: Iterable[str],
        force: bool = False,
    ) -> bool:
        if not force and time.monotonic() - self._last_checkpoint < self.checkpoint_s:
            return False
        self._last_checkpoint = time.monotonic()
        self.commit()
        oldest = aggregator.oldest_position()
        cut = oldest if isinstance(oldest, Position) else self.wal.end
        write_json_atomic(
            self.checkpoint_path,
            {
                "wal": cut.to_json(),
                "outbox": self.outbox.end.to_json(),
                "next_record_seq": self.next_record_seq,
                "aggregator": aggregator.snapshot(),
                "delivery": delivery.snapshot(),
            },
        )
        self.wal.delete_before(cut.segment)
        cursors = self.cursors()
        positions = [cursors.get(name, Position(0, 0)) for name in sinks]
        if positions:
            self.outbox.delete_before(min(positions).segment)
        return True

    def disk_bytes(self) -> int:
        return self.wal.disk_bytes() + self.outbox.disk_bytes()

    def close(self) -> None:
        self.wal.close()
        self.outbox.close()


class OutboxReader:
    """One sink's view of the outbox: the next records after its cursor, and the cursor file."""

    def __init__(self, state: DurableState, name: str) -> None:
        self.state = state
        self.path = state.cursor_dir / f"{name}.json"
        self.position = Position(state.outbox.segments()[0] if state.outbox.segments() else 0, 0)
        self.last_seq = 0
        self._seqs: dict[Position, int] = {}
        if self.path.exists():
            saved = json.loads(self.path.read_text())
            self.position = max(self.position, Position.from_json(saved["position"]))
            self.last_seq = int(saved.get("seq", 0))

    def available(self) -> bool:
        return self.position < self.state.outbox.flushed

    def read(self, limit: int = 64) -> list[tuple[Position, float, StepRecord]]:
        out = []
        for end, payload in self.state.outbox.read_from(self.position):
            seq, emitted_at, record = decode_record(payload)
            out.append((end, emitted_at, record))
            self._seqs[end] = seq
            if len(out) >= limit:
                break
        return out

    def commit(self, position: Position) -> None:
        self.position = position
        self.last_seq = self._seqs.pop(position, self.last_seq)
        write_json_atomic(self.path, {"position": position.to_json(), "seq": self.last_seq})
