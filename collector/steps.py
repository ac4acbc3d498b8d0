"""Open steps of a run: merging entries into them, and deciding when each is done.

Each run keeps a table of the names it has seen (a row index and the catalog's resolution per
name) and one :class:`StepState` per open step: an array of mergeable states
(``rlpulse.schemas.values``), which rows were touched and by which roles, and which (role, rank)
slots have finished the step. A rank finishes step ``s`` by logging a later step, by saying so
(``done``), or by closing.

A step is *complete* when every expected slot has finished it; it is emitted *partial*,
naming the missing slots, when ``grace_s`` has passed since the first slot finished it, when
every missing slot is gone (``Membership.gone``), or, as a last resort, when more than
``HARD_OPEN_FACTOR`` times ``max_open_steps`` steps of the run are open (the oldest goes).
Below that, ``max_open_steps`` is kept by holding back producers that run ahead
(``Aggregator.admits``), not by emitting steps early. A new run's steps wait ``settle_s`` for roles still
registering, unless a producer declared the topology.
"""

from __future__ import annotations

import logging
import math
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from rlpulse.collector.health import Health
from rlpulse.collector.membership import Members, Slot
from rlpulse.collector.ratelog import RateLimitedLog
from rlpulse.collector.sketches import merge_into, read as read_quantile
from rlpulse.schemas.catalog import Catalog, Resolved
from rlpulse.schemas.errors import SchemaError
from rlpulse.schemas.messages import Table
from rlpulse.schemas.reductions import QUANTILE_STATS, Reduction, Stat
from rlpulse.schemas.sketch import encode as encode_sketch
from rlpulse.schemas.spans import Span
from rlpulse.schemas.values import (
    READ,
    WIDTH,
    empty_rows,
    invalid_rows,
    merge_rows,
    read_matrix,
    reduce_checked,
    reduce_rows,
)

log = logging.getLogger("rlpulse.collector")
HARD_OPEN_FACTOR = 8
"""Open steps beyond ``max_open_steps`` times this are emitted partial, oldest first: the
bound that holds even when producers' batches overshoot the window."""
MAX_LAYOUTS = 4096
"""Name tables whose row mapping is cached per run."""


@dataclass
class StepState:
    """Partial aggregate of one step."""

    step: int
    rows: np.ndarray
    touched: np.ndarray
    roles: np.ndarray
    done: set[Slot] = field(default_factory=set)
    contributors: set[int] = field(default_factory=set)
    t_first: float = math.inf
    t_last: float = -math.inf
    nonfinite: Counter[str] = field(default_factory=Counter)
    first_done_at: float | None = None
    position: object = None
    """Write-ahead-log position of the step's first data: the log is needed from here on."""
    spans: list[Span] = field(default_factory=list)
    """Every rank's phases in the step (``rlpulse.collector.spans``)."""
    inputs: list[tuple] = field(default_factory=list)
    """Every entry merged into the step, as given to :meth:`RunSteps.add` (``(pid, ...)``)
    or :meth:`RunSteps.add_merged` (``(pids, ...)``), kept until it is emitted so a replaced
    process's data can be withdrawn exactly (:meth:`RunSteps.withdraw`)."""
    withdrawn: set[Slot] = field(default_factory=set)
    """Slots whose data was withdrawn (their process was replaced): such a slot counts only
    if its new holder gives the step data; finished without it, it is missing."""
    sealed: set[Slot] = field(default_factory=set)
    """Slots whose replaced process had finished the step: its data stays, and what the new
    process sends for the step is a repeat (late)."""
    tainted: set[Slot] = field(default_factory=set)
    """Slots with data of a replaced process that could not be withdrawn (merged by a relay
    with other ranks'): the step is emitted partial, naming them."""
    sketches: dict[int, np.ndarray] = field(default_factory=dict)
    """Per row of a distribution metric, its merged quantile sketch (``collector.sketches``)."""
    waiting_on: Slot | None = None
    """A slot the step was last found waiting for (``RunSteps.due`` asks it first)."""

    def grow(self, n: int) -> None:
        """Make room for ``n`` names (doubling, so a growing name table costs O(1) amortised)."""
        size = self.rows.shape[0]
        if n > size:
            extra = max(n, 2 * size) - size
            self.rows = np.concatenate([self.rows, empty_rows(extra)])
            self.touched = np.concatenate([self.touched, np.zeros(extra, dtype=bool)])
            self.roles = np.concatenate([self.roles, np.zeros(extra, dtype=np.int64)])

    def finish(self, slot: Slot, now: float) -> None:
        self.done.add(slot)
        if self.first_done_at is None:
            self.first_done_at = now


