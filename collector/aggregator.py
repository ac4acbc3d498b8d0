"""Per-(run, step) merging across every rank of every role: decoded messages in, finished
steps out, exactly once each.

The work is split by concern: who belongs to a run and who is alive
(``rlpulse.collector.membership``), the open steps, their merging and completion
(``rlpulse.collector.steps``), and the metrics derived from emitted steps (``rlpulse.collector.derived``). This
module routes each message to them and assembles the :class:`~rlpulse.schemas.record.StepRecord` of a
finished step. What becomes of a finished step is its :class:`StepOutput`: the
collector's is :class:`StepRecords` (a :class:`~rlpulse.schemas.record.StepRecord` for the
sinks), a relay's is ``rlpulse.collector.relay.Relay`` (a delta for the collector above): one
aggregator, two outputs, no subclass. It also implements the small protocol durable state
recovers through (``rlpulse.collector.durable.Recoverable``).

Data for a step that was already emitted is *late*: counted and logged, never merged.

A step's time is the latest ``log()`` time of any rank, read off the producers' clocks. With a
``wall_clock`` (the daemon's), a time later than the collector's own when the message is
handled is bounded to it: the collector can vouch that the call happened before it received
it, not that a rank's clock is right. One rank's clock an hour ahead would otherwise put every
record an hour in the future and break ``system/tps`` (``CLOCK_SKEW_S``).

>>> agg = Aggregator(records.append, CollectorConfig(grace_s=30))  # doctest: +SKIP
>>> agg.handle(hello_msg, now); agg.handle(metrics_msg, now); agg.poll(now)  # doctest: +SKIP
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import numpy as np

from rlpulse.collector.config import CollectorConfig
from rlpulse.collector.derived import Throughput
from rlpulse.collector.health import Health
from rlpulse.collector.membership import FINISHED, Membership, ProducerInfo, Slot
from rlpulse.collector.ratelog import RateLimitedLog
from rlpulse.collector.sketches import by_table_row
from rlpulse.collector.spans import SpanReader
from rlpulse.collector.steps import HARD_OPEN_FACTOR, RunSteps, StepState
from rlpulse.schemas import protocol
from rlpulse.schemas.catalog import Catalog
from rlpulse.schemas.metrics import CATALOG
from rlpulse.schemas.record import StepRecord
from rlpulse.schemas.spans import stragglers

log = logging.getLogger("rlpulse.collector")
CLOCK_SKEW_S = 2.0
"""A ``log()`` time this much ahead of the collector's clock at receipt is counted
(``Health.clock_skew``) and its rank named once in the log; any time ahead is bounded to the
receive time (less than this is ordinary clock drift between hosts)."""


class StepOutput(Protocol):
    """What becomes of a finished step: the one seam between merging and what follows.

    The aggregator decides *when* a step is finished (complete, or due partial) and merges
    it; its output decides what is made of it and sends it with ``agg.emit``. Each call gets
    the aggregator, whose membership and runs the output reads. Implemented by
    :class:`StepRecords` (a collector) and ``rlpulse.collector.relay.Relay`` (a relay)."""

    local: bool
    """Steps complete over the ranks registered *here*, and run attempts are decided
    above (a relay); otherwise over the whole declared topology, attempts decided here."""

    def finish(self, agg: Aggregator, run: RunSteps, state: StepState, missing: set) -> None:
        """``state`` is finished (merged, still in ``run.steps``): remove it from ``run``
        (``run.close``, or by hand) and emit what it makes; ``missing``: slots without data."""

    def reopen(
        self, agg: Aggregator, run: RunSteps, prod: ProducerInfo, step: int
    ) -> set[Slot] | None:
        """``prod`` sent data for ``step``, already finished: the slots that had finished it,
        to open it again for the new data; None: the data is late (counted, dropped)."""

    def before(self, agg: Aggregator, now: float) -> None:
        """Before the due steps are finished, at every poll."""

    def after(self, agg: Aggregator, now: float | None) -> None:
        """After the due steps were finished: at every poll, and at the final flush (``now``
        None)."""

    def note_emitted(self, agg: Aggregator, record: Any) -> None:
        """Recovery: ``record`` (one this output emitted) is in the outbox already."""

    def snapshot(self, agg: Aggregator, out: dict) -> None:
        """Add this output's state to the aggregator's checkpoint ``out``."""

    def restore(self, agg: Aggregator, snapshot: Mapping) -> None:
        """Take this output's state back from a checkpoint."""


