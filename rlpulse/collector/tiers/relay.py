"""Relay mode: a collector with an ``upstream`` merges its own ranks and forwards states.

A job too big for one collector runs one relay per node (or per group of ranks) and one root
above them. Producers talk to their relay exactly as to any collector. The relay merges, per
run and step, the states of *its* ranks and forwards them upstream as one producer would:
states (sum, weight, min, max per name), never means, so the root's merge of the relays is
the same merge one collector of every rank would have done (up to the order of float
additions). What a relay knows and the root needs travels with the data:

* **members**: every producer behind the relay (its run, role, rank, world size, declared
  topology, registered metrics endpoint), announced in the relay's hello
  (:class:`~rlpulse.schemas.messages.RelayHello`), again when one joins or when the relay presumes one
  gone (silent for ``liveness_s``). The root registers them as if they had said hello, so it
  waits for them and for nobody else's;
* **deltas** (:class:`~rlpulse.schemas.messages.Delta`): for a step, the merged states of the ranks
  that finished it, and *watermarks*: each of those ranks has finished every step up to this
  one and all its data for them is forwarded. The root marks them done only then.

The relay forwards a step once every rank registered *with it* has finished it (it never
waits for another relay's ranks), or, as any collector, after ``grace_s``, when the missing
ranks are gone, or past ``max_open_steps``; ranks that finish such a step later are forwarded
in another delta for it (the root adds both: merging is associative), never dropped as late.

Delivery upstream is acknowledged end to end. Deltas are numbered and kept in the relay's
outbox (``state_dir``) until the root acknowledges them; the numbers and the relay's
producer id survive a SIGKILL and restart on the same ``state_dir``, so the root applies
every delta exactly once. Without ``state_dir`` a relay restart loses what it held.
"""

from __future__ import annotations

import base64
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import msgspec

from rlpulse.collector.output.records import Emit, Host, RunView
from rlpulse.collector.runs.members import ProducerInfo, Slot
from rlpulse.collector.runs.steps import StepState
from rlpulse.collector.tiers.delta import step_entries
from rlpulse.schemas import protocol
from rlpulse.schemas.messages import Member, Table, TableDecl

log = logging.getLogger("rlpulse.collector.tiers.relay")
FORWARDED_STEPS = 4096
"""Steps per run for which the relay remembers which ranks it forwarded."""
HEARTBEAT_S = 2.0
"""A relay with nothing to forward for this long says it is alive: the root presumes the
ranks behind a silent relay gone after its ``liveness_s``."""


@dataclass(frozen=True)
class RelayRecord:
    """One item for the collector above, in order: an announcement (``tables`` and
    ``members`` new or changed) or a numbered delta (``message``, the encoded
    :class:`~rlpulse.schemas.messages.Delta`). Kept in the outbox like an emitted step."""

    kind: str
    seq: int = 0
    run: str = ""
    step: int = -1
    message: bytes = b""
    tables: tuple[TableDecl, ...] = ()
    members: tuple[Member, ...] = ()

    def encode(self, **extra: Any) -> bytes:
        obj = {
            "kind": self.kind,
            "seq": self.seq,
            "run": self.run,
            "step": self.step,
            "message": base64.b64encode(self.message).decode(),
            "tables": [[t.id, t.names, list(t.kinds)] for t in self.tables],
            "members": [msgspec.to_builtins(m) for m in self.members],
        }
        return msgspec.json.encode({**extra, "relay": obj})

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> RelayRecord:
        return cls(
            kind=obj["kind"],
            seq=int(obj["seq"]),
            run=obj["run"],
            step=int(obj["step"]),
            message=base64.b64decode(obj["message"]),
            tables=tuple(TableDecl(i, names, bytes(kinds)) for i, names, kinds in obj["tables"]),
            members=tuple(msgspec.convert(m, Member) for m in obj["members"]),
        )


@dataclass
class _Forwarded:
    """What a relay has forwarded of one run."""

    slots: dict[int, set[Slot]] = field(default_factory=dict)
    """Per step, the ranks whose data for it went upstream (bounded)."""
    watermarks: dict[int, int] = field(default_factory=dict)
    """Per member, the watermark the root has from us."""

    def add(self, step: int, slots: set[Slot]) -> None:
        self.slots.setdefault(step, set()).update(slots)
        while len(self.slots) > FORWARDED_STEPS:
            del self.slots[min(self.slots)]


