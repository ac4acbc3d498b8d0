"""What becomes of a finished step: the one seam between merging and what follows.

The Aggregator decides *when* a step of a run is finished (complete, or due partial), merges
it and takes it out of the run's open steps; its :class:`StepOutput` decides what is made of
it, reading the run through a :class:`RunView` and sending the result with ``emit``. The
collector's output is :class:`StepRecords` (a :class:`~rlpulse.schemas.record.StepRecord` for
the sinks); a relay's is ``rlpulse.collector.tiers.relay.Relay`` (a delta for the collector above):
one aggregator, two outputs, no subclass.

>>> out = StepRecords(tps_window=10, health=Health(), ledger_margin=0.2)
>>> out.local
False
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from rlpulse.collector.health import Health
from rlpulse.collector.output.derived import Throughput
from rlpulse.collector.output.ledgers import Ledgers
from rlpulse.collector.ratelog import RateLimitedLog
from rlpulse.collector.runs.earlier import Earlier
from rlpulse.collector.runs.members import Members, ProducerInfo, Slot
from rlpulse.collector.runs.membership import Membership
from rlpulse.collector.runs.names import NameTable
from rlpulse.collector.runs.steps import StepState
from rlpulse.schemas.record import RunForgotten, StepRecord
from rlpulse.schemas.spans import stragglers

log = logging.getLogger("rlpulse.collector")
Emit = Callable[[Any], None]


class RunView(Protocol):
    """What an output reads of a run (``rlpulse.collector.runs.run.Run``); it changes nothing."""

    @property
    def name(self) -> str: ...

    @property
    def members(self) -> Members: ...

    @property
    def steps(self) -> Mapping[int, StepState]:
        """The open steps, by step."""

    @property
    def names(self) -> NameTable: ...

    def read(self, state: StepState) -> tuple[dict[str, float], dict[str, str]]:
        """A finished step's metrics, and the role(s) behind each."""

    def distributions(self, state: StepState) -> dict[str, bytes]:
        """The step's merged sketches by distribution name, in wire form."""

    def finished_slots(self, step: int) -> set[Slot]:
        """Slots whose producer has already finished ``step``."""

    def overcounted(self, state: StepState) -> set[Slot]:
        """Roles with more contributing processes than ranks, as slots ``(role, -1)``."""


class Host(Protocol):
    """What an output's hooks (``before`` ... ``restore``) use of the aggregator that calls
    them (``rlpulse.collector.runs.aggregator.Aggregator``): its runs, read through
    :class:`RunView`, their membership, and where records go. Not the aggregator itself."""

    @property
    def membership(self) -> Membership: ...

    @property
    def runs(self) -> Mapping[str, RunView]: ...

    @property
    def emit(self) -> Emit: ...


class StepOutput(Protocol):
    """What becomes of a finished step. Implemented by :class:`StepRecords` (a collector)
    and ``rlpulse.collector.tiers.relay.Relay`` (a relay)."""

    local: bool
    """Steps complete over the ranks registered *here*, and run attempts are decided
    above (a relay); otherwise over the whole declared topology, attempts decided here."""

    def finish(self, run: RunView, state: StepState, missing: set[Slot], emit: Emit) -> bool:
        """``state`` of ``run`` is finished (merged, no longer open): emit what it makes;
        ``missing``: slots without data. Return whether it went out partial."""

    def reopen(self, run: RunView, prod: ProducerInfo, step: int) -> set[Slot] | None:
        """``prod`` sent data for ``step``, already finished: the slots that had finished it,
        to open it again for the new data; None: the data is late (counted, dropped)."""

    def before(self, agg: Host, now: float) -> None:
        """Before the due steps are finished, at every poll."""

    def after(self, agg: Host, now: float | None) -> None:
        """After the due steps were finished: at every poll, and at the final flush (``now``
        None)."""

    def note_emitted(self, agg: Host, record: Any) -> None:
        """Recovery: ``record`` (one this output emitted) is in the outbox already."""

    def snapshot(self, agg: Host, out: dict) -> None:
        """Add this output's state to the aggregator's checkpoint ``out``."""

    def restore(self, agg: Host, snapshot: Mapping) -> None:
        """Take this output's state back from a checkpoint."""

    def forget(self, agg: Host, run: str, pids: list[int], emit: Emit | None) -> None:
        """The run ``run`` and its producers ``pids`` are forgotten (``runs.retention``): drop
        what is kept of them, and with ``emit`` tell what follows (the sinks, the root)."""