class StepRecords:
    """The collector's output: each finished step as a :class:`StepRecord` (metrics read
    off the merged states, derived throughput, stragglers, partial flags) for the sinks."""

    local = False

    def __init__(self, tps_window: int) -> None:
        self.tps_window = tps_window
        self.totals: dict[str, Throughput] = {}
        """Per run: the throughput window and cumulative counts (``system/tps``)."""

    def _totals(self, run: str) -> Throughput:
        totals = self.totals.get(run)
        if totals is None:
            totals = self.totals[run] = Throughput(self.tps_window)
        return totals

    def finish(self, agg: Aggregator, run: RunSteps, state: StepState, missing: set) -> None:
        over = agg.overcounted(run, state)
        if over:
            agg.health.overcounted_steps += 1
            agg._ratelog.warn(
                f"over:{run.name}",
                f"run {run.name!r} step {state.step}: roles {sorted(r for r, _ in over)} have "
                "more contributing processes than their world size; emitted partial",
            )
            missing = missing | over
        metrics, roles = run.close(state, agg.membership.runs[run.name])
        self._totals(run.name).derive(state.t_last, metrics)
        if state.spans:
            metrics.update(stragglers(state.spans))
        record = StepRecord(
            run=run.name,
            step=state.step,
            metrics=metrics,
            partial=bool(missing),
            missing=tuple(
                f"{role}/{rank if rank >= 0 else 'overcounted'}" for role, rank in sorted(missing)
            ),
            ranks=len(state.contributors),
            nonfinite=dict(state.nonfinite),
            time=state.t_last,
            roles=roles,
            spans=tuple(state.spans),
            distributions=run.distributions(state),
        )
        agg.health.steps_emitted += 1
        if record.partial:
            agg.health.partial_steps += 1
            agg._ratelog.warn(
                f"partial:{run.name}",
                f"run {run.name!r} step {state.step} emitted partial; missing "
                f"{', '.join(record.missing)}",
            )
        agg.emit(record)

    def reopen(
        self, agg: Aggregator, run: RunSteps, prod: ProducerInfo, step: int
    ) -> set[Slot] | None:
        return None  # a step record went out: what comes now is late

    def before(self, agg: Aggregator, now: float) -> None:
        pass

    def after(self, agg: Aggregator, now: float | None) -> None:
        pass

    def note_emitted(self, agg: Aggregator, record: StepRecord) -> None:
        """Continue the run's throughput window and cumulative totals from ``record``."""
        self._totals(record.run).resume(record.time, record.metrics)

    def snapshot(self, agg: Aggregator, out: dict) -> None:
        for name, data in out["runs"].items():
            data.update(self._totals(name).snapshot())

    def restore(self, agg: Aggregator, snapshot: Mapping) -> None:
        for name, data in snapshot.get("runs", {}).items():
            self._totals(name).restore(data)