class Relay:
    """A relay's :class:`~rlpulse.collector.output.records.StepOutput`: an aggregator with this
    output completes steps over its own ranks and emits :class:`RelayRecord` (announcements,
    deltas, heartbeats) for the upstream sink instead of step records (see the module
    docstring).

    >>> # agg = Aggregator(outbox.put, config, output=Relay(relay_id(state_dir)))
    """

    local = True

    def __init__(self, relay_id: int) -> None:
        self.relay_id = relay_id
        """The producer id this relay has upstream (``rlpulse.collector.tiers.upstream.relay_id``,
        persisted in ``state_dir``)."""
        self.next_seq = 1
        self.forwarded: dict[str, _Forwarded] = {}
        self.tables: dict[Table, int] = {}
        self.announced: dict[int, Member] = {}
        self._dirty: list[TableDecl] = []
        self._now = 0.0
        """The time of the latest poll."""
        self._last_sent = -HEARTBEAT_S

    def _send(self, emit: Emit, record: RelayRecord) -> None:
        self._last_sent = self._now
        emit(record)

    def _forwarded(self, run: str) -> _Forwarded:
        forwarded = self.forwarded.get(run)
        if forwarded is None:
            forwarded = self.forwarded[run] = _Forwarded()
        return forwarded

    def reopen(self, run: RunView, prod: ProducerInfo, step: int) -> set[Slot] | None:
        """A rank's data for a step below the last one forwarded: a new delta for the step
        (the root adds it, or counts it late), unless its data for the step already went
        (then it is late here). A step this relay never forwarded (none of its ranks had
        data for it then: a rank restarted behind it goes on from a later step, and another
        registers later with the earlier steps) is opened as a new step; once steps were
        forgotten (``FORWARDED_STEPS``), one older than every step remembered is late."""
        forwarded = self._forwarded(run.name).slots
        done = forwarded.get(step)
        if done is None:
            if len(forwarded) >= FORWARDED_STEPS and step < min(forwarded):
                return None
            done = set()
        elif prod.slot in done:
            return None
        return run.finished_slots(step) | done

    # ------------------------------------------------------------------ forwarding

    def before(self, agg: Host, now: float) -> None:
        self._now = now
        self._announce(agg, now)

    def after(self, agg: Host, now: float | None) -> None:
        """Forward every member's watermark that is safe to; at polls, a heartbeat when
        nothing went up for ``HEARTBEAT_S``."""
        self._catch_up_watermarks(agg)
        if now is not None and now - self._last_sent >= HEARTBEAT_S:
            self._send(agg.emit, RelayRecord("heartbeat"))

    def _member(self, agg: Host, prod: ProducerInfo, now: float) -> Member:
        membership = agg.membership
        if prod.logs:
            expected = dict(membership.runs[prod.run].expected_roles)
            gone = membership.gone(prod.run, prod.slot, now)
        else:  # an endpoint only: no rank to wait for, so gone once it said goodbye too
            expected, gone = {}, prod.finished or membership.silent(prod, now)
        return Member(
            prod.pid,
            prod.run,
            prod.role,
            prod.rank,
            prod.world_size,
            prod.host,
            expected,
            gone,
            prod.metrics_url,
            prod.logs,
            prod.resume,
            prod.config,
        )

    def _announce(self, agg: Host, now: float) -> None:
        """Members new or changed (joined, presumed gone, back), and tables new: an
        announcement record, ahead of any delta that needs it."""
        changed = []
        membership = agg.membership
        for prod in (*membership.producers.values(), *membership.endpoints.values()):
            member = self._member(agg, prod, now)
            if self.announced.get(prod.pid) != member:
                self.announced[prod.pid] = member
                changed.append(member)
        if changed or self._dirty:
            record = RelayRecord("announce", tables=tuple(self._dirty), members=tuple(changed))
            self._send(agg.emit, record)
            self._dirty = []

    def _table(self, table: Table) -> int:
        number = self.tables.get(table)
        if number is None:
            number = self.tables[table] = len(self.tables)
            self._dirty.append(TableDecl(number, list(table.names), table.kinds))
        return number

    def finish(self, run: RunView, state: StepState, missing: set[Slot], emit: Emit) -> bool:
        """Forward the step's merged states, and the watermarks of the ranks it covers."""
        members = run.members
        forwarded = self._forwarded(run.name)
        covered = state.done - forwarded.slots.get(state.step, set())
        forwarded.add(state.step, covered)
        entries, sketches, samples = step_entries(run, state, self._table)
        marks = []
        for slot in covered:
            pid = members.slots[slot]
            marks.append((pid, state.step))
            forwarded.watermarks[pid] = max(forwarded.watermarks.get(pid, -1), state.step)
        if self._dirty:  # a new table: announced before the delta that uses it
            self._send(emit, RelayRecord("announce", tables=tuple(self._dirty)))
            self._dirty = []
        spans = [(state.step, span) for span in state.spans]
        told = [(members.slots[s], state.step) for s in state.incomplete if s in members.slots]
        self._forward(emit, run.name, state.step, entries, marks, spans, sketches, samples, told)
        return bool(missing)

    def _forward(
        self,
        emit: Emit,
        run: str,
        step: int,
        entries: list,
        marks: list,
        spans: list | None = None,
        sketches: list | None = None,
        samples: list | None = None,
        incomplete: list | None = None,
    ) -> None:
        seq, self.next_seq = self.next_seq, self.next_seq + 1
        delta = protocol.Delta(
            self.relay_id,
            seq,
            run,
            entries,
            marks,
            spans or [],
            sketches or [],
            samples or [],
            incomplete or [],
        )
        message = protocol.encode(delta)
        record = RelayRecord("delta", seq=seq, run=run, step=step, message=message)
        self._send(emit, record)

    def _catch_up_watermarks(self, agg: Host) -> None:
        """With nothing of a run left open here, every member's own watermark is safe to
        forward (its data is all upstream): the root then stops waiting for ranks that
        finished, or log nothing, at steps no one here logged."""
        membership = agg.membership
        for name, run in agg.runs.items():
            if run.steps:
                continue
            forwarded = self._forwarded(name)
            marks = []
            for prod in membership.producers.values():
                if prod.run != name or not membership.holds_slot(prod):
                    continue
                if prod.watermark > forwarded.watermarks.get(prod.pid, -1):
                    forwarded.watermarks[prod.pid] = prod.watermark
                    marks.append((prod.pid, prod.watermark))
            if marks:
                self._forward(agg.emit, name, -1, [], marks)

    # ------------------------------------------------------------------ durable state

    def note_emitted(self, agg: Host, record: Any) -> None:
        """Recovery: what this record forwarded (or announced) is not done again."""
        if not isinstance(record, RelayRecord):
            return
        if record.kind == "announce":
            for decl in record.tables:
                self.tables[Table.shared(tuple(decl.names), decl.kinds)] = decl.id
            for member in record.members:
                self.announced[member.producer] = member
            return
        if record.kind != "delta":
            return
        self.next_seq = max(self.next_seq, record.seq + 1)
        delta = protocol.decode(record.message)
        assert isinstance(delta, protocol.Delta)
        agg.membership.ensure_run(delta.run, 0.0)
        forwarded = self._forwarded(delta.run)
        slots = {
            agg.membership.producers[pid].slot
            for pid, _ in delta.watermarks
            if pid in agg.membership.producers
        }
        if record.step >= 0:
            forwarded.add(record.step, slots)
        for pid, mark in delta.watermarks:
            forwarded.watermarks[pid] = max(forwarded.watermarks.get(pid, -1), mark)

    def forget(self, agg: Host, run: str, pids: list[int], emit: Emit | None) -> None:
        """Drop what was forwarded of the run and its members; the upstream sink drops them
        from the hello it sends (a ``forget`` record)."""
        self.forwarded.pop(run, None)
        members = tuple(m for m in (self.announced.pop(pid, None) for pid in pids) if m)
        if emit is not None and members:
            self._send(emit, RelayRecord("forget", run=run, members=members))

    def snapshot(self, agg: Host, out: dict) -> None:
        out["relay"] = {
            "next_seq": self.next_seq,
            "tables": [[n, list(t.names), list(t.kinds)] for t, n in self.tables.items()],
            "announced": {str(p): msgspec.to_builtins(m) for p, m in self.announced.items()},
            "forwarded": {
                name: {
                    "slots": {str(s): sorted(map(list, v)) for s, v in f.slots.items()},
                    "watermarks": {str(p): w for p, w in f.watermarks.items()},
                }
                for name, f in self.forwarded.items()
            },
        }

    def restore(self, agg: Host, snapshot: Mapping) -> None:
        data = snapshot.get("relay")
        if not data:
            return
        self.next_seq = int(data["next_seq"])
        for n, names, kinds in data["tables"]:
            self.tables[Table.shared(tuple(names), bytes(kinds))] = n
        for pid, member in data["announced"].items():
            self.announced[int(pid)] = msgspec.convert(member, Member)
        for name, f in data["forwarded"].items():
            fw = self._forwarded(name)
            fw.slots = {int(s): {(r, k) for r, k in v} for s, v in f["slots"].items()}
            fw.watermarks = {int(p): w for p, w in f["watermarks"].items()}
