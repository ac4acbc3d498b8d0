"""The collector's durable state under ``state_dir``: nothing accepted is lost in a crash.

* ``wal/``: every accepted message, appended before it is acknowledged (``SegmentLog``);
  ``wal/flushed`` records how far it had been written when producers were last acknowledged.
* ``outbox/``: every emitted step, appended as JSON; sinks read it at their own pace.
* ``cursors/<sink>.json``: how far each sink has written in the outbox, and per run the last
  step it was given (a step rebuilt after a damaged outbox is never written to it twice).
* ``checkpoint.json``: producers and per-run progress, plus where in the WAL replay starts.

Recovery loads the checkpoint, reads the outbox from the checkpoint on (those steps are never
emitted again, and their throughput and cumulative totals carry on), then replays the WAL from
the checkpoint's cut: every message there was accepted exactly once, so replaying it rebuilds
the open steps exactly. Compaction writes a new checkpoint whose cut is the first WAL record an
open step still needs, then deletes older WAL segments, and outbox segments every sink has
passed: disk use follows the open-step window and the slowest sink, not the run's length.

One process at a time: ``lock`` is held for the life of the state (:class:`StateLock`); a
second collector or relay on the same ``state_dir`` is refused (``StateDirInUse``, exit 2).

Damage found at start-up (:class:`StateError`, exit status 2, naming the file and the fix):

* a write-ahead log that no longer holds everything producers were told it holds: the
  messages lost are gone from the producers too, and the steps they belong to would come out
  complete with some rank's data missing. A torn tail past that point (a crash mid-write,
  never acknowledged) is cut with a warning, as before; damage before the checkpoint's cut
  (records of steps the checkpoint holds) is warned about and never cut;
* a ``checkpoint.json`` or a configured sink's cursor file that does not parse.

A damaged outbox is recovered: steps emitted after the checkpoint are rebuilt from the WAL,
and steps lost before a sink wrote them are counted per sink (``rlpulse_sink_lost_total``).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Protocol

from rlpulse.collector.config import CollectorConfig
from rlpulse.collector.durability.segmentlog import (
    Position,
    SegmentLog,
    inspect,
    read_mark,
    segment_path,
)
from rlpulse.collector.durability.statefiles import (
    StateError,
    decode_record,
    encode_record,
    load_json,
    move_aside,
    write_json_atomic,
)
from rlpulse.collector.durability.statelock import StateLock
from rlpulse.schemas import protocol
from rlpulse.schemas.errors import SchemaError
from rlpulse.schemas.record import StepRecord


class Recoverable(Protocol):
    """What recovery needs of the aggregator: replay messages, skip emitted steps, and a
    snapshot of what open steps do not hold (``rlpulse.collector.runs.aggregator.Aggregator``)."""

    def handle(
        self, msg: protocol.Message, now: float, position: object = None, replay: bool = False
    ) -> None: ...

    def note_emitted(self, record: StepRecord) -> None: ...

    def oldest_position(self) -> object: ...

    def snapshot(self) -> dict: ...

    def restore(self, snapshot: Mapping, now: float) -> None: ...


class Sequencer(Protocol):
    """What recovery needs of delivery: where each producer's numbering stands
    (``rlpulse.collector.intake.delivery.Delivery``)."""

    def note_replayed(self, msg: protocol.Message) -> None: ...

    def snapshot(self) -> dict[str, int]: ...

    def restore(self, snapshot: Mapping[str, int]) -> None: ...


log = logging.getLogger("rlpulse.collector.durability.durable")
CHECKPOINT_SHARE = 4
"""A checkpoint is also due once a ``1/CHECKPOINT_SHARE`` of a segment was logged since the
last one: compaction then follows the log's growth, not only the clock, and the log stays
under two segments however fast it grows (at 20 MB/s, ``checkpoint_s`` alone let it reach
three 64 MiB segments)."""


class DurableState:
    """Owns the files under ``state_dir``; used from the daemon's main thread (the outbox is
    also read by sink workers, through :class:`OutboxReader`).

    Construction checks what is on disk and raises :class:`StateError` on damage that would
    make numbers wrong; :meth:`commit` and :meth:`maybe_checkpoint` raise ``OSError`` when the
    disk cannot take the writes (the daemon then stops acknowledging and retries).

    >>> # state = DurableState("/var/lib/rlpulse", config); state.recover(agg, delivery, ...)
    """

    def __init__(self, state_dir: str | Path, config: CollectorConfig) -> None:
        self.dir = Path(state_dir)
        self.checkpoint_path = self.dir / "checkpoint.json"
        self.cursor_dir = self.dir / "cursors"
        self.fsync = config.fsync
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            self._lock = StateLock(self.dir)  # first: nothing is read or written unlocked
        except OSError as exc:
            raise StateError(f"cannot lock {self.dir}: {exc}; fix the disk") from None
        try:
            self._checkpoint = self._load_checkpoint()
            replay_from = self._check_wal()
            self.wal = SegmentLog(
                self.dir / "wal", config.segment_bytes, config.fsync, mark=True, keep=replay_from
            )
            self.outbox = SegmentLog(self.dir / "outbox", config.segment_bytes, config.fsync)
            self.cursor_dir.mkdir(exist_ok=True)
        except OSError as exc:  # a full disk or a failing one, at start-up
            self._lock.release()
            raise StateError(
                f"cannot open the state in {self.dir}: {exc}; free space or fix the disk"
            ) from None
        except StateError:
            self._lock.release()
            raise
        self.checkpoint_s = config.checkpoint_s
        self._checkpoint_bytes = config.segment_bytes // CHECKPOINT_SHARE
        self._logged_bytes = 0
        """Bytes logged since the last checkpoint."""
        self.next_record_seq = 1
        self._last_checkpoint = time.monotonic()

    # ------------------------------------------------------------------ start-up checks

    def _load_checkpoint(self) -> dict[str, Any] | None:
        path = self.checkpoint_path
        fix = f"restore it from a backup, or {move_aside(self.dir)}"
        checkpoint = load_json(path, "the checkpoint", fix)
        if checkpoint is None:
            return None
        try:
            for key in ("wal", "outbox", "wal_end"):
                if key != "wal_end" or key in checkpoint:
                    Position.from_json(checkpoint[key])
            int(checkpoint["next_record_seq"])
            for key in ("aggregator", "delivery"):
                if not isinstance(checkpoint[key], dict):
                    raise TypeError(f"{key} is not an object")
        except (KeyError, TypeError, ValueError, IndexError) as exc:
            raise StateError(f"the checkpoint {path} is damaged ({exc!r}); {fix}") from None
        return checkpoint

    def _check_wal(self) -> Position:
        """Refuse to start when the write-ahead log holds less than producers were told it
        holds (acknowledged messages are dropped by the producers: nothing can fill the gap).
        Return where replay starts: the log is never cut before it."""
        directory = self.dir / "wal"
        start = Position(0, 0)
        required = read_mark(directory)
        if self._checkpoint is not None:
            start = Position.from_json(self._checkpoint["wal"])
            if "wal_end" in self._checkpoint:
                wal_end = Position.from_json(self._checkpoint["wal_end"])
                required = wal_end if required is None else max(required, wal_end)
            self._check_before(directory, start)
        end, damage = inspect(directory, start)
        torn_tail = damage is None or damage.last  # what a crash mid-write can leave
        if torn_tail and (required is None or end >= required):
            return start  # intact, or a torn tail past what was acknowledged: SegmentLog cuts it
        if damage is not None:
            where = f"{damage.path} is damaged at byte {damage.offset}"
        else:
            where = f"{segment_path(directory, end.segment)} ends at byte {end.offset}"
        written = (
            ""
            if required is None
            else f" (it had been written up to byte {required.offset} of segment "
            f"{required.segment})"
        )
        raise StateError(
            f"the write-ahead log {where}{written}: messages producers were told are saved "
            "cannot be read back, and the steps they belong to would be emitted with some "
            f"rank's data missing; {move_aside(self.dir)} (producers resend only what was "
            "never acknowledged)"
        )

    def _check_before(self, directory: Path, start: Position) -> None:
        """Warn about damage before the checkpoint's cut: those records belong to steps the
        checkpoint already holds, so nothing is lost, and the log is not cut there (issue 38:
        cutting it dropped every acknowledged record after the damage)."""
        end, damage = inspect(directory, Position(0, 0))
        if damage is not None and end < start:
            log.warning(
                "%s is damaged at byte %d, before where replay starts (%s): no step still "
                "open needs those records, so the log is kept as it is; check the disk",
                damage.path,
                damage.offset,
                start.to_json(),
            )

    # ------------------------------------------------------------------ recovery

    def recover(
        self, aggregator: Recoverable, delivery: Sequencer, limits: protocol.Limits, now: float
    ) -> dict[str, int]:
        """Rebuild state from disk; return counts of what was read."""
        wal_from = Position(self.wal.segments()[0] if self.wal.segments() else 0, 0)
        outbox_from = Position(self.outbox.segments()[0] if self.outbox.segments() else 0, 0)
        checkpoint = self._checkpoint
        if checkpoint is not None:
            try:
                aggregator.restore(checkpoint["aggregator"], now)
                delivery.restore(checkpoint["delivery"])
            except (KeyError, TypeError, ValueError, IndexError) as exc:
                raise StateError(
                    f"the checkpoint {self.checkpoint_path} is damaged ({exc!r}); restore it "
                    f"from a backup, or {move_aside(self.dir)}"
                ) from None
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
        """Append an accepted message (written by :meth:`commit`); return where it starts."""
        start = self.wal.end
        self.wal.append(payload)
        self._logged_bytes += len(payload)
        return start

    def emit(self, record: StepRecord) -> None:
        self.outbox.append(encode_record(self.next_record_seq, record))
        self.next_record_seq += 1

    def commit(self) -> None:
        """Make appended messages, then steps, durable (before acknowledging them). Raises
        ``OSError`` when the disk cannot take them: they stay queued for the next commit."""
        self.wal.flush()  # inputs first: a step that is saved without its inputs is rebuilt
        self.outbox.flush()

    @property
    def unsaved_bytes(self) -> int:
        """Bytes appended that could not be written yet."""
        return self.wal.pending_bytes + self.outbox.pending_bytes

    # ------------------------------------------------------------------ compaction

    def cursors(self) -> dict[str, Position]:
        out = {}
        for path in self.cursor_dir.glob("*.json"):
            try:
                out[path.stem] = Position.from_json(json.loads(path.read_text())["position"])
            except (ValueError, KeyError, TypeError, IndexError, OSError):
                continue  # a sink no longer configured (configured ones are checked at start)
        return out

    def maybe_checkpoint(
        self,
        aggregator: Recoverable,
        delivery: Sequencer,
        sinks: Iterable[str],
        force: bool = False,
    ) -> bool:
        """Every ``checkpoint_s``, or after ``CHECKPOINT_SHARE``-th of a segment logged (or now
        with ``force``): commit, save the checkpoint, then delete what no one needs. Raises
        ``OSError`` with nothing deleted when it cannot."""
        if (
            not force
            and time.monotonic() - self._last_checkpoint < self.checkpoint_s
            and self._logged_bytes < self._checkpoint_bytes
        ):
            return False
        self._last_checkpoint = time.monotonic()
        self._logged_bytes = 0
        self.commit()
        oldest = aggregator.oldest_position()
        cut = oldest if isinstance(oldest, Position) else self.wal.end
        write_json_atomic(
            self.checkpoint_path,
            {
                "wal": cut.to_json(),
                "wal_end": self.wal.flushed.to_json(),
                "outbox": self.outbox.end.to_json(),
                "next_record_seq": self.next_record_seq,
                "aggregator": aggregator.snapshot(),
                "delivery": delivery.snapshot(),
            },
            fsync=self.fsync,
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
        """Write what is queued, close the logs and release ``state_dir``; never raises (see
        ``SegmentLog.close``)."""
        try:
            self.wal.close()
            self.outbox.close()
        finally:
            self._lock.release()
