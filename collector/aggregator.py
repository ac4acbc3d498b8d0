"""Per-(run, step) merging across every rank of every role, and deciding when a step is done.

Each producer registers with its run, role, rank and world size. The first registration of a
(run, role) fixes how many ranks that role has; a step of a run is *complete* when every rank of
every registered role has finished it. A rank finishes step ``s`` by logging a later step,
by saying so (``done``), or by closing. Then the step is emitted once, with every metric pooled
exactly (``schemas.values``).

Roles registering late would miss a new run's first steps, so a run's steps are held for
``settle_s`` after its first registration, unless a producer declared the run's whole topology
(``Producer(expected_roles=...)``): then the missing roles are waited for by name.

A step is emitted *partial*, naming the missing ranks, when:

* ``grace_s`` has passed since the first rank finished it and some rank still has not;
* every rank still missing is gone: its producer fell silent for ``liveness_s``, or it never
  registered within ``liveness_s`` of the run's first registration;
* more than ``max_open_steps`` steps of the run are open (the oldest goes).

Data for a step that was already emitted is *late*: counted and logged, never merged.
"""

from __future__ import annotations

import logging
import math
from collections import Counter, deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np

from collector.health import Health
from collector.ratelog import RateLimitedLog
from schemas import metrics as M
from schemas import protocol
from schemas.catalog import Catalog, Resolved
from schemas.metrics import CATALOG
from schemas.record import StepRecord
from schemas.reductions import Reduction
from schemas.values import empty_rows, merge_rows, read_row

log = logging.getLogger("rlpulse.collector")
FINISHED = 1 << 62
"""Watermark of a producer that said goodbye: it has finished every step."""

Slot = tuple[str, int]


@dataclass
class ProducerInfo:
    """A registered producer (one worker process of one role)."""

    pid: int
    run: str
    role: str
    rank: int
    world_size: int
    host: str
    last_seen: float
    watermark: int = -1
    """Highest step this producer has finished."""
    stats: Mapping[str, int] = field(default_factory=dict)

    @property
    def slot(self) -> Slot:
        return (self.role, self.rank)

    @property
    def finished(self) -> bool:
        return self.watermark >= FINISHED


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

    def grow(self, n: int) -> None:
        """Make room for ``n`` names (doubling, so a growing name table costs O(1) amortised)."""
        size = self.rows.shape[0]
        if n > size:
            extra = max(n, 2 * size) - size
            self.rows = np.concatenate([self.rows, empty_rows(extra)])
            self.touched = np.concatenate([self.touched, np.zeros(extra, dtype=bool)])
            self.roles = np.concatenate([self.roles, np.zeros(extra, dtype=np.int64)])


@dataclass
class _Layout:
    """Cached translation of one entry shape (names + kinds) to row indices of a run."""

    idx: np.ndarray | slice
    """Row indices; a slice when they are consecutive (the usual case: a producer's names
    enter the table together), so merging works on views instead of fancy-index copies."""
    keep: np.ndarray | None
    last: np.ndarray
    touches_last: bool


class RunState:
    """Everything the collector tracks for one run."""

    def __init__(self, name: str, now: float) -> None:
        self.name = name
        self.first_seen = now
        self.roles: dict[str, int] = {}
        self.role_bits: dict[str, int] = {}
        self.slots: dict[Slot, int] = {}
        self.names: list[str] = []
        self.index: dict[str, int] = {}
        self.resolved: list[Resolved] = []
        self.steps: dict[int, StepState] = {}
        self.last_emitted = -1
        self.layouts: dict[tuple[tuple[str, ...], bytes], _Layout] = {}
        self.ends: deque[tuple[float, float | None]] = deque()
        self.declared = False
        """A producer sent the whole topology: no need to wait for late registrations."""
        self._expected: set[Slot] | None = None
        self.cumulative: dict[str, float] = {}

    def expected(self) -> set[Slot]:
        """Every (role, rank) the run waits for; cached until a registration changes roles."""
        if self._expected is None:
            self._expected = {(role, rank) for role, ws in self.roles.items() for rank in range(ws)}
        return self._expected

    def roles_changed(self) -> None:
        self._expected = None


