"""A run's open steps and their merging: entries in, merged mergeable states out.

Each open step is a :class:`StepState`: an array of mergeable states
(``rlpulse.schemas.values``) with a row per name of the run's name table
(``rlpulse.collector.runs.names``), which rows were touched and by which roles, and which
(role, rank) slots have finished the step. A rank finishes step ``s`` by logging a later
step, by saying so (``done``), or by closing. Entries wait, grouped by step and name table,
and are merged in one pass of array operations when the step is next looked at.

Every entry merged into a step is kept (:class:`StepInput`) until the step is emitted, so
the data of a process replaced since can be taken out exactly (``Run.withdraw``). When a
step is due is decided in ``rlpulse.collector.runs.completion``; who takes a slot over, in
``rlpulse.collector.runs.run``.

>>> from rlpulse.schemas.metrics import CATALOG
>>> steps = OpenSteps(NameTable("r", catalog=CATALOG, health=Health(), max_names=8), Health())
>>> steps.open(3, now=0.0, finished=set(), position=None).step
3
"""

from __future__ import annotations

import logging
import math
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from rlpulse.collector.health import Health
from rlpulse.collector.ratelog import RateLimitedLog
from rlpulse.collector.runs.members import Members, Slot
from rlpulse.collector.runs.names import Layout, NameTable
from rlpulse.collector.runs.samples import merge_into as merge_samples
from rlpulse.collector.runs.sketches import merge_into, read as read_quantile
from rlpulse.schemas.errors import SchemaError
from rlpulse.schemas.messages import Table
from rlpulse.schemas.samples import SampleState
from rlpulse.schemas.sketch import encode as encode_sketch
from rlpulse.schemas.spans import Span
from rlpulse.schemas.values import (
    WIDTH,
    empty_rows,
    invalid_rows,
    merge_rows,
    read_matrix,
    reduce_checked,
    reduce_rows,
)

log = logging.getLogger("rlpulse.collector")


class StepInput(NamedTuple):
    """One entry merged into a step, as :meth:`OpenSteps.add` (one producer's) or
    :meth:`OpenSteps.add_merged` (a relay's, several producers' already merged) took it."""

    table: Table
    values: bytes
    nonfinite: Mapping[str, int]
    sketches: Mapping[int, bytes] | None
    t_first: float
    t_last: float
    pid: int
    """The producer of the entry; -1 for a relay's (``pids``)."""
    role_bit: int
    """The producer's role (its bit); 0 for a relay's (``row_roles``)."""
    pids: tuple[int, ...] = ()
    """A relay's entry: every producer merged in it."""
    row_roles: np.ndarray | None = None
    """A relay's entry: per table row, the roles behind it (bits)."""
    samples: Mapping[int, bytes] | None = None
    """Samples states by table row (``collector.runs.samples``), as sketches."""


_new_input = tuple.__new__


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
    """Every rank's phases in the step (``rlpulse.collector.runs.spans``)."""
    inputs: list[StepInput] = field(default_factory=list)
    """Every entry merged into the step, kept until it is emitted so a replaced process's
    data can be withdrawn exactly (``Run.withdraw``)."""
    withdrawn: set[Slot] = field(default_factory=set)
    """Slots whose data was withdrawn (their process was replaced): such a slot counts only
    if its new holder gives the step data; finished without it, it is missing."""
    sealed: set[Slot] = field(default_factory=set)
    """Slots whose replaced process had finished the step: its data stays, and what the new
    process sends for the step is a repeat (late)."""
    tainted: set[Slot] = field(default_factory=set)
    """Slots with data of a replaced process that could not be withdrawn (merged by a relay
    with other ranks'): the step is emitted partial, naming them."""
    incomplete: set[Slot] = field(default_factory=set)
    """Slots whose producer said it sent the step without some of its values (dropped before
    it could reduce them: ``Metrics.incomplete``): once finished, the step is emitted
    partial, naming them."""
    sketches: dict[int, np.ndarray] = field(default_factory=dict)
    """Per row of a distribution metric, its merged quantile sketch (``collector.sketches``)."""
    samples: dict[int, SampleState] = field(default_factory=dict)
    """Per row of a name logged as ``Samples``, its merged state (``collector.runs.samples``)."""
    waiting_on: Slot | None = None
    """A slot the step was last found waiting for (``completion.due`` asks it first)."""

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


class _Group:
    """Entries waiting to be merged into one step, all with the same layout: merged together,
    in one pass of array operations, when the step is next looked at."""

    __slots__ = ("blobs", "layout", "roles", "row_roles", "state")

    def __init__(self, state: StepState, layout: Layout) -> None:
        self.state = state
        self.layout = layout
        self.blobs: list[bytes] = []
        self.roles = 0
        self.row_roles: np.ndarray | None = None
        """Per table row, for entries a relay merged from several roles."""


