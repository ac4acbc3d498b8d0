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
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import msgspec
import numpy as np

from rlpulse.collector.aggregator import Aggregator
from rlpulse.collector.config import CollectorConfig
from rlpulse.collector.health import Health
from rlpulse.collector.membership import ProducerInfo, Slot
from rlpulse.collector.steps import RunSteps, StepState
from rlpulse.schemas import protocol
from rlpulse.schemas.catalog import Catalog
from rlpulse.schemas.messages import Member, Table, TableDecl
from rlpulse.schemas.metrics import CATALOG
from rlpulse.schemas.sketch import encode as encode_sketch

log = logging.getLogger("rlpulse.collector.relay")
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


class RelayAggregator(Aggregator):
    """The aggregator of a relay: completes steps over its own ranks and emits
    :class:`RelayRecord` instead of step records (see the module docstring)."""

    decides_attempts = False

    def __init__(
        self,
        emit: Callable[[Any], None],
        config: CollectorConfig,
        *,
        relay_id: int,
        health: Health | None = None,
        catalog: Catalog = CATALOG,
    ) -> None:
        super().__init__(emit, config, health=health, catalog=catalog)
        self.relay_id = relay_id
        """The producer id this relay has upstream (``rlpulse.collector.upstream.relay_id``,
        persisted in ``state_dir``)."""
        self.next_seq = 1
        self.forwarded: dict[str, _Forwarded] = {}
        self.tables: dict[Table, int] = {}
        self.announced: dict[int, Member] = {}
        self._dirty: list[TableDecl] = []
        self._now = 0.0
        self._last_sent = -HEARTBEAT_S

    def _send(self, record: RelayRecord) -> None:
        self._last_sent = self._now
        self.emit(record)

    # ------------------------------------------------------------------ who is expected

    def _run(self, name: str) -> RunSteps:
        run = super()._run(name)
        members = self.membership.runs.get(name)
        if members is not None:
            members.local_only = True
        self.forwarded.setdefault(name, _Forwarded())
        return run

    def _after_emission(
        self,
        run: RunSteps,
        prod: ProducerInfo,
        step: int,
        now: float,
        position: object,
        replay: bool,
    ) -> StepState | None:
        """A rank's data for a step already forwarded without it: a new delta for the step
        (the root adds it), unless its data for the step already went (then it is late)."""
        done = self.forwarded[run.name].slots.get(step)
        if done is None or prod.slot in done:
            return super()._after_emission(run, prod, step, now, position, replay)
        finished = self.membership.finished_slots(run.name, step) | done
        return run.open(step, now, finished, position)

    def handle(
        self, msg: protocol.Message, now: float, position: object = None, replay: bool = False
    ) -> None:
        if type(msg) is protocol.RelayHello:  # one tier of relays under the root
            self.health.reject("relay_of_relay")
            self._ratelog.warn(
                "relay_of_relay",
                f"relay {msg.producer:x} on {msg.host} sent its hello to this relay; relays "
                "attach to the root only (its `upstream` should be the root's address)",
            )
            return
        super().handle(msg, now, position, replay)

    # ------------------------------------------------------------------ forwarding

    def poll(self, now: float) -> None:
        self._now = now
        self._announce(now)
        super().poll(now)
        self._catch_up_watermarks()
        if now - self._last_sent >= HEARTBEAT_S:
            self._send(RelayRecord("heartbeat"))

    def _member(self, prod: ProducerInfo, now: float) -> Member:
        membership = self.membership
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
        )

    def flush(self) -> None:
        """Shutdown: forward every open step (as any collector emits them), then every
        member's watermark."""
        super().flush()
        self._catch_up_watermarks()

    def _announce(self, now: float) -> None:
        """Members new or changed (joined, presumed gone, back), and tables new: an
        announcement record, ahead of any delta that needs it."""
        changed = []
        membership = self.membership
        for prod in (*membership.producers.values(), *membership.endpoints.values()):
            member = self._member(prod, now)
            if self.announced.get(prod.pid) != member:
                self.announced[prod.pid] = member
                changed.append(member)
        if changed or self._dirty:
            self._send(RelayRecord("announce", tables=tuple(self._dirty), members=tuple(changed)))
            self._dirty = []

    def _table(self, table: Table) -> int:
        number = self.tables.get(table)
        if number is None:
            number = self.tables[table] = len(self.tables)
            self._dirty.append(TableDecl(number, list(table.names), table.kinds))
        return number

    def _emit(self, run: RunSteps, state: StepState, missing: set) -> None:
        run.merge_step(state.step)
        members = self.membership.runs[run.name]
        forwarded = self.forwarded[run.name]
        touched = np.flatnonzero(state.touched[: len(run.names)])
        roles = state.roles[touched].tolist()
        del run.steps[state.step]
        run.last_emitted = max(run.last_emitted, state.step)
        covered = state.done - forwarded.slots.get(state.step, set())
        forwarded.add(state.step, covered)
        entries, sketches = [], []
        if len(touched):
            names = tuple(run.names[j] for j in touched.tolist())
            kinds = bytes(int(run.resolved[j].reduction) for j in touched.tolist())
            number = self._table(Table.shared(names, kinds))
            values = np.ascontiguousarray(state.rows[touched], dtype="<f8").tobytes()
            owners = [members.role_names(b) for b in roles]
            entries.append(
                (
                    state.step,
                    state.t_first,
                    state.t_last,
                    number,
                    values,
                    dict(state.nonfinite),
                    sorted(state.contributors),
                    owners,
                )
            )
            sketches = [  # the merged quantile sketches of its distribution metrics
                (0, row, encode_sketch(state.sketches[j]))
                for row, j in enumerate(touched.tolist())
                if j in state.sketches
            ]
        marks = []
        for slot in covered:
            pid = members.slots[slot]
            marks.append((pid, state.step))
            forwarded.watermarks[pid] = max(forwarded.watermarks.get(pid, -1), state.step)
        self.health.steps_emitted += 1
        if missing:
            self.health.partial_steps += 1
        if self._dirty:  # a new table: announced before the delta that uses it
            self._send(RelayRecord("announce", tables=tuple(self._dirty)))
            self._dirty = []
        spans = [(state.step, span) for span in state.spans]
        self._forward(run.name, state.step, entries, marks, spans, sketches)

    def _forward(
        self,
        run: str,
        step: int,
        entries: list,
        marks: list,
        spans: list | None = None,
        sketches: list | None = None,
    ) -> None:
        seq, self.next_seq = self.next_seq, self.next_seq + 1
        delta = protocol.Delta(self.relay_id, seq, run, entries, marks, spans or [], sketches or [])
        message = protocol.encode(delta)
        self._send(RelayRecord("delta", seq=seq, run=run, step=step, message=message))

    def _catch_up_watermarks(self) -> None:
        """With nothing of a run left open here, every member's own watermark is safe to
        forward (its data is all upstream): the root then stops waiting for ranks that
        finished, or log nothing, at steps no one here logged."""
        for name, run in self.steps.items():
            if run.steps:
                continue
            forwarded = self.forwarded[name]
            marks = []
            for prod in self.membership.producers.values():
                if prod.run != name or not self.membership.holds_slot(prod):
                    continue
                if prod.watermark > forwarded.watermarks.get(prod.pid, -1):
                    forwarded.watermarks[prod.pid] = prod.watermark
                    marks.append((prod.pid, prod.watermark))
            if marks:
                self._forward(name, -1, [], marks)

    # ------------------------------------------------------------------ durable state

    def note_emitted(self, record: Any) -> None:
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
        self.membership.ensure_run(delta.run, 0.0)
        run = self._run(delta.run)
        forwarded = self.forwarded[delta.run]
        run.last_emitted = max(run.last_emitted, record.step)
        slots = {
            self.membership.producers[pid].slot
            for pid, _ in delta.watermarks
            if pid in self.membership.producers
        }
        if record.step >= 0:
            forwarded.add(record.step, slots)
        for pid, mark in delta.watermarks:
            forwarded.watermarks[pid] = max(forwarded.watermarks.get(pid, -1), mark)

    def snapshot(self) -> dict:
        out = super().snapshot()
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
        return out

    def restore(self, snapshot: Mapping, now: float) -> None:
        super().restore(snapshot, now)
        data = snapshot.get("relay")
        if not data:
            return
        self.next_seq = int(data["next_seq"])
        for n, names, kinds in data["tables"]:
            self.tables[Table.shared(tuple(names), bytes(kinds))] = n
        for pid, member in data["announced"].items():
            self.announced[int(pid)] = msgspec.convert(member, Member)
        for name, f in data["forwarded"].items():
            fw = self.forwarded.setdefault(name, _Forwarded())
            fw.slots = {int(s): {(r, k) for r, k in v} for s, v in f["slots"].items()}
            fw.watermarks = {int(p): w for p, w in f["watermarks"].items()}