@dataclass
class _Layout:
    """Cached translation of one name table to row indices of a run."""

    idx: np.ndarray | slice
    """Row indices; a slice when they are consecutive (the usual case: a producer's names
    enter the table together), so merging works on views instead of fancy-index copies."""
    keep: np.ndarray | None
    last: np.ndarray
    touches_last: bool
    size: int
    """Names in the table (rows in each entry's values)."""
    last_all: np.ndarray
    """``LAST`` metrics among all the table's rows (``last`` is over the kept ones)."""
    dropped: int = 0
    """Names of the table left out (beyond ``max_names_per_run``, or derived)."""


class _ReadPlan(NamedTuple):
    """How a step with a given set of touched rows reads: each output's name, row (among the
    touched ones) and statistic (a row of ``read_matrix``), and the distributions' quantiles
    (read off their sketches)."""

    names: tuple[str, ...]
    rows: np.ndarray
    stats: np.ndarray
    quantiles: tuple[tuple[str, int, Stat], ...]


class _Group:
    """Entries waiting to be merged into one step, all with the same layout: merged together,
    in one pass of array operations, when the step is next looked at."""

    __slots__ = ("blobs", "layout", "roles", "row_roles", "state")

    def __init__(self, state: StepState, layout: _Layout) -> None:
        self.state = state
        self.layout = layout
        self.blobs: list[bytes] = []
        self.roles = 0
        self.row_roles: np.ndarray | None = None
        """Per table row, for entries a relay merged from several roles."""