class OpenSteps:
    """One run's open steps: opened, merged into, read and removed."""

    def __init__(self, names: NameTable, health: Health) -> None:
        self.names = names
        self.health = health
        self.by_step: dict[int, StepState] = {}
        self._pending: dict[int, dict[int, _Group]] = {}
        """Entries waiting to be merged: by step, then by layout (``id``)."""
        self._ratelog = RateLimitedLog(log)

    def open(self, step: int, now: float, finished: set[Slot], position: object) -> StepState:
        """A new open step; ``finished`` are the slots that already finished it."""
        n = max(len(self.names), 8)
        state = StepState(step, empty_rows(n), np.zeros(n, dtype=bool), np.zeros(n, dtype=np.int64))
        state.done |= finished
        if state.done:
            state.first_done_at = now
        state.position = position
        self.by_step[step] = state
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
        samples: Mapping[int, bytes] | None = None,
    ) -> None:
        """One entry for ``state``: its values wait to be merged with the others of the same
        step and table (:meth:`merge_pending`); the rest is noted now. ``sketches`` are the
        quantile sketches of its distribution metrics, ``samples`` the states of its samples
        names, by table row."""
        group = self._group(state, table, values)
        if group is None:
            return
        if sketches:
            self._sketch(state, table, sketches)
        if samples:
            self._samples(state, table, samples)
        # StepInput(...) without its Python-level __new__: this runs for every entry
        record = (table, values, nonfinite, sketches, t, t, pid, role_bit, (), None, samples)
        state.inputs.append(_new_input(StepInput, record))
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
        samples: Mapping[int, bytes] | None = None,
    ) -> None:
        """A relay's entry: several producers' data already merged, with the roles behind each
        row and the first and last ``log()`` times."""
        group = self._group(state, table, values)
        if group is None:
            return
        if sketches:
            self._sketch(state, table, sketches)
        if samples:
            self._samples(state, table, samples)
        pids = tuple(pids)
        state.inputs.append(
            StepInput(table, values, nonfinite, sketches, *times, -1, 0, pids, row_roles, samples)
        )
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
            j = self.names.dist_row(table.names[r]) if r < table.size else None
            if j is not None:
                by_row[j] = buf
        try:
            merge_into(state.sketches, by_row)
        except SchemaError as exc:
            self.health.reject(exc.reason)
            self._ratelog.warn("bad-sketch", f"rejected an entry's sketches: {exc}")

    def _samples(self, state: StepState, table: Table, samples: Mapping[int, bytes]) -> None:
        """Merge an entry's samples states (table row -> bytes) into the step's, for the rows
        this run keeps; a malformed one (or one ranked by another key) is counted."""
        index = self.names.index
        by_row = {index.get(table.names[r]): b for r, b in samples.items() if r < table.size}
        try:
            merge_samples(state.samples, {j: b for j, b in by_row.items() if j is not None})
        except SchemaError as exc:
            self.health.reject(exc.reason)
            self._ratelog.warn("bad-samples", f"rejected an entry's samples: {exc}")

    def _group(self, state: StepState, table: Table, values: bytes) -> _Group | None:
        if len(values) != table.nbytes:
            self.health.reject("bad_values")
            self._ratelog.warn(
                "values-size",
                f"rejected an entry of {len(values)} bytes of values for {table.size} names",
            )
            return None
        layout = self.names.layout(table)
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

    def rebuild(self, state: StepState, inputs: list[StepInput]) -> None:
        """Merge ``inputs`` into ``state`` afresh (its rows, roles, times and contributors)."""
        n = state.rows.shape[0]
        state.rows, state.touched = empty_rows(n), np.zeros(n, dtype=bool)
        state.roles = np.zeros(n, dtype=np.int64)
        state.contributors, state.nonfinite = set(), Counter()
        state.t_first, state.t_last, state.inputs = math.inf, -math.inf, []
        state.sketches, state.samples = {}, {}
        for i in inputs:
            if i.row_roles is not None:
                times = (i.t_first, i.t_last)
                rest = (i.nonfinite, i.sketches, i.samples)
                self.add_merged(state, i.table, i.values, i.row_roles, i.pids, times, *rest)
            else:
                rest = (i.nonfinite, i.sketches, i.samples)
                self.add(state, i.table, i.values, i.role_bit, i.pid, i.t_first, *rest)

    def finish_through(self, slot: Slot, old: int, watermark: int, now: float) -> None:
        """``slot`` has finished every step in ``(old, watermark]``."""
        steps = self.by_step
        if watermark - old <= len(steps):
            for step in range(old + 1, watermark + 1):
                state = steps.get(step)
                if state is not None:
                    state.finish(slot, now)
        else:
            for step, state in steps.items():
                if old < step <= watermark:
                    state.finish(slot, now)

    def distributions(self, state: StepState) -> dict[str, bytes]:
        """The step's merged sketches by distribution name, in wire form (for the sinks)."""
        names = self.names.names
        return {names[j]: encode_sketch(c) for j, c in state.sketches.items()}

    def read(self, state: StepState, members: Members) -> tuple[dict[str, float], dict[str, str]]:
        """A merged step's metrics and the role(s) behind each."""
        touched = np.flatnonzero(state.touched[: len(self.names)])
        plan = self.names.read_plan(touched)
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