class Aggregator:
    """Merges decoded messages and hands finished steps to its :class:`StepOutput`
    (default: :class:`StepRecords`, which sends them through ``emit``).

    Time is passed in (``now``, monotonic seconds) so tests drive it without sleeping.
    """

    def __init__(
        self,
        emit: Callable[[Any], None],
        config: CollectorConfig,
        *,
        output: StepOutput | None = None,
        health: Health | None = None,
        catalog: Catalog = CATALOG,
        wall_clock: Callable[[], float] | None = None,
    ) -> None:
        """``wall_clock``: the collector's wall time (``time.time``), which bounds the
        producers' ``log()`` times (see the module docstring); None trusts them as given."""
        self.emit = emit
        self.config = config
        self.output: StepOutput = output if output is not None else StepRecords(config.tps_window)
        self.health = health or Health()
        self.catalog = catalog
        self.membership = Membership(
            liveness_s=config.liveness_s, health=self.health, local=self.output.local
        )
        self.steps: dict[str, RunSteps] = {}
        self.spans = SpanReader()
        self._ratelog = RateLimitedLog(log)
        self._wall_clock = wall_clock
        self._skewed: set[int] = set()
        """Producers (and relays) already named in a clock-skew warning."""

    @property
    def producers(self) -> dict[int, ProducerInfo]:
        return self.membership.producers

    def _run(self, name: str) -> RunSteps:
        steps = self.steps.get(name)
        if steps is None:
            steps = self.steps[name] = RunSteps(
                name,
                catalog=self.catalog,
                health=self.health,
                max_names=self.config.max_names_per_run,
            )
        return steps

    def open_steps(self) -> int:
        return sum(len(run.steps) for run in self.steps.values())

    # ------------------------------------------------------------------ messages

    def handle(
        self, msg: protocol.Message, now: float, position: object = None, replay: bool = False
    ) -> None:
        """Apply one decoded message. ``position`` is where it starts in the write-ahead log;
        with ``replay`` (recovery), data for steps already emitted is skipped silently."""
        kind = type(msg)
        if kind is protocol.Hello:
            registered = self.membership.register(msg, now)  # type: ignore[arg-type]
            if registered.logs:
                self._run(registered.run)
                self._withdraw_replaced(registered)
            return
        if kind is protocol.RelayHello:
            if self.output.local:  # one tier of relays under the root
                self.health.reject("relay_of_relay")
                self._ratelog.warn(
                    "relay_of_relay",
                    f"relay {msg.producer:x} on {msg.host} sent its hello to this relay; relays "  # type: ignore[union-attr]
                    "attach to the root only (its `upstream` should be the root's address)",
                )
                return
            self.membership.register_relay(msg, now)  # type: ignore[arg-type]
            for member in msg.members:  # type: ignore[union-attr]
                prod = self.membership.producers.get(member.producer)
                if member.logs and prod is not None:
                    self._run(prod.run)
                    self._withdraw_replaced(prod)
            return
        prod = self.membership.seen(msg.producer, now)
        if prod is None:
            return
        if not prod.logs:
            self._endpoint_only(prod, msg)
            return
        if kind is protocol.Metrics:
            run = self._run(prod.run)
            sealing = False
            if not self.membership.holds_slot(prod):
                if not (replay and self.membership.replaced(prod)):
                    self._conflict(prod, len(msg.entries), replay)  # type: ignore[union-attr]
                    return
                # Recovery replays the log knowing who holds each slot now; a process
                # replaced since held its slot when this came. Its finished steps keep it.
                sealing = True
            bit = self.membership.runs[prod.run].role_bits[prod.role]
            entries = msg.entries  # type: ignore[union-attr]
            if self._wall_clock is not None:
                entries = self._bound_times(prod, entries, replay)
            if msg.sketches:  # type: ignore[union-attr]
                sketches = by_table_row(msg.sketches, len(entries))  # type: ignore[union-attr]
                for entry, sketch in zip(entries, sketches, strict=True):
                    self._entry(run, prod, bit, entry, now, position, replay, sketch, sealing)
            else:
                for entry in entries:
                    self._entry(run, prod, bit, entry, now, position, replay, sealing=sealing)
            if sealing:
                return
            if prod.resumes_after is not None and msg.done >= 0:  # type: ignore[union-attr]
                self._resume(prod, msg.done)  # type: ignore[union-attr]
            self._finished(run, prod, msg.done, now)  # type: ignore[union-attr]
        elif kind is protocol.Delta:
            self._apply_delta(prod, msg, now, position, replay)  # type: ignore[arg-type]
        elif isinstance(msg, protocol.Done):
            if prod.resumes_after is not None:
                self._resume(prod, msg.step)
            self._advance(prod, msg.step, now)
        elif isinstance(msg, protocol.Heartbeat):
            self.membership.note_stats(prod, msg.stats)
        elif isinstance(msg, protocol.Bye):
            self.membership.note_stats(prod, msg.stats)
            if prod.resumes_after is not None:
                self._resume(prod, FINISHED)
            self._advance(prod, FINISHED, now)

    def _bound_times(self, prod: ProducerInfo, entries: list, replay: bool) -> list:
        """``entries`` with every ``log()`` time later than the collector's clock now bounded
        to it; more than ``CLOCK_SKEW_S`` ahead is counted, and the rank named once."""
        bound = self._wall_clock()  # type: ignore[misc]
        if all(e[1] <= bound for e in entries):
            return entries  # the common case: no copy
        ahead = max(e[1] for e in entries) - bound
        if ahead > CLOCK_SKEW_S and not replay:
            self.health.clock_skew += sum(1 for e in entries if e[1] - bound > CLOCK_SKEW_S)
            who = f"{prod.role}/{prod.rank} of run {prod.run!r} (host {prod.host})"
            self._warn_skew(prod.pid, who, ahead)
        return [(e[0], min(e[1], bound), *e[2:]) for e in entries]

    def _warn_skew(self, pid: int, who: str, ahead: float) -> None:
        if pid in self._skewed:
            return
        self._skewed.add(pid)
        log.warning(
            "%s logs times %.1fs ahead of this collector's clock: its clock is off; its times "
            "are bounded by when the collector received them (counted in "
            "rlpulse_collector_clock_skew_entries_total; warned once)",
            who,
            ahead,
        )

    def _withdraw_replaced(self, prod: ProducerInfo) -> None:
        """``prod`` just took its slot from another process: take that process's data out of
        the steps not yet emitted (``RunSteps.withdraw``)."""
        old, prod.replaced = prod.replaced, None
        if old is not None:
            replaced = self.membership.producers.get(old)
            finished = replaced.watermark if replaced is not None else -1
            self._run(prod.run).withdraw(old, prod.slot, finished)
            self.membership.resumes(prod, finished)

    def _resume(self, prod: ProducerInfo, first: int, ran: bool = True) -> None:
        """``prod``, which took its slot from another process, ran ``first`` as its first
        step: the steps between the last one its predecessor finished and ``first`` were run
        by neither (a rank that died between steps and came back further on, or whose
        predecessor's last steps still wait behind another relay). Its cumulative ``done``
        will say they are finished; ``RunSteps.skip`` makes them missing the slot instead.
        ``ran=False``: ``prod`` has finished the steps before ``first`` without showing it ran
        any (a relay's watermark); they are missing the slot unless it gives them data, and
        its first step is still to be seen."""
        after = prod.resumes_after
        if ran:
            self.membership.resumes(prod, None)
        if after is not None and self.membership.holds_slot(prod):
            self._run(prod.run).skip(prod.slot, after, first)

    def admits(self, msg: protocol.Message, closing: bool = False) -> bool:
        """Whether ``msg`` may be applied now. A producer's data that would open a step
        while its run already holds ``max_open_steps`` open steps waits (the daemon leaves it
        unacknowledged, and asks for it again once steps were emitted): a producer merely
        ahead of the others (it has finished the oldest open step) is held back instead of
        forcing the oldest steps out partial. A ``closing`` producer (its goodbye has come,
        behind the data held back) is admitted up to the hard bound (``HARD_OPEN_FACTOR``
        times the window), so its ``close()`` need not wait for the others to catch up."""
        if type(msg) is not protocol.Metrics:
            return True
        prod = self.membership.producers.get(msg.producer)
        run = self.steps.get(prod.run) if prod is not None else None
        if run is None or len(run.steps) < self.config.max_open_steps:
            return True
        steps, last = run.steps, run.last_emitted
        opens = {e[0] for e in msg.entries if e[0] not in steps and e[0] > last}
        if not opens:
            return True
        if closing and len(steps) + len(opens) <= self.config.max_open_steps * HARD_OPEN_FACTOR:
            return True
        # It opens a step. Hold it only if this producer is ahead: it has finished the oldest
        # open step. One that still owes it is what the window waits for: always admitted.
        return prod.watermark < min(steps)  # type: ignore[union-attr]

    def has_room(self, pid: int) -> bool:
        """Producer ``pid``, held back, may go on: half its run's ``max_open_steps`` window
        is free again, or it now owes the oldest open step. (Woken at the first free step,
        a producer far ahead resent everything it held for one step's room, and was held
        again: a storm of resends, many times its data, while the others caught up.)"""
        prod = self.membership.producers.get(pid)
        run = self.steps.get(prod.run) if prod is not None else None
        if run is None or len(run.steps) <= self.config.max_open_steps // 2:
            return True
        return prod.watermark < min(run.steps)  # type: ignore[union-attr]

    def feedback(self, pid: int) -> tuple[int, int, str, int, list[tuple[int, int]]]:
        """What an acknowledgement tells producer ``pid`` (``Membership.feedback``)."""
        return self.membership.feedback(pid)

    def _endpoint_only(self, prod: ProducerInfo, msg: protocol.Message) -> None:
        """A message of a producer that registered a metrics endpoint only: its counters and
        its goodbye (which unlists the endpoint) apply; data, which it said it would not send,
        is dropped and counted."""
        if isinstance(msg, (protocol.Heartbeat, protocol.Bye)):
            self.membership.note_stats(prod, msg.stats)
            if isinstance(msg, protocol.Bye):
                prod.watermark = FINISHED
            return
        self.health.reject("bad_field")
        self._ratelog.warn(
            f"endpoint-only:{prod.pid}",
            f"{prod.role}/{prod.rank} of run {prod.run!r} registered a metrics endpoint only "
            "(logs=False) yet sent data; dropped",
        )

    def _entry(
        self,
        run: RunSteps,
        prod: ProducerInfo,
        role_bit: int,
        entry: tuple,
        now: float,
        position: object,
        replay: bool,
        sketches: dict[int, bytes] | None = None,
        sealing: bool = False,
    ) -> None:
        """One entry of ``prod``'s. ``sealing`` (recovery only): ``prod`` has been replaced
        since; its data counts for the steps it had finished, as at the takeover
        (``RunSteps.withdraw``): kept, the slot finished there, and sealed against the new
        process's repeats. Its data for later steps had been withdrawn."""
        step, t, table, values, nonfinite = entry
        if sealing and step > prod.watermark:
            return
        if not replay:
            self.health.events_received += 1
        if prod.resumes_after is not None:
            self._resume(prod, step)
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
        state = run.steps.get(step)
        if state is None:
            if step <= run.last_emitted:
                state = self._after_emission(run, prod, step, now, position, replay)
                if state is None:
                    self._advance(prod, step - 1, now)
                    return
            else:
                finished = self.membership.finished_slots(run.name, step)
                state = run.open(step, now, finished, position)
        elif state.sealed and prod.slot in state.sealed and not sealing:  # a repeat of it
            if not replay:
                prod.late += 1
                self._late(run, f"{prod.role}/{prod.rank} (restarted)", step)
            return
        run.add(state, table, values, role_bit, prod.pid, t, nonfinite, sketches)
        if run.names_full:  # names left out of this run: tell the producer how many of its
            prod.names_dropped += run.layout(table).dropped
        spans = self.spans.read(prod.role, prod.rank, prod.host, t, table, values)
        if spans:
            state.spans += spans
        if sealing:
            state.sealed.add(prod.slot)
            state.finish(prod.slot, now)
        elif step - 1 > prod.watermark:
            self._advance(prod, step - 1, now)

    def _after_emission(
        self,
        run: RunSteps,
        prod: ProducerInfo,
        step: int,
        now: float,
        position: object,
        replay: bool,
    ) -> StepState | None:
        """Data for a step already emitted: opened again if the output says so (a relay's
        rank that missed a forwarded step); otherwise late (counted, never merged), or, when
        replaying the write-ahead log, data that went out with the step (skipped silently)."""
        finished = self.output.reopen(self, run, prod, step)
        if finished is not None:
            return run.open(step, now, finished, position)
        if not replay:
            prod.late += 1
            self._late(run, f"{prod.role}/{prod.rank}", step)
        return None

    def _conflict(self, prod: ProducerInfo, entries: int, replay: bool) -> None:
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

    def _late(self, run: RunSteps, who: str, step: int) -> None:
        """Count and report data for a step of ``run`` that was already emitted."""
        self.health.late += 1
        self._ratelog.warn(
            f"late:{run.name}",
            f"run {run.name!r}: {who} sent step {step} after it was emitted "
            f"(latest emitted {run.last_emitted}); not merged",
        )

    def _open_or_late(
        self, run: RunSteps, step: int, now: float, position: object, who: str
    ) -> StepState | None:
        """The open state of ``step``, opened if need be; None (counted) if it was emitted."""
        state = run.steps.get(step)
        if state is not None:
            return state
        if step <= run.last_emitted:
            self._late(run, who, step)
            return None
        return run.open(step, now, self.membership.finished_slots(run.name, step), position)

    def _apply_delta(
        self,
        relay: ProducerInfo,
        msg: protocol.Delta,
        now: float,
        position: object,
        replay: bool,
    ) -> None:
        """A relay's merged entries for one run, then how far its members have finished."""
        name = relay.aliases.get(msg.run, msg.run)  # the attempt its members joined here
        if name not in self.membership.runs:
            self.health.reject("bad_field")
            return
        run, members = self._run(name), self.membership.runs[name]
        sketches = by_table_row(msg.sketches, len(msg.entries))
        resuming = self.membership.resuming
        bound = self._wall_clock() if self._wall_clock is not None else None
        for i, entry in enumerate(msg.entries):
            step, t_first, t_last, table_id, values, nonfinite, pids, owners = entry
            if bound is not None and t_last > bound:  # the relay's or its ranks' clock
                if t_last - bound > CLOCK_SKEW_S and not replay:
                    self.health.clock_skew += 1
                    self._warn_skew(
                        relay.pid, f"relay {relay.pid:x} (host {relay.host})", t_last - bound
                    )
                t_first, t_last = min(t_first, bound), bound
            if not replay:
                self.health.events_received += 1
            table = relay.tables.get(table_id)
            if table is None or len(owners) != table.size:
                self.health.reject("bad_table")
                continue
            if replay and step <= run.last_emitted:
                continue
            if resuming and not resuming.isdisjoint(pids):
                self._resume_members(pids, step)
            state = self._open_or_late(run, step, now, position, f"relay {relay.pid:x}")
            if state is None:
                self._late_members(relay, pids)
                continue
            row_roles = np.array([members.bits_of(o) for o in owners], dtype=np.int64)
            run.add_merged(
                state, table, values, row_roles, pids, (t_first, t_last), nonfinite, sketches[i]
            )
        for step, span in msg.spans:
            state = run.steps.get(step)  # opened by the step's entries, unless they came late
            if state is not None:
                state.spans.append(span)
        for pid, watermark in msg.watermarks:
            member = self.membership.producers.get(pid)
            if member is not None and member.via == relay.pid:
                if member.resumes_after is not None:
                    # A relay's watermark is no proof that the member ran those steps (it
                    # is implied by data for a later step, and the relay reports it only as
                    # far as the step it forwards): only its data is (above). Taken as not
                    # run, a step it ran without data goes out partial, which is safe; the
                    # other way, one it never ran would go out complete without its data.
                    self._resume(member, watermark + 1, ran=False)
                self._advance(member, watermark, now)

    def _late_members(self, relay: ProducerInfo, pids: list[int]) -> None:
        """A relay's entry came late: each member merged in it lost an entry, told back to
        the relay (``Membership.relay_late``) so it tells the producer."""
        told = self.membership.relay_late.setdefault(relay.pid, {})
        for pid in pids:
            member = self.membership.producers.get(pid)
            if member is not None and member.via == relay.pid:
                member.late += 1
                told[pid] = member.late

    def _resume_members(self, pids: list[int], step: int) -> None:
        """:meth:`_resume` for the members of a relay's entry for ``step`` that took their
        slot from another process and have not run a step yet."""
        producers = self.membership.producers
        for pid in pids:
            member = producers.get(pid)
            if member is not None and member.resumes_after is not None:
                self._resume(member, step)

    def _advance(self, prod: ProducerInfo, watermark: int, now: float) -> None:
        """Record that ``prod`` has finished every step up to ``watermark``."""
        if watermark <= prod.watermark:
            return
        if self.membership.holds_slot(prod):
            self._finished(self._run(prod.run), prod, watermark, now)
        else:
            prod.watermark = watermark

    @staticmethod
    def _finished(run: RunSteps, prod: ProducerInfo, watermark: int, now: float) -> None:
        """:meth:`_advance` for a producer known to hold its slot in ``run``."""
        if watermark > prod.watermark:
            old, prod.watermark = prod.watermark, watermark
            run.finish_through(prod.slot, old, watermark, now)

    # ------------------------------------------------------------------ emitting

    def poll(self, now: float) -> None:
        """Emit every step that is complete, or due to be emitted partial."""
        cfg = self.config
        self.output.before(self, now)
        for name, run in list(self.steps.items()):
            if not run.steps:
                continue
            members = self.membership.runs[name]
            due = run.due(
                members,
                now,
                grace_s=cfg.grace_s,
                settle_s=cfg.settle_s,
                max_open_steps=cfg.max_open_steps * HARD_OPEN_FACTOR,
                gone=lambda slot, name=name: self.membership.gone(name, slot, now),
            )
            for state, missing in due:
                self._emit(run, state, missing)
        self.output.after(self, now)

    def flush(self) -> None:
        """Emit every open step now (shutdown): complete ones as usual, the rest partial."""
        for name, run in list(self.steps.items()):
            run.merge_pending()
            expected = self.membership.runs[name].expected()
            for step in sorted(run.steps):
                state = run.steps[step]
                self._emit(run, state, expected - state.done)
        self.output.after(self, None)

    def overcounted(self, run: RunSteps, state: StepState) -> set:
        """Roles of ``state`` with more contributing processes than their world size (which
        withdrawal at takeovers prevents for direct producers): as slots to name missing."""
        members = self.membership.runs[run.name]
        if len(state.contributors) <= len(members.expected()) and not state.tainted:
            return set()  # the common case: no more processes than ranks in all
        per_role: dict[str, int] = {}
        producers = self.membership.producers
        for pid in state.contributors:
            prod = producers.get(pid)
            if prod is not None:
                per_role[prod.role] = per_role.get(prod.role, 0) + 1
        return {
            (role, -1) for role, count in per_role.items() if count > members.roles.get(role, count)
        }

    def _emit(self, run: RunSteps, state: StepState, missing: set) -> None:
        run.merge_step(state.step)
        self.output.finish(self, run, state, missing)

    # ------------------------------------------------------------------ durable state

    def oldest_position(self) -> object:
        """The earliest write-ahead-log position an open step still needs, or None."""
        positions = [
            st.position
            for run in self.steps.values()
            for st in run.steps.values()
            if st.position is not None
        ]
        return min(positions) if positions else None  # type: ignore[type-var]

    def note_emitted(self, record: Any) -> None:
        """Recovery: ``record`` (a step record, or a relay's) is in the outbox already; never
        emit that step again, and let the output continue from it."""
        run_name, step = getattr(record, "run", ""), getattr(record, "step", -1)
        if run_name and step >= 0:
            self.membership.ensure_run(run_name, 0.0)
            run = self._run(run_name)
            run.last_emitted = max(run.last_emitted, step)
        self.output.note_emitted(self, record)

    def snapshot(self) -> dict:
        """Producers and per-run progress (open steps excluded: they are rebuilt from the log)."""
        out = self.membership.snapshot()
        for name, data in out["runs"].items():
            run = self.steps.get(name)
            data["last_emitted"] = run.last_emitted if run is not None else -1
            if run is not None and run.skipped:  # re-marked on the open steps rebuilt
                data["skipped"] = [[*slot, *bounds] for slot, bounds in run.skipped.items()]
        self.output.snapshot(self, out)
        return out

    def restore(self, snapshot: Mapping, now: float) -> None:
        self.membership.restore(snapshot, now)
        for name, data in snapshot.get("runs", {}).items():
            run = self._run(name)
            run.last_emitted = int(data["last_emitted"])
            for role, rank, after, first in data.get("skipped", []):
                run.skipped[(role, int(rank))] = (int(after), int(first))
        self.output.restore(self, snapshot)