class Aggregator:
    """Merges decoded messages and emits finished steps through ``emit``.

    Time is passed in (``now``, monotonic seconds) so tests drive it without sleeping.
    """

    def __init__(
        self,
        emit: Callable[[StepRecord], None],
        *,
        health: Health | None = None,
        catalog: Catalog = CATALOG,
        grace_s: float = 60.0,
        liveness_s: float = 10.0,
        max_open_steps: int = 64,
        tps_window: int = 1,
        max_names_per_run: int = 10_000,
        settle_s: float = 0.0,
    ) -> None:
        self.emit = emit
        self.health = health or Health()
        self.catalog = catalog
        self.grace_s = grace_s
        self.liveness_s = liveness_s
        self.max_open_steps = max_open_steps
        self.tps_window = tps_window
        self.max_names_per_run = max_names_per_run
        self.settle_s = settle_s
        self.producers: dict[int, ProducerInfo] = {}
        self.runs: dict[str, RunState] = {}
        self._ratelog = RateLimitedLog(log)

    # ------------------------------------------------------------------ messages

    def handle(
        self, msg: protocol.Message, now: float, position: object = None, replay: bool = False
    ) -> None:
        """Apply one decoded message. ``position`` is where it starts in the write-ahead log;
        with ``replay`` (recovery), data for steps already emitted is skipped silently."""
        if isinstance(msg, protocol.Hello):
            self._hello(msg, now)
            return
        prod = self.producers.get(msg.producer)
        if prod is None:
            self.health.unknown_producer += 1
            return
        prod.last_seen = now
        if isinstance(msg, protocol.Metrics):
            run = self.runs[prod.run]
            for entry in msg.entries:
                self._entry(run, prod, entry, now, position, replay)
        elif isinstance(msg, protocol.Done):
            self._advance(prod, msg.step, now)
        elif isinstance(msg, protocol.Heartbeat):
            self._stats(prod, msg.stats)
        elif isinstance(msg, protocol.Bye):
            self._stats(prod, msg.stats)
            self._advance(prod, FINISHED, now)

    def _stats(self, prod: ProducerInfo, stats: Mapping[str, int]) -> None:
        prod.stats = stats
        self.health.producer_stats[prod.pid] = stats

    def _hello(self, msg: protocol.Hello, now: float) -> None:
        prod = self.producers.get(msg.producer)
        if prod is not None:
            prod.last_seen = now
            return
        run = self.runs.get(msg.run)
        if run is None:
            run = self.runs[msg.run] = RunState(msg.run, now)
        for role, size in msg.expected.items():
            run.declared = True
            run.roles.setdefault(role, size)
            run.role_bits.setdefault(role, len(run.role_bits))
        ws = run.roles.setdefault(msg.role, msg.world_size)
        run.roles_changed()
        if msg.world_size != ws:
            self.health.world_size_conflict += 1
            self._ratelog.warn(
                f"ws:{msg.run}:{msg.role}",
                f"run {msg.run!r} role {msg.role!r}: rank {msg.rank} says world size {msg.world_size}, "
                f"the first registration said {ws}; keeping {ws}",
            )
        run.role_bits.setdefault(msg.role, len(run.role_bits))
        prod = ProducerInfo(
            msg.producer, msg.run, msg.role, msg.rank, msg.world_size, msg.host, now
        )
        self.producers[msg.producer] = prod
        previous = run.slots.get(prod.slot)
        run.slots[prod.slot] = prod.pid
        if previous is not None:
            log.info(
                "run %r: %s/%d re-registered from a new process (host %s)",
                msg.run,
                msg.role,
                msg.rank,
                msg.host,
            )
        else:
            log.info(
                "run %r: %s/%d of %d registered (host %s)",
                msg.run,
                msg.role,
                msg.rank,
                ws,
                msg.host,
            )
        self.health.producers = len(self.producers)

    # ------------------------------------------------------------------ merging

    def _layout(self, run: RunState, entry: protocol.Entry) -> _Layout:
        key = (entry.names, entry.kinds)
        layout = run.layouts.get(key)
        if layout is not None:
            return layout
        idx = np.empty(len(entry.names), dtype=np.int64)
        keep = np.ones(len(entry.names), dtype=bool)
        for i, (name, kind) in enumerate(zip(entry.names, entry.kinds, strict=True)):
            j = run.index.get(name)
            if j is None:
                resolved = self.catalog.resolve(name, Reduction(kind))
                if resolved.derived:
                    self.health.derived_logged += 1
                    self._ratelog.warn(
                        f"derived:{name}",
                        f"{name} is computed by the collector; producers must not log it (dropped)",
                    )
                    keep[i] = False
                    continue
                if len(run.names) >= self.max_names_per_run:
                    self.health.names_overflow += 1
                    self._ratelog.warn(
                        f"names:{run.name}",
                        f"run {run.name!r} has {self.max_names_per_run} distinct names; dropping new name {name!r}",
                    )
                    keep[i] = False
                    continue
                j = len(run.names)
                run.index[name] = j
                run.names.append(name)
                run.resolved.append(resolved)
            if int(run.resolved[j].reduction) != kind:
                self.health.kind_mismatch += 1
                self._ratelog.warn(
                    f"kind:{name}",
                    f"{name}: producer sent reduction {Reduction(kind).name}, the catalog says {run.resolved[j].reduction.name}; using the catalog",
                )
            idx[i] = j
        idx = idx[keep]
        last = np.array([run.resolved[j].reduction is Reduction.LAST for j in idx], dtype=bool)
        consecutive = len(idx) > 0 and bool((np.diff(idx) == 1).all())
        where: np.ndarray | slice = slice(int(idx[0]), int(idx[-1]) + 1) if consecutive else idx
        layout = _Layout(where, None if keep.all() else keep, last, bool(last.any()))
        if len(run.layouts) < 4096:
            run.layouts[key] = layout
        return layout

    def _open(self, run: RunState, step: int, now: float) -> StepState:
        n = max(len(run.names), 8)
        state = StepState(step, empty_rows(n), np.zeros(n, dtype=bool), np.zeros(n, dtype=np.int64))
        for slot, pid in run.slots.items():
            if self.producers[pid].watermark >= step and slot[1] < run.roles[slot[0]]:
                state.done.add(slot)
        if state.done:
            state.first_done_at = now
        run.steps[step] = state
        return state

    def _entry(
        self,
        run: RunState,
        prod: ProducerInfo,
        entry: protocol.Entry,
        now: float,
        position: object,
        replay: bool,
    ) -> None:
        if not replay:
            self.health.events_received += 1
        step = entry.step
        state = run.steps.get(step)
        if state is None:
            if step <= run.last_emitted:
                if replay:
                    self._advance(prod, step - 1, now)
                    return
                self.health.late += 1
                self._ratelog.warn(
                    f"late:{run.name}",
                    f"run {run.name!r}: {prod.role}/{prod.rank} logged step {step} after it was emitted "
                    f"(latest emitted {run.last_emitted}); not merged",
                )
                return
            state = self._open(run, step, now)
            state.position = position
        layout = self._layout(run, entry)
        rows = entry.values if layout.keep is None else entry.values[layout.keep]
        if len(rows):
            state.grow(len(run.names))
            merge_rows(state.rows, layout.idx, rows, layout.last if layout.touches_last else None)
            state.touched[layout.idx] = True
            state.roles[layout.idx] |= 1 << run.role_bits[prod.role]
        for name, count in entry.nonfinite.items():
            state.nonfinite[name] += count
        state.contributors.add(prod.pid)
        state.t_first = min(state.t_first, entry.time)
        state.t_last = max(state.t_last, entry.time)
        self._advance(prod, step - 1, now)

    def _advance(self, prod: ProducerInfo, watermark: int, now: float) -> None:
        """Record that ``prod`` has finished every step up to ``watermark``."""
        if watermark <= prod.watermark:
            return
        old, prod.watermark = prod.watermark, watermark
        run = self.runs[prod.run]
        if run.slots.get(prod.slot) != prod.pid or prod.rank >= run.roles[prod.role]:
            return
        for step, state in run.steps.items():
            if old < step <= watermark:
                state.done.add(prod.slot)
                if state.first_done_at is None:
                    state.first_done_at = now

    # ------------------------------------------------------------------ durable state

    def oldest_position(self) -> object:
        """The earliest write-ahead-log position an open step still needs, or None."""
        positions = [
            st.position
            for run in self.runs.values()
            for st in run.steps.values()
            if st.position is not None
        ]
        return min(positions) if positions else None  # type: ignore[type-var]

    def note_emitted(self, record: StepRecord) -> None:
        """Recovery: ``record`` is in the outbox already; never emit that step again, and
        continue its run's throughput window and cumulative totals from it."""
        run = self.runs.get(record.run)
        if run is None:
            run = self.runs[record.run] = RunState(record.run, 0.0)
        run.last_emitted = max(run.last_emitted, record.step)
        run.ends.append((record.time, record.metrics.get(M.SYSTEM_STEP_TOKENS.name)))
        while len(run.ends) > self.tps_window + 1:
            run.ends.popleft()
        for total in (M.SYSTEM_SAMPLES.name, M.SYSTEM_TOKENS.name):
            if total in record.metrics:
                run.cumulative[total] = record.metrics[total]

    def snapshot(self) -> dict:
        """Producers and per-run progress (open steps excluded: they are rebuilt from the log)."""
        return {
            "producers": {
                str(p.pid): [p.run, p.role, p.rank, p.world_size, p.host, p.watermark]
                for p in self.producers.values()
            },
            "runs": {
                run.name: {
                    "roles": run.roles,
                    "role_bits": run.role_bits,
                    "slots": [[role, rank, pid] for (role, rank), pid in run.slots.items()],
                    "last_emitted": run.last_emitted,
                    "ends": list(run.ends),
                    "cumulative": run.cumulative,
                    "declared": run.declared,
                }
                for run in self.runs.values()
            },
        }

    def restore(self, snapshot: Mapping, now: float) -> None:
        for pid, (run, role, rank, ws, host, watermark) in snapshot.get("producers", {}).items():
            self.producers[int(pid)] = ProducerInfo(
                int(pid), run, role, rank, ws, host, now, watermark
            )
        for name, data in snapshot.get("runs", {}).items():
            run = self.runs[name] = RunState(name, now)
            run.roles = dict(data["roles"])
            run.role_bits = dict(data["role_bits"])
            run.slots = {(role, rank): int(pid) for role, rank, pid in data["slots"]}
            run.last_emitted = int(data["last_emitted"])
            run.ends = deque(tuple(e) for e in data["ends"])  # type: ignore[misc]
            run.cumulative = dict(data["cumulative"])
            run.declared = bool(data.get("declared", False))
        self.health.producers = len(self.producers)

    # ------------------------------------------------------------------ emitting

    def _gone(self, run: RunState, slot: Slot, now: float) -> bool:
        pid = run.slots.get(slot)
        if pid is None:
            return now - run.first_seen >= self.liveness_s
        prod = self.producers[pid]
        return not prod.finished and now - prod.last_seen >= self.liveness_s

    def poll(self, now: float) -> None:
        """Emit every step that is complete, or due to be emitted partial."""
        for run in list(self.runs.values()):
            if not run.steps:
                continue
            expected = run.expected()
            for step in sorted(run.steps):
                state = run.steps[step]
                # done only ever holds expected slots, so counting them says "complete"
                missing = expected - state.done if len(state.done) < len(expected) else set()
                if not missing and not run.declared and now - run.first_seen < self.settle_s:
                    break  # other roles of a new run may still be starting up
                if missing:
                    overflow = len(run.steps) > self.max_open_steps
                    graced = (
                        state.first_done_at is not None
                        and now - state.first_done_at >= self.grace_s
                    )
                    if not (overflow or graced or all(self._gone(run, s, now) for s in missing)):
                        break
                self._emit(run, state, missing)

    def flush(self) -> None:
        """Emit every open step now (shutdown): complete ones as usual, the rest partial."""
        for run in list(self.runs.values()):
            expected = run.expected()
            for step in sorted(run.steps):
                state = run.steps[step]
                self._emit(run, state, expected - state.done)

    def _emit(self, run: RunState, state: StepState, missing: set[Slot]) -> None:
        del run.steps[state.step]
        run.last_emitted = max(run.last_emitted, state.step)
        metrics: dict[str, float] = {}
        roles: dict[str, str] = {}
        role_names = {bit: role for role, bit in run.role_bits.items()}
        n = len(run.names)
        for j in np.flatnonzero(state.touched[:n]):
            row = state.rows[j]
            resolved = run.resolved[j]
            owner = "+".join(role_names[b] for b in sorted(role_names) if state.roles[j] >> b & 1)
            for stat, out in resolved.outputs.items():
                value = read_row(row, stat)
                if value is not None:
                    metrics[out] = value
                    roles[out] = owner
        self._derive(run, state, metrics)
        partial = bool(missing)
        record = StepRecord(
            run=run.name,
            step=state.step,
            metrics=metrics,
            partial=partial,
            missing=tuple(f"{role}/{rank}" for role, rank in sorted(missing)),
            ranks=len(state.contributors),
            nonfinite=dict(state.nonfinite),
            time=state.t_last,
            roles=roles,
        )
        self.health.steps_emitted += 1
        if partial:
            self.health.partial_steps += 1
            self._ratelog.warn(
                f"partial:{run.name}",
                f"run {run.name!r} step {state.step} emitted partial; missing {', '.join(record.missing)}",
            )
        self.emit(record)

    def _derive(self, run: RunState, state: StepState, metrics: dict[str, float]) -> None:
        """system/tps, system/samples and system/tokens (see their catalog help)."""
        tokens = metrics.get(M.SYSTEM_STEP_TOKENS.name)
        samples = metrics.get(M.SYSTEM_STEP_SAMPLES.name)
        run.ends.append((state.t_last, tokens))
        while len(run.ends) > self.tps_window + 1:
            run.ends.popleft()
        window = list(run.ends)[1:]
        if len(run.ends) >= 2 and all(tok is not None for _, tok in window):
            elapsed = run.ends[-1][0] - run.ends[0][0]
            if elapsed > 0:
                metrics[M.SYSTEM_TPS.name] = (
                    sum(tok for _, tok in window if tok is not None) / elapsed
                )
        for source, total in ((samples, M.SYSTEM_SAMPLES.name), (tokens, M.SYSTEM_TOKENS.name)):
            if source is not None:
                run.cumulative[total] = run.cumulative.get(total, 0.0) + source
            if total in run.cumulative:
                metrics[total] = run.cumulative[total]
