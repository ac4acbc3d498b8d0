"""Both ends of the relay protocol's delta: a relay makes one of a finished step
(:func:`step_entries`), the collector above applies it (:func:`apply_delta`).

A :class:`~rlpulse.schemas.messages.Delta` carries, for one run, the merged states of the
ranks that finished a step (one entry per step: first and last ``log()`` times, a name table
the relay announced, the values, NaN/inf counts, the producers merged in it and the role(s)
behind each row), their phases, their distributions' sketches, and *watermarks*: each of
those ranks has finished every step up to this one and all its data for them is forwarded.
The root merges the entry as one producer's (merging is associative), and marks the ranks
done only from the watermarks. A rank that took its slot over behind a relay is taken as not
having run the steps its watermark covers (see :func:`apply_delta`).

>>> # relay: entries, sketches, samples = step_entries(run, state, relay_output._table)
>>> # root:  apply_delta(aggregator, relay_info, delta, now, position, replay)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

import numpy as np

from rlpulse.collector.intake.clock import CLOCK_SKEW_S
from rlpulse.collector.runs.members import ProducerInfo
from rlpulse.collector.runs.sketches import by_table_row
from rlpulse.collector.runs.steps import StepState
from rlpulse.schemas import protocol
from rlpulse.schemas.messages import Table
from rlpulse.schemas.samples import encode as encode_samples
from rlpulse.schemas.sketch import encode as encode_sketch

if TYPE_CHECKING:
    from rlpulse.collector.health import Health
    from rlpulse.collector.intake.clock import ClockBound
    from rlpulse.collector.output.records import RunView
    from rlpulse.collector.runs.membership import Membership
    from rlpulse.collector.runs.run import Run


class Root(Protocol):
    """What the root side of the delta uses of the aggregator that received it
    (``rlpulse.collector.runs.aggregator.Aggregator``): the membership, the counters, the
    clock bound and the runs, by name."""

    @property
    def membership(self) -> Membership: ...

    @property
    def health(self) -> Health: ...

    @property
    def clock(self) -> ClockBound | None: ...

    def run(self, name: str) -> Run: ...


def step_entries(
    run: RunView, state: StepState, table_number: Callable[[Table], int]
) -> tuple[list[tuple], list[tuple[int, int, bytes]], list[tuple[int, int, bytes]]]:
    """The relay's side: a finished step's delta entries (none when it touched no name), its
    distributions' sketches and its samples states; ``table_number`` numbers (and announces)
    a name table."""
    names = run.names
    touched = np.flatnonzero(state.touched[: len(names)])
    if not len(touched):
        return [], [], []
    rows = touched.tolist()
    table = Table.shared(
        tuple(names.names[j] for j in rows), bytes(int(names.resolved[j].reduction) for j in rows)
    )
    number = table_number(table)
    values = np.ascontiguousarray(state.rows[touched], dtype="<f8").tobytes()
    owners = [run.members.role_names(b) for b in state.roles[touched].tolist()]
    entry = (
        state.step,
        state.t_first,
        state.t_last,
        number,
        values,
        dict(state.nonfinite),
        sorted(state.contributors),
        owners,
    )
    sketches = [  # the merged quantile sketches of its distribution metrics
        (0, row, encode_sketch(state.sketches[j]))
        for row, j in enumerate(rows)
        if j in state.sketches
    ]
    samples = [  # the merged samples states, their random keys kept
        (0, row, encode_samples(state.samples[j]))
        for row, j in enumerate(rows)
        if j in state.samples
    ]
    return [entry], sketches, samples


def apply_delta(
    agg: Root,
    relay: ProducerInfo,
    msg: protocol.Delta,
    now: float,
    position: object,
    replay: bool,
) -> None:
    """The root's side: a relay's merged entries for one run, then how far its members have
    finished."""
    membership, health = agg.membership, agg.health
    name = relay.aliases.get(msg.run, msg.run)  # the attempt its members joined here
    if name not in membership.runs:
        health.reject("bad_field")
        return
    run = agg.run(name)
    members = run.members
    sketches = by_table_row(msg.sketches, len(msg.entries))
    samples = by_table_row(msg.samples, len(msg.entries))
    resuming = membership.resuming
    clock = agg.clock
    bound = clock.now() if clock is not None else None
    offset = clock.offsets.get(relay.pid, 0.0) if clock is not None else 0.0
    for i, entry in enumerate(msg.entries):
        step, t_first, t_last, table_id, values, nonfinite, pids, owners = entry
        t_first, t_last = t_first + offset, t_last + offset  # the relay's clock to ours
        if clock is not None and bound is not None and t_last > bound:  # relay's or ranks'
            if t_last - bound > CLOCK_SKEW_S and not replay:
                health.clock_skew += 1
                clock.warn(relay.pid, f"relay {relay.pid:x} (host {relay.host})", t_last - bound)
            t_first, t_last = min(t_first, bound), bound
        if not replay:
            health.events_received += 1
        table = relay.tables.get(table_id)
        if table is None or len(owners) != table.size:
            health.reject("bad_table")
            continue
        if replay and step <= run.last_emitted:
            continue
        if resuming and not resuming.isdisjoint(pids):
            for pid in pids:  # members that took their slot over and ran no step yet
                member = membership.producers.get(pid)
                if member is not None and member.resumes_after is not None:
                    agg.run(member.run).resume(member, step)
        state = run.open_or_late(step, now, position, f"relay {relay.pid:x}")
        if state is None:
            _late_members(agg, relay, pids)
            continue
        row_roles = np.array([members.bits_of(o) for o in owners], dtype=np.int64)
        side = (nonfinite, sketches[i], samples[i])
        run.merger.add_merged(state, table, values, row_roles, pids, (t_first, t_last), *side)
    for step, span in msg.spans:
        state = run.steps.get(step)  # opened by the step's entries, unless they came late
        if state is not None:  # on the relay's timeline: moved onto ours
            state.spans.append(span.moved(offset) if offset else span)
    for pid, step in msg.incomplete:  # a member said it dropped values of the step
        member = membership.producers.get(pid)
        if member is not None and member.via == relay.pid:
            agg.run(member.run).incomplete(member, (step,), now, position, replay)
    for pid, watermark in msg.watermarks:
        member = membership.producers.get(pid)
        if member is not None and member.via == relay.pid:
            member_run = agg.run(member.run)
            if member.resumes_after is not None:
                # A relay's watermark is no proof that the member ran those steps (it is
                # implied by data for a later step, and the relay reports it only as far as
                # the step it forwards): only its data is (above). Taken as not run, a step it
                # ran without data goes out partial, which is safe; the other way, one it
                # never ran would go out complete without its data.
                member_run.resume(member, watermark + 1, ran=False)
            member_run.advance(member, watermark, now)


def _late_members(agg: Root, relay: ProducerInfo, pids: list[int]) -> None:
    """A relay's entry came late: each member merged in it lost an entry, told back to the
    relay (``Membership.relay_late``) so it tells the producer."""
    membership = agg.membership
    told = membership.relay_late.setdefault(relay.pid, {})
    for pid in pids:
        member = membership.producers.get(pid)
        if member is not None and member.via == relay.pid:
            member.late += 1
            told[pid] = member.late
