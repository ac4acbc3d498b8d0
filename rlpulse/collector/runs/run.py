"""One run: its members, its name table, its open steps, and the life of its ranks' slots.

The recovery rules read here, in one place:

* **Watermarks.** A rank finishes step ``s`` by logging a later step, by saying so
  (``done``), or by closing (:meth:`Run.done`); its watermark only grows, and every open step
  up to it counts the rank's slot finished (:meth:`Run.advance`).
* **Late data.** Data for a step already emitted is *late*: counted, logged and told back to
  the producer, never merged, unless the output opens the step again (a relay, whose later
  ranks are forwarded in another delta: ``StepOutput.reopen``). Replaying the write-ahead log
  after a restart, such data went out with the step: skipped silently.
* **Takeover.** A process that registers a slot another one held (a restarted rank) takes
  it over (:meth:`Run.took_over`). The old process's data stays in the steps it had finished
  and is *sealed* there: what the new one sends for them is a repeat (late). Its data for the
  steps it had not finished is *withdrawn*: each such step is rebuilt from the other entries,
  and the slot must finish it again with data of the new process, or go out partial naming
  it. Data merged by a relay with other ranks' cannot be taken out: the step is *tainted*
  and goes out partial. Entries of the replaced process after that are *conflicts*
  (refused, counted, told back).
* **Skipped steps.** The steps between the last one the old process finished and the first
  the new one runs were run by neither: they are missing the slot (:meth:`Run.skip`), also
  for steps opened later or rebuilt from the log (``skipped`` is in the checkpoint).
* **Collector recovery** (``state_dir``): the checkpoint gives back members, watermarks,
  ``last_emitted`` and the open steps that lost a slot's data to a takeover (they open again
  with the slots they lost, even if nothing else in the log opens them); the steps emitted
  since are noted from the outbox; the log is replayed from the oldest open step's first
  data, data of a process replaced since counting for the steps it had finished
  (``sealing``), as at the takeover.
>>> # run = Run("r", members, membership, names, output, spans, health)  # the Aggregator's
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING

from rlpulse.collector.config import CollectorConfig
from rlpulse.collector.health import Health
from rlpulse.collector.ratelog import RateLimitedLog
from rlpulse.collector.runs.completion import HARD_OPEN_FACTOR, due, overcounted
from rlpulse.collector.runs.members import Members, ProducerInfo, Slot
from rlpulse.collector.runs.membership import Membership
from rlpulse.collector.runs.names import NameTable
from rlpulse.collector.runs.sketches import by_table_row
from rlpulse.collector.runs.spans import SpanReader
from rlpulse.collector.runs.steps import OpenSteps, StepState

if TYPE_CHECKING:
    from rlpulse.collector.output.records import StepOutput

log = logging.getLogger("rlpulse.collector")


class Run:
    """One run's state, owned here: the Aggregator routes a run's messages to it.

    Read by a :class:`~rlpulse.collector.output.records.StepOutput` as a ``RunView``."""

    def __init__(
        self,
        name: str,
        members: Members,
        membership: Membership,
        names: NameTable,
        output: StepOutput,
        spans: SpanReader,
        health: Health,
    ) -> None:
        self.name = name
        self.members = members
        self.membership = membership
        self.names = names
        self.output = output
        self.spans = spans
        self.health = health
        self.merger = OpenSteps(names, health)
        self.steps: dict[int, StepState] = self.merger.by_step  # the open steps, by step
        self.last_emitted = -1
        self.skipped: dict[Slot, tuple[int, int]] = {}
        """Per slot, the steps strictly between two bounds that neither its replaced process
        nor its new one ran (:meth:`skip`)."""
        self._ratelog = RateLimitedLog(log)

    # ------------------------------------------------------------------ data

    def sealing(self, prod: ProducerInfo, replay: bool) -> bool | None:
        """How ``prod``'s data is taken: False as usual; True (recovery only) sealed, for a
        process replaced since (its finished steps keep it); None refused (a conflict)."""
        if self.membership.holds_slot(prod):
            return False
        if replay and self.membership.replaced(prod):
            return True
        return None

    def add(
        self,
        prod: ProducerInfo,
        entries: list,
        sketches: list,
        done: int,
        now: float,
        position: object,
        replay: bool,
        sealing: bool,
        samples: Sequence[tuple[int, int, bytes]] = (),
    ) -> None:
        """A producer's entries (a ``Metrics`` message), then its cumulative ``done``;
        ``sketches`` and ``samples``: the message's ``(entry, row, bytes)`` beside them."""
        bit = self.members.role_bits[prod.role]
        if sketches or samples:
            by_row = zip(
                by_table_row(sketches, len(entries)),
                by_table_row(samples, len(entries)),
                strict=True,
            )
            for entry, side in zip(entries, by_row, strict=True):
                self._entry(prod, bit, entry, now, position, replay, side, sealing)
        else:
            for entry in entries:
                self._entry(prod, bit, entry, now, position, replay, None, sealing)
        if sealing:
            return
        if prod.resumes_after is not None and done >= 0:
            self.resume(prod, done)
        self._finished(prod, done, now)

    def done(self, prod: ProducerInfo, watermark: int, now: float) -> None:
        """``prod`` says it has finished every step up to ``watermark`` (``FINISHED``: bye)."""
        if prod.resumes_after is not None:
            self.resume(prod, watermark)
        self.advance(prod, watermark, now)

    def _entry(
        self,
        prod: ProducerInfo,
        role_bit: int,
        entry: tuple,
        now: float,
        position: object,
        replay: bool,
        side: tuple[dict[int, bytes] | None, dict[int, bytes] | None] | None,
        sealing: bool,
    ) -> None:
        """One entry of ``prod``'s; ``side``: its sketches and samples states by table row.
        ``sealing``: see the module docstring (recovery)."""
        step, t, table, values, nonfinite = entry
        if sealing and step > prod.watermark:
            return  # its data for later steps had been withdrawn
        if not replay:
            self.health.events_received += 1
        if prod.resumes_after is not None:
            self.resume(prod, step)
        if type(table) is int:  # version 2: a table of the producer's hello
            found = prod.tables.get(table)
            if found is None:
                self.health.reject("bad_table")
                self._ratelog.warn(
                    f"table:{prod.pid}",
                    f"{prod.role}/{prod.rank} refers to name table {table}, which its hello did "
                    "not declare; entry dropped",
                )
                return
            table = found
        state = self.steps.get(step)
        if state is not None and state.position is None:
            state.position = position  # a step opened from the checkpoint: its first data
        if state is None:
            if step <= self.last_emitted:
                state = self._after_emission(prod, step, now, position, replay)
                if state is None:
                    self.advance(prod, step - 1, now)
                    return
            else:
                state = self.open(step, now, position)
        elif state.sealed and prod.slot in state.sealed and not sealing:  # a repeat of it
            if not replay:
                prod.late += 1
                self.late(f"{prod.role}/{prod.rank} (restarted)", step)
            return
        self.merger.add(state, table, values, role_bit, prod.pid, t, nonfinite, *(side or ()))
        if self.names.full:  # names left out of this run: tell the producer how many of its
            prod.names_dropped += self.names.layout(table).dropped
        spans = self.spans.read(prod.role, prod.rank, prod.host, t, table, values)
        if spans:
            state.spans += spans
        if sealing:
            state.sealed.add(prod.slot)
            state.finish(prod.slot, now)
        elif step - 1 > prod.watermark:
            self.advance(prod, step - 1, now)

    def _after_emission(
        self, prod: ProducerInfo, step: int, now: float, position: object, replay: bool
    ) -> StepState | None:
        """Data for a step already emitted: opened again if the output says so; otherwise
        late, or, replaying the write-ahead log, data that went out with the step."""
        finished = self.output.reopen(self, prod, step)
        if finished is not None:
            return self.open(step, now, position, finished)
        if not replay:
            prod.late += 1
            self.late(f"{prod.role}/{prod.rank}", step)
        return None

    def open(
        self, step: int, now: float, position: object, finished: set[Slot] | None = None
    ) -> StepState:
        """Open ``step``; ``finished``: the slots that had finished it (default: the slots
        whose producer's watermark is past it)."""
        if finished is None:
            finished = self.finished_slots(step)
        state = self.merger.open(step, now, finished, position)
        for slot, (after, first) in self.skipped.items():
            if after < step < first:
                state.withdrawn.add(slot)
        return state

    def open_or_late(self, step: int, now: float, position: object, who: str) -> StepState | None:
        """The open state of ``step``, opened if need be; None (counted) if it was emitted."""
        state = self.steps.get(step)
        if state is not None:
            return state
        if step <= self.last_emitted:
            self.late(who, step)
            return None
        return self.open(step, now, position)

    def incomplete(
        self, prod: ProducerInfo, steps: Sequence[int], now: float, position: object, replay: bool
    ) -> None:
        """``prod`` says it sent ``steps`` without some of their values (it dropped them before
        reducing them): each goes out partial, naming its slot, opened if need be (a step
        whose values it lost whole). One already emitted is opened again if the output says
        so (a relay: its root must hear of it); otherwise it had gone out without them:
        counted and logged. A replaced process's word counts for the steps it had finished
        (recovery: ``sealing``)."""
        sealing = self.sealing(prod, replay)
        if sealing is None:
            return
        slot = prod.slot
        for step in steps:
            if sealing and step > prod.watermark:
                continue  # a replaced process's step that its successor answers for
            state = self.steps.get(step)
            if state is not None and state.position is None:
                state.position = position  # a step opened from the checkpoint
            if state is None and step <= self.last_emitted:
                finished = self.output.reopen(self, prod, step)
                if finished is None:
                    if not replay:
                        self.health.incomplete_steps += 1
                        self._ratelog.warn(
                            f"incomplete:{self.name}",
                            f"run {self.name!r}: {prod.role}/{prod.rank} says step {step} "
                            f"lost some of its values, after the step was emitted",
                        )
                    continue
                state = self.open(step, now, position, finished)
            elif state is None:
                state = self.open(step, now, position)
            if slot not in state.incomplete:
                state.incomplete.add(slot)
                if not replay:
                    self.health.incomplete_steps += 1

    def refuse(self, prod: ProducerInfo, entries: int, replay: bool) -> None:
        """Entries of a producer that no longer holds its slot (a newer process took it, or
        its rank is outside the role's world size): refused, counted, told back."""
        if replay:
            return
        prod.conflict += entries
        self.health.conflict_entries += entries
        self._ratelog.warn(
            f"conflict:{prod.pid}",
            f"run {prod.run!r}: {prod.role}/{prod.rank} (producer {prod.pid:x}, host "
            f"{prod.host}) sent data but does not hold that slot (another process registered "
            "it later, or the rank is outside the role's world size); refused",
        )

    def late(self, who: str, step: int) -> None:
        """Count and report data for a step of this run that was already emitted."""
        self.health.late += 1
        self._ratelog.warn(
            f"late:{self.name}",
            f"run {self.name!r}: {who} sent step {step} after it was emitted "
            f"(latest emitted {self.last_emitted}); not merged",
        )

    # ------------------------------------------------------------------ slots

    def advance(self, prod: ProducerInfo, watermark: int, now: float) -> None:
        """Record that ``prod`` has finished every step up to ``watermark``."""
        if watermark <= prod.watermark:
            return
        if self.membership.holds_slot(prod):
            self._finished(prod, watermark, now)
        else:
            prod.watermark = watermark

    def _finished(self, prod: ProducerInfo, watermark: int, now: float) -> None:
        """:meth:`advance` for a producer known to hold its slot here."""
        if watermark > prod.watermark:
            old, prod.watermark = prod.watermark, watermark
            self.merger.finish_through(prod.slot, old, watermark, now)

    def took_over(self, prod: ProducerInfo) -> None:
        """``prod`` just took its slot from another process: that process's data comes out
        of the steps not yet emitted (:meth:`withdraw`)."""
        old, prod.replaced = prod.replaced, None
        if old is not None:
            replaced = self.membership.producers.get(old)
            finished = replaced.watermark if replaced is not None else -1
            self.withdraw(old, prod.slot, finished)
            self.membership.resumes(prod, finished)

    def resume(self, prod: ProducerInfo, first: int, ran: bool = True) -> None:
        """``prod``, which took its slot from another process, ran ``first`` as its first
        step: the steps between the last one its predecessor finished and ``first`` were run
        by neither (:meth:`skip`). ``ran=False``: ``prod`` has finished the steps before
        ``first`` without showing it ran any (a relay's watermark); they are missing the slot
        unless it gives them data, and its first step is still to be seen."""
        after = prod.resumes_after
        if ran:
            self.membership.resumes(prod, None)
        if after is not None and self.membership.holds_slot(prod):
            self.skip(prod.slot, after, first)

    def withdraw(self, pid: int, slot: Slot, finished: int) -> int:
        """Producer ``pid``'s slot was taken over by a new process: its data for the open
        steps up to ``finished`` stays (``sealed``), for later ones it is taken out and the
        step rebuilt, or, merged by a relay with other ranks', the step is ``tainted``. Return
        how many steps lost data."""
        changed = 0
        self.merger.merge_pending()
        for state in self.steps.values():
            if state.step > finished:
                state.incomplete.discard(slot)  # the old process's word: the new one answers
            if pid not in state.contributors:
                continue
            if state.step <= finished:
                state.sealed.add(slot)
                continue
            changed += 1
            state.done.discard(slot)
            state.withdrawn.add(slot)
            state.spans = [sp for sp in state.spans if (sp.role, sp.rank) != slot]
            if any(pid in i.pids for i in state.inputs):
                state.tainted.add(slot)
                continue
            self.merger.rebuild(state, [i for i in state.inputs if i.pid != pid])
        self.merger.merge_pending()
        return changed

    def skip(self, slot: Slot, after: int, first: int) -> None:
        """Nobody ran ``slot``'s steps strictly between ``after`` and ``first``: whatever
        ``done`` says, they go out partial naming the slot unless it gives them data."""
        if first - after <= 1:
            return
        for state in self.steps.values():
            if after < state.step < first:
                state.withdrawn.add(slot)
        if first - 1 > self.last_emitted:  # for steps opened later, or rebuilt after a restart
            self.skipped[slot] = (after, first)

    # ------------------------------------------------------------------ emitting

    def due(self, now: float, config: CollectorConfig) -> Iterator[tuple[StepState, set[Slot]]]:
        """The open steps to emit now, with their missing slots (``completion.due``)."""
        membership, name = self.membership, self.name
        return due(
            self.steps,
            self.members,
            now,
            grace_s=config.grace_s,
            settle_s=config.settle_s,
            max_open_steps=config.max_open_steps * HARD_OPEN_FACTOR,
            gone=lambda slot: membership.gone(name, slot, now),
        )

    def close(self, state: StepState) -> None:
        """Take a finished step out of the open ones: it is emitted now."""
        del self.steps[state.step]
        self.last_emitted = max(self.last_emitted, state.step)
        if self.skipped and not self.output.local:  # a relay's steps may open again
            emitted = self.last_emitted
            self.skipped = {k: v for k, v in self.skipped.items() if v[1] - 1 > emitted}

    # ------------------------------------------------------------------ read (RunView)

    def read(self, state: StepState) -> tuple[dict[str, float], dict[str, str]]:
        return self.merger.read(state, self.members)  # its metrics, and the role(s) behind each

    def distributions(self, state: StepState) -> dict[str, bytes]:
        return self.merger.distributions(state)  # by name, in wire form

    def finished_slots(self, step: int) -> set[Slot]:
        """Slots whose producer has already finished ``step``."""
        return self.membership.finished_slots(self.name, step)

    def overcounted(self, state: StepState) -> set[Slot]:
        return overcounted(state, self.members, self.membership.producers)

    # ------------------------------------------------------------------ durable state

    def snapshot(self, data: dict) -> None:
        """Add this run's progress to its checkpoint entry (open steps are rebuilt from the
        write-ahead log, but for what a takeover took out of them: ``withdrawn``)."""
        data["last_emitted"] = self.last_emitted
        if self.skipped:  # re-marked on the open steps rebuilt
            data["skipped"] = [[*slot, *bounds] for slot, bounds in self.skipped.items()]
        # The replay leaves out what a takeover withdrew: a step only the replaced process had
        # opened would not open again, where the collector that never stopped emits it partial.
        lost = [
            [state.step, sorted(map(list, state.withdrawn)), sorted(map(list, state.tainted))]
            for state in self.steps.values()
            if state.withdrawn or state.tainted
        ]
        if lost:
            data["withdrawn"] = lost

    def restore(self, data: Mapping, now: float) -> None:
        self.last_emitted = int(data["last_emitted"])
        for role, rank, after, first in data.get("skipped", []):
            self.skipped[(role, int(rank))] = (int(after), int(first))
        for step, withdrawn, tainted in data.get("withdrawn", []):
            if int(step) > self.last_emitted and int(step) not in self.steps:
                state = self.open(int(step), now, None)  # its position: its first data replayed
                state.withdrawn.update((role, int(rank)) for role, rank in withdrawn)
                state.tainted.update((role, int(rank)) for role, rank in tainted)

    def emitted_through(self, step: int) -> None:
        """Recovery: the steps up to ``step`` are in the sinks' outbox already; a step opened
        from the checkpoint (``withdrawn``) that went out since is not open any more."""
        self.last_emitted = max(self.last_emitted, step)
        for gone in [s for s in self.steps if s <= self.last_emitted]:
            del self.steps[gone]