class RunSteps:
    """One run's name table and open steps."""

    def __init__(self, name: str, *, catalog: Catalog, health: Health, max_names: int) -> None:
        self.name = name
        self.catalog = catalog
        self.health = health
        self.max_names = max_names
        self.names: list[str] = []
        self.index: dict[str, int] = {}
        self.resolved: list[Resolved] = []
        self.layouts: dict[tuple[tuple[str, ...], bytes], _Layout] = {}
        self.steps: dict[int, StepState] = {}
        self.last_emitted = -1
        self.names_full = False
        """Some name table of this run had names left out (:attr:`_Layout.dropped`)."""
        self.skipped: dict[Slot, tuple[int, int]] = {}
        """Per slot, the steps strictly between two bounds that neither its replaced process
        nor its new one ran (:meth:`skip`): a step opened later among them (or rebuilt from
        the write-ahead log after a restart: this is in the checkpoint) is missing the
        slot's data unless the new process gives some."""
        self._pending: dict[int, dict[int, _Group]] = {}
        """Entries waiting to be merged: by step, then by layout (``id``)."""
        self._read_plans: dict[bytes, _ReadPlan] = {}
        """How :meth:`close` reads a step, by the rows it touched."""
        self._ratelog = RateLimitedLog(log)

    # ------------------------------------------------------------------ names

    def _row_of(self, name: str, kind: int) -> int | None:
        """The row of ``name``, added on first sight; None when it is dropped (counted)."""
        j = self.index.get(name)
        sent = Reduction(kind)
        if j is None:  # the collector's catalog decides ("Who decides": rlpulse.schemas.catalog)
            resolved = self.catalog.resolve(name, sent)
            if resolved.derived:
                self.health.derived_logged += 1
                self._ratelog.warn(
                    f"derived:{name}",
                    f"{name} is computed by the collector; producers must not log it (dropped)",
                )
                return None
            if len(self.names) >= self.max_names:
                self.health.names_overflow += 1
                self._ratelog.warn(
                    f"names:{self.name}",
                    f"run {self.name!r} has {self.max_names} distinct names; dropping new name "
                    f"{name!r}",
                )
                return None
            j = len(self.names)
            self.index[name] = j
            self.names.append(name)
            self.resolved.append(resolved)
        if not self.resolved[j].accepts(sent):
            self.health.kind_mismatch += 1
            self._ratelog.warn(
                f"kind:{name}",
                f"{name}: producer sent reduction {sent.name}, the catalog says "
                f"{self.resolved[j].reduction.name}; using the catalog",
            )
        return j

    def layout(self, table: Table) -> _Layout:
        layout = self.layouts.get(table)
        if layout is not None:
            return layout
        rows = [
            self._row_of(name, kind) for name, kind in zip(table.names, table.kinds, strict=True)
        ]
        keep = np.array([j is not None for j in rows], dtype=bool)
        idx = np.array([j for j in rows if j is not None], dtype=np.int64)
        last = np.array([self.resolved[j].reduction is Reduction.LAST for j in idx], dtype=bool)
        consecutive = len(idx) > 0 and bool((np.diff(idx) == 1).all())
        where: np.ndarray | slice = slice(int(idx[0]), int(idx[-1]) + 1) if consecutive else idx
        last_all = np.array(
            [j is not None and self.resolved[j].reduction is Reduction.LAST for j in rows],
            dtype=bool,
        )
        dropped = int(table.size - keep.sum())
        layout = _Layout(
            where,
            None if dropped == 0 else keep,
            last,
            bool(last.any()),
            table.size,
            last_all,
            dropped,
        )
        self.names_full |= dropped > 0
        if len(self.layouts) < MAX_LAYOUTS:
            self.layouts[table] = layout
        return layout

    # ------------------------------------------------------------------ steps

    def open(self, step: int, now: float, finished: set[Slot], position: object) -> StepState:
        """A new open step; ``finished`` are the slots that already finished it."""
        n = max(len(self.names), 8)
        state = StepState(step, empty_rows(n), np.zeros(n, dtype=bool), np.zeros(n, dtype=np.int64))
        state.done |= finished
        for slot, (after, first) in self.skipped.items():
            if after < step < first:
                state.withdrawn.add(slot)
        if state.done:
            state.first_done_at = now
        state.position = position
        self.steps[step] = state
        return state

    def add(
        self,
        state: StepState,
        table: Table,
        values: bytes,
        role_bit: int,
        pid: int,
        t: float,
        nonfinite: Mapping[str, int],
        sketches: Mapping[int, bytes] | None = None,
    ) -> None:
        """One entry for ``state``: its values wait to be merged with the others of the same
        step and table (:meth:`merge_pending`); the rest is noted now. ``sketches`` are the
        quantile sketches of its distribution metrics, by table row."""
        group = self._group(state, table, values)
        if group is None:
            return
        if sketches:
            self._sketch(state, table, sketches)
        state.inputs.append((pid, table, values, role_bit, t, nonfinite, sketches))
        group.roles |= 1 << role_bit
        if nonfinite:
            state.nonfinite.update(nonfinite)
        state.contributors.add(pid)
        if t < state.t_first:
            state.t_first = t
        if t > state.t_last:
            state.t_last = t

    def add_merged(
        self,
        state: StepState,
        table: Table,
        values: bytes,
        row_roles: np.ndarray,
        pids: Iterable[int],
        times: tuple[float, float],
        nonfinite: Mapping[str, int],
        sketches: Mapping[int, bytes] | None = None,
    ) -> None:
        """A relay's entry: several producers' data already merged, with the roles behind each
        row and the first and last ``log()`` times."""
        group = self._group(state, table, values)
        if group is None:
            return
        if sketches:
            self._sketch(state, table, sketches)
        pids = tuple(pids)
        state.inputs.append((pids, table, values, row_roles, times, nonfinite, sketches))
        group.row_roles = row_roles if group.row_roles is None else group.row_roles | row_roles
        if nonfinite:
            state.nonfinite.update(nonfinite)
        state.contributors.update(pids)
        state.t_first = min(state.t_first, times[0])
        state.t_last = max(state.t_last, times[1])

    def _sketch(self, state: StepState, table: Table, sketches: Mapping[int, bytes]) -> None:
        """Merge an entry's sketches (table row -> bytes) into the step's, for the rows that
        are distribution metrics here (others are ignored); a malformed one is counted."""
        by_row: dict[int, bytes] = {}
        for r, buf in sketches.items():
            j = self.index.get(table.names[r]) if r < table.size else None
            if j is not None and self.resolved[j].reduction is Reduction.DIST:
                by_row[j] = buf
        try:
            merge_into(state.sketches, by_row)
        except SchemaError as exc:
            self.health.reject(exc.reason)
            self._ratelog.warn("bad-sketch", f"rejected an entry's sketches: {exc}")

    def _group(self, state: StepState, table: Table, values: bytes) -> _Group | None:
        if len(values) != table.nbytes:
            self.health.reject("bad_values")
            self._ratelog.warn(
                "values-size",
                f"rejected an entry of {len(values)} bytes of values for {table.size} names",
            )
            return None
        layout = self.layout(table)
        groups = self._pending.get(state.step)
        if groups is None:
            groups = self._pending[state.step] = {}
        group = groups.get(id(layout))
        if group is None:
            group = groups[id(layout)] = _Group(state, layout)
        group.blobs.append(values)
        return group

    def merge_pending(self) -> None:
        """Merge every waiting entry into its step (:meth:`merge_step` for every step)."""
        for step in list(self._pending):
            self.merge_step(step)

    def merge_step(self, step: int) -> None:
        """Merge the entries waiting for ``step``: per table, the entries' rows are checked
        and reduced together (sum, weight, min, max over the entries; the last one for
        ``LAST`` metrics), then merged once. Entries wait until their step is emitted (or
        withdrawn from), so a step's entries are merged in one pass however they arrived:
        merging as they came cost a few numpy calls per message."""
        for group in self._pending.pop(step, {}).values():
            self._merge_group(group)

    def _merge_group(self, group: _Group) -> None:
        layout, state = group.layout, group.state
        k = len(group.blobs)
        blob = group.blobs[0] if k == 1 else b"".join(group.blobs)
        rows = np.frombuffer(blob, dtype="<f8").reshape(k, layout.size, WIDTH)
        # Entries in arrival order, so LAST metrics keep the latest entry's value.
        last = layout.last_all if layout.touches_last else None
        merged = reduce_checked(rows, last)
        if merged is None:  # some entry is invalid (or the sums overflowed): which?
            good = [i for i in range(k) if invalid_rows(rows[i]) is None]
            for _ in range(k - len(good)):
                self.health.reject("bad_values")
            if len(good) < k:
                self._ratelog.warn(
                    "bad-values", f"rejected {k - len(good)} entries with impossible values"
                )
            if not good:
                return
            merged = reduce_rows(rows[good], last)
        if layout.keep is not None:
            merged = merged[layout.keep]
        if not len(merged):
            return
        state.grow(len(self.names))
        merge_rows(state.rows, layout.idx, merged, layout.last if layout.touches_last else None)
        state.touched[layout.idx] = True
        state.roles[layout.idx] |= group.roles
        if group.row_roles is not None:
            rows_roles = group.row_roles if layout.keep is None else group.row_roles[layout.keep]
            state.roles[layout.idx] |= rows_roles

    def withdraw(self, pid: int, slot: Slot, finished: int) -> int:
        """Producer ``pid``'s slot was taken over by a new process. Its data for the open
        steps it had finished (up to ``finished``) is whole and stays (``sealed``: the new
        process's data for them is a repeat); its data for the steps it had not finished is
        taken out: each is rebuilt from the other entries, and the slot must finish it again,
        with data of the new holder. Data ``pid`` gave through a relay, merged with other
        ranks', cannot be taken out: those steps are marked to be emitted partial, naming the
        slot. Return how many steps lost data."""
        changed = 0
        self.merge_pending()
        for state in self.steps.values():
            if pid not in state.contributors:
                continue
            if state.step <= finished:
                state.sealed.add(slot)
                continue
            changed += 1
            state.done.discard(slot)
            state.withdrawn.add(slot)
            state.spans = [sp for sp in state.spans if (sp.role, sp.rank) != slot]
            if any(type(i[0]) is tuple and pid in i[0] for i in state.inputs):
                state.tainted.add(slot)
                continue
            self._rebuild(state, [i for i in state.inputs if i[0] != pid])
        self.merge_pending()
        return changed

    def skip(self, slot: Slot, after: int, first: int) -> None:
        """``slot``'s new process took it over when its replaced one had finished every step
        up to ``after``, and ran ``first`` as its first step: nobody ran the steps between
        them for the slot. Its new process's cumulative ``done`` (or data for a later step,
        which implies one) says they are finished; without data of its own in them they are
        missing the slot's data, so they go out partial naming the slot (as for data
        withdrawn), never complete."""
        if first - after <= 1:
            return
        for state in self.steps.values():
            if after < state.step < first:
                state.withdrawn.add(slot)
        if first - 1 > self.last_emitted:  # for steps opened later, or rebuilt after a restart
            self.skipped[slot] = (after, first)

    def _rebuild(self, state: StepState, inputs: list[tuple]) -> None:
        """Merge ``inputs`` into ``state`` afresh (its rows, roles, times and contributors)."""
        n = state.rows.shape[0]
        state.rows, state.touched = empty_rows(n), np.zeros(n, dtype=bool)
        state.roles = np.zeros(n, dtype=np.int64)
        state.contributors, state.nonfinite = set(), Counter()
        state.t_first, state.t_last, state.inputs = math.inf, -math.inf, []
        state.sketches = {}
        for item in inputs:
            if type(item[0]) is tuple:
                pids, table, values, row_roles, times, nonfinite, sketches = item
                self.add_merged(state, table, values, row_roles, pids, times, nonfinite, sketches)
            else:
                self.add(state, item[1], item[2], item[3], item[0], item[4], item[5], item[6])

    def finish_through(self, slot: Slot, old: int, watermark: int, now: float) -> None:
        """``slot`` has finished every step in ``(old, watermark]``."""
        steps = self.steps
        if watermark - old <= len(steps):
            for step in range(old + 1, watermark + 1):
                state = steps.get(step)
                if state is not None:
                    state.finish(slot, now)
        else:
            for step, state in steps.items():
                if old < step <= watermark:
                    state.finish(slot, now)

    def due(
        self,
        members: Members,
        now: float,
        *,
        grace_s: float,
        settle_s: float,
        max_open_steps: int,
        gone: Callable[[Slot], bool],
    ) -> Iterator[tuple[StepState, set[Slot]]]:
        """The open steps to emit now, oldest first, each with its missing slots. Stops at
        the first step that must still wait: steps are emitted in order."""
        expected = members.expected()
        for step in sorted(self.steps):
            state = self.steps[step]
            if (
                len(state.done) < len(expected)
                and not (state.withdrawn or state.tainted)
                and len(self.steps) <= max_open_steps
                and (state.first_done_at is None or now - state.first_done_at < grace_s)
                and self._waits_on(state, expected, gone)
            ):
                return  # the common case, decided without listing every missing slot
            # done only ever holds expected slots, so counting them says "complete"
            missing = expected - state.done if len(state.done) < len(expected) else set()
            lost = self._lost(state, members) if state.withdrawn else set()
            missing |= lost
            if not missing and members.settling(now, settle_s):
                return  # other roles of a new run may still be starting up
            if missing:
                overflow = len(self.steps) > max_open_steps
                graced = state.first_done_at is not None and now - state.first_done_at >= grace_s
                if not (overflow or graced or all(s in lost or gone(s) for s in missing)):
                    return
            yield state, missing

    @staticmethod
    def _waits_on(state: StepState, expected: set[Slot], gone: Callable[[Slot], bool]) -> bool:
        """Whether some expected slot has neither finished ``state`` nor gone: the step must
        wait. The slot found last time is asked first, so a poll costs O(1) while it still
        waits, not a pass over every rank (which was most of a poll at 1,024 ranks)."""
        slot = state.waiting_on
        if slot is not None and slot in expected and slot not in state.done and not gone(slot):
            return True
        done = state.done
        slot = next((s for s in expected if s not in done and not gone(s)), None)
        state.waiting_on = slot
        return slot is not None

    @staticmethod
    def _lost(state: StepState, members: Members) -> set[Slot]:
        """Slots that finished ``state`` without their data in it: withdrawn (a replaced
        process's) and not given again by the new holder, or given only through a relay
        together with the replaced process's."""
        return state.tainted | {
            slot
            for slot in state.withdrawn
            if slot in state.done and members.slots.get(slot) not in state.contributors
        }

    def distributions(self, state: StepState) -> dict[str, bytes]:
        """The step's merged sketches by distribution name, in wire form (for the sinks)."""
        return {self.names[j]: encode_sketch(c) for j, c in state.sketches.items()}

    def close(self, state: StepState, members: Members) -> tuple[dict[str, float], dict[str, str]]:
        """Remove an emitted step; return its metrics and the role(s) behind each."""
        del self.steps[state.step]
        self.last_emitted = max(self.last_emitted, state.step)
        if self.skipped:
            emitted = self.last_emitted
            self.skipped = {k: v for k, v in self.skipped.items() if v[1] - 1 > emitted}
        touched = np.flatnonzero(state.touched[: len(self.names)])
        plan = self._read_plan(touched)
        rows = state.rows[touched]
        # Every statistic of every touched row at once, then the outputs' cells in one gather.
        values = read_matrix(rows)[plan.stats, plan.rows].tolist()
        owners: dict[int, str] = {}
        row_owner = []
        for bits in state.roles[touched].tolist():
            owner = owners.get(bits)
            if owner is None:
                owner = owners[bits] = members.role_names(bits)
            row_owner.append(owner)
        metrics: dict[str, float] = {}
        roles: dict[str, str] = {}
        for out, row, value in zip(plan.names, plan.rows.tolist(), values, strict=True):
            if value == value:  # NaN: not defined by the samples
                metrics[out] = value
                roles[out] = row_owner[row]
        for out, row, stat in plan.quantiles:  # a distribution's, read off its sketch
            sketch = state.sketches.get(int(touched[row]))
            value = read_quantile(sketch, rows[row].tolist(), stat)
            if value is not None:
                metrics[out] = value
                roles[out] = row_owner[row]
        return metrics, roles

    def _read_plan(self, touched: np.ndarray) -> _ReadPlan:
        """How :meth:`close` reads a step whose touched rows are ``touched`` (cached: a run's
        steps mostly touch the same rows)."""
        key = touched.tobytes()
        plan = self._read_plans.get(key)
        if plan is not None:
            return plan
        names, rows, stats, quantiles = [], [], [], []
        for i, j in enumerate(touched.tolist()):
            resolved = self.resolved[j]
            dist = resolved.reduction is Reduction.DIST
            for stat, out in resolved.outputs.items():
                if dist and stat in QUANTILE_STATS:
                    quantiles.append((out, i, stat))
                else:
                    names.append(out)
                    rows.append(i)
                    # a quantile logged on its own merges by max and reads the max
                    stats.append(READ.index(stat) if stat in READ else READ.index(Stat.MAX))
        plan = _ReadPlan(
            tuple(names),
            np.array(rows, dtype=np.intp),
            np.array(stats, dtype=np.intp),
            tuple(quantiles),
        )
        if len(self._read_plans) >= MAX_LAYOUTS:
            self._read_plans.clear()
        self._read_plans[key] = plan
        return plan