class StepRecords:
    """The collector's output: each finished step as a :class:`StepRecord` (metrics read
    off the merged states, derived throughput, stragglers, the step ledger, partial flags)
    for the sinks. ``ledger_margin``: see ``CollectorConfig``. ``earlier`` (a collector without
    ``state_dir``): what an earlier instance of it may have written, which flags records
    ``continued``; the record's flags are decided here."""

    local = False

    def __init__(
        self,
        tps_window: int,
        health: Health,
        ledger_margin: float,
        *,
        earlier: Earlier | None = None,
    ) -> None:
        self.tps_window = tps_window
        self.health = health
        self.ledgers = Ledgers(ledger_margin)
        self.earlier = earlier
        self.totals: dict[str, Throughput] = {}
        """Per run: the throughput window and cumulative counts (``system/tps``)."""
        self._ratelog = RateLimitedLog(log)

    def _totals(self, run: str) -> Throughput:
        totals = self.totals.get(run)
        if totals is None:
            totals = self.totals[run] = Throughput(self.tps_window)
        return totals

    def finish(self, run: RunView, state: StepState, missing: set[Slot], emit: Emit) -> bool:
        over = run.overcounted(state)
        if over:
            self.health.overcounted_steps += 1
            self._ratelog.warn(
                f"over:{run.name}",
                f"run {run.name!r} step {state.step}: roles {sorted(r for r, _ in over)} have "
                "more contributing processes than their world size; emitted partial",
            )
            missing = missing | over
        metrics, roles = run.read(state)
        self._totals(run.name).derive(state.t_last, metrics)
        ledger = None
        if state.spans:
            metrics.update(stragglers(state.spans))
            ledger = self.ledgers.add(run.name, state.spans, metrics)
        continued, resent = (
            (False, ()) if self.earlier is None else self.earlier.flags(run.name, state.step)
        )
        record = StepRecord(
            run=run.name,
            step=state.step,
            metrics=metrics,
            partial=bool(missing) or continued,
            missing=tuple(
                f"{role}/{rank if rank >= 0 else 'overcounted'}" for role, rank in sorted(missing)
            ),
            continued=continued,
            resent=resent,
            ranks=len(state.contributors),
            nonfinite=dict(state.nonfinite),
            time=state.t_last,
            roles=roles,
            spans=tuple(state.spans),
            distributions=run.distributions(state),
            samples={run.names.names[j]: merged for j, merged in state.samples.items()},
            ledger=ledger,
        )
        if record.partial:
            self._ratelog.warn(
                f"partial:{run.name}",
                f"run {run.name!r} step {state.step} emitted partial; {record.why_partial()}",
            )
        emit(record)
        return record.partial

    def reopen(self, run: RunView, prod: ProducerInfo, step: int) -> set[Slot] | None:
        return None  # a step record went out: what comes now is late

    def before(self, agg: Host, now: float) -> None:
        pass

    def after(self, agg: Host, now: float | None) -> None:
        pass

    def note_emitted(self, agg: Host, record: StepRecord) -> None:
        """Continue the run's throughput window, cumulative totals and the window of its
        ledger's steps from ``record``."""
        self._totals(record.run).resume(record.time, record.metrics)
        self.ledgers.note_emitted(record.run, record.metrics, record.ledger)

    def snapshot(self, agg: Host, out: dict) -> None:
        for name, data in out["runs"].items():
            data.update(self._totals(name).snapshot())
            data["ledger_steps"] = self.ledgers.snapshot(name)

    def restore(self, agg: Host, snapshot: Mapping) -> None:
        for name, data in snapshot.get("runs", {}).items():
            self._totals(name).restore(data)
            self.ledgers.restore(name, data.get("ledger_steps", []))

    def forget(self, agg: Host, run: str, pids: list[int], emit: Emit | None) -> None:
        """Drop the run's throughput window and totals; the sinks forget it too."""
        self.totals.pop(run, None)
        if self.earlier is not None:
            self.earlier.forget(run, pids)
        self.ledgers.forget(run)
        if emit is not None:
            emit(RunForgotten(run))
