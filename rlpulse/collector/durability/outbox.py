"""One sink's view of the collector's outbox (``state_dir/outbox``): the next emitted
records after its cursor, and the cursor file (``cursors/<sink>.json``) that survives a
restart. The outbox itself is written by ``rlpulse.collector.durability.durable.DurableState``.

>>> # reader = OutboxReader(state, "jsonl"); for end, _, record in reader.read(): ...
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from rlpulse.collector.durability.segmentlog import Position
from rlpulse.collector.durability.statefiles import (
    StateError,
    decode_record,
    load_json,
    move_aside,
    write_json_atomic,
)
from rlpulse.collector.ratelog import RateLimitedLog
from rlpulse.schemas.record import RunForgotten, StepRecord

if TYPE_CHECKING:
    from rlpulse.collector.durability.durable import DurableState

log = logging.getLogger("rlpulse.collector.durability.durable")
_ratelog = RateLimitedLog(log)


class OutboxReader:
    """One sink's view of the outbox: the next records after its cursor, and the cursor file.

    Counts ``lost``: steps that left the outbox before this sink wrote them (damaged records,
    seen as a gap in the records' numbers); ``write_errors``: cursor saves that failed (a full
    disk; the cursor is kept in memory and saved again with the next step or when idle).
    """

    def __init__(self, state: DurableState, name: str) -> None:
        self.state = state
        self.name = name
        self.path = state.cursor_dir / f"{name}.json"
        self.position = Position(state.outbox.segments()[0] if state.outbox.segments() else 0, 0)
        self.last_seq = 0
        self.steps: dict[str, int] = {}
        """Per run, the last step handed to this sink (steps of a run go out in order)."""
        self.lost = 0
        self.write_errors = 0
        self.unsaved = False
        self._seqs: dict[Position, int] = {}
        fix = (
            f"delete it to have sink {name!r} write again the steps still kept in "
            f"{state.outbox.dir} (the jsonl sink skips those its file holds; other sinks may "
            f"get some twice), or {move_aside(state.dir)}"
        )
        saved = load_json(self.path, f"the cursor of sink {name!r}", fix)
        if saved is not None:
            try:
                self.position = max(self.position, Position.from_json(saved["position"]))
                self.last_seq = int(saved.get("seq", 0))
                self.steps = {str(run): int(step) for run, step in saved.get("steps", {}).items()}
            except (KeyError, TypeError, ValueError, IndexError, AttributeError) as exc:
                raise StateError(
                    f"the cursor of sink {name!r} {self.path} is damaged ({exc!r}); {fix}"
                ) from None

    def available(self) -> bool:
        return self.position < self.state.outbox.flushed

    def read(self, limit: int = 64) -> list[tuple[Position, float, StepRecord]]:
        out = []
        stop = self.state.outbox.flushed
        for end, payload in self.state.outbox.read_from(self.position, stop):
            seq, emitted_at, record = decode_record(payload)
            out.append((end, emitted_at, record))
            self._seqs[end] = seq
            if len(out) >= limit:
                break
        if not out and self.position < stop:
            # Nothing readable before ``stop`` (the rest of a segment cut at start-up, or a
            # corrupt one): move on, so the sink neither spins nor re-reads it.
            self.position = stop
        return out

    def done(self, record: Any) -> bool:
        """``record`` is a step this sink was already given (one rebuilt after damage)."""
        return isinstance(record, StepRecord) and record.step <= self.steps.get(record.run, -1)

    def commit(self, position: Position, record: Any = None) -> None:
        """The record ending at ``position`` is written (or skipped); save the cursor."""
        self.position = position
        seq = self._seqs.pop(position, None)
        if seq is not None:
            if self.last_seq and seq > self.last_seq + 1:
                gap = seq - self.last_seq - 1
                self.lost += gap
                _ratelog.warn(
                    f"lost:{self.name}",
                    f"sink {self.name}: {gap} steps were lost from the damaged outbox in "
                    f"{self.state.outbox.dir} before this sink wrote them (counted in "
                    "rlpulse_sink_lost_total)",
                )
            self.last_seq = seq
        if isinstance(record, StepRecord):
            self.steps[record.run] = max(self.steps.get(record.run, -1), record.step)
        elif isinstance(record, RunForgotten):  # no step of it comes again
            self.steps.pop(record.run, None)
        self.save()

    def save(self) -> None:
        """Write the cursor file; on failure keep it in memory, count it and warn."""
        try:
            write_json_atomic(
                self.path,
                {"position": self.position.to_json(), "seq": self.last_seq, "steps": self.steps},
            )
        except OSError as exc:
            self.write_errors += 1
            self.unsaved = True
            _ratelog.warn(
                f"cursor:{self.name}",
                f"cannot save the cursor of sink {self.name} in {self.path} ({exc.strerror}); "
                "kept in memory and saved again later",
            )
            return
        self.unsaved = False
