"""``trace``: every rank's phases as a Chrome/Perfetto trace-event file per run.

``{dir}/{run}.trace.json`` (the run name with characters other than letters, digits, ``.``,
``_`` and ``-`` replaced by ``_``) holds the JSON array form of the Trace Event Format, which
https://ui.perfetto.dev and chrome://tracing open: a process per role, a thread per rank
("rank 3 @ host"), a complete event (``"ph": "X"``) per span (``rlpulse.schemas.spans``) named after
the phase, with the step, the execute and GPU seconds in its ``args``, and on a first
"steps" row one event per step from its first phase's start to its last phase's end (its
``args`` with the step's ledger in one line, and the cause of a slow step). Under it, a
"critical path" row marks the step's critical path (``rlpulse.schemas.ledger``): one event per
stretch, named after the phase the step waited for (``args``: the rank, the bucket's seconds)
or ``gap``. Timestamps are on the collector's timeline (the ranks' wall clocks moved by their
measured offsets), in microseconds.

The file is appended to as steps are emitted and closed with ``]`` when the collector stops
or forgets the run (``run_retention_s`` after it ended), or when it was renamed (a log
rotation: on SIGHUP, or within a second without it; the next step begins a new file);
the format lets a viewer open it before that. A restarted collector reopens it (dropping the
``]``) and carries on after the last step it holds.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, ClassVar

import msgspec

from rlpulse.collector.sinks.base import (
    RenameCheck,
    Sink,
    SinkContext,
    reject_unknown,
    renamed,
    required_path,
)
from rlpulse.schemas.errors import ConfigError
from rlpulse.schemas.ledger import StepLedger
from rlpulse.schemas.ledger_view import line as ledger_line
from rlpulse.schemas.record import StepRecord
from rlpulse.schemas.spans import trace_path as trace_path

TAIL_BYTES = 4 * 1024 * 1024
STEPS_PID = 0
"""The process row of the step events; roles take 1, 2, ... in order of appearance."""
STEPS_TID, PATH_TID = 0, 1
"""Its threads: the steps, and the steps' critical paths."""
_STEP = re.compile(rb'"step":(\d+)')
_JSON = msgspec.json.Encoder()


@dataclass
class _Run:
    file: BinaryIO
    path: Path
    pids: dict[str, int] = field(default_factory=dict)
    threads: set[tuple[int, int]] = field(default_factory=set)
    check: RenameCheck = field(default_factory=RenameCheck)


class TraceSink(Sink):
    """Writes ``{dir}/{run}.trace.json`` per run (see the module docstring)."""

    name = "trace"
    PATHS: ClassVar[tuple[str, ...]] = ("dir",)

    def __init__(self, directory: str | Path) -> None:
        self.dir = Path(directory)
        self._runs: dict[str, _Run] = {}

    @classmethod
    def from_kwargs(cls, kwargs: Mapping[str, Any], ctx: SinkContext) -> TraceSink:
        reject_unknown(kwargs, ("dir",), "tracker_kwargs.trace")
        return cls(
            required_path(kwargs, "dir", "tracker_kwargs.trace", "the folder of the trace files")
        )

    def open(self) -> None:
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ConfigError(
                "tracker_kwargs.trace.dir", f"cannot create: {exc.strerror}", str(self.dir)
            ) from None

    def _run(self, run: str) -> _Run:
        state = self._runs.get(run)
        if state is not None:
            if not (state.check.due() and renamed(state.path, state.file.fileno())):
                return state
            self.forget(run)  # rotated: the renamed file is closed whole, a new one begins
        path = trace_path(self.dir, run)
        fresh = not path.exists() or path.stat().st_size == 0
        if not fresh:
            _reopen(path)
        f = path.open("ab")
        if fresh:
            f.write(b"[\n")
        state = self._runs[run] = _Run(f, path)
        meta = {"ph": "M", "pid": STEPS_PID, "name": "process_name", "args": {"name": "steps"}}
        self._event(state, meta)
        self._event(state, {**meta, "name": "rlpulse_run", "args": {"run": run}})
        for tid, name in ((STEPS_TID, "steps"), (PATH_TID, "critical path")):
            self._event(state, {**meta, "tid": tid, "name": "thread_name", "args": {"name": name}})
        return state

    @staticmethod
    def _event(state: _Run, event: Mapping[str, Any]) -> None:
        state.file.write(_JSON.encode(event) + b",\n")

    def write(self, record: StepRecord) -> None:
        if not record.spans:
            return
        state = self._run(record.run)
        start = min(s.start for s in record.spans)
        end = max(s.end for s in record.spans)
        step_args: dict[str, Any] = {"step": record.step, "partial": record.partial}
        ledger = record.ledger
        summary = ledger_line(record.step, record.metrics, ledger)
        if summary is not None:
            step_args["ledger"] = summary
        if ledger is not None and ledger.cause is not None:
            step_args["cause"] = ledger.cause.label()
        self._event(
            state,
            {
                "ph": "X",
                "name": f"step {record.step}",
                "pid": STEPS_PID,
                "tid": STEPS_TID,
                "ts": start * 1e6,
                "dur": (end - start) * 1e6,
                "args": step_args,
            },
        )
        if ledger is not None:
            self._critical_path(state, record.step, ledger)
        for span in record.spans:
            pid = state.pids.get(span.role)
            if pid is None:
                pid = state.pids[span.role] = len(state.pids) + 1
                self._event(
                    state,
                    {"ph": "M", "pid": pid, "name": "process_name", "args": {"name": span.role}},
                )
                self._event(
                    state,
                    {
                        "ph": "M",
                        "pid": pid,
                        "name": "process_sort_index",
                        "args": {"sort_index": pid},
                    },
                )
            if (pid, span.rank) not in state.threads:
                state.threads.add((pid, span.rank))
                name = f"rank {span.rank} @ {span.host}"
                for meta, meta_args in (
                    ("thread_name", {"name": name}),
                    ("thread_sort_index", {"sort_index": span.rank}),
                ):
                    self._event(
                        state,
                        {"ph": "M", "pid": pid, "tid": span.rank, "name": meta, "args": meta_args},
                    )
            args: dict[str, Any] = {"step": record.step, "phase": f"{span.cluster}/{span.phase}"}
            if span.execute is not None:
                args["execute_s"] = span.execute
            if span.gpu is not None:
                args["gpu_s"] = span.gpu
            self._event(
                state,
                {
                    "ph": "X",
                    "name": span.phase,
                    "cat": span.cluster,
                    "pid": pid,
                    "tid": span.rank,
                    "ts": span.start * 1e6,
                    "dur": span.seconds * 1e6,
                    "args": args,
                },
            )
        state.file.flush()

    def _critical_path(self, state: _Run, step: int, ledger: StepLedger) -> None:
        """The step's critical path on its row: the phase (and rank) it waited for, or gaps."""
        for seg in ledger.path:
            args: dict[str, Any] = {"step": step}
            if seg.role:
                args["rank"] = f"{seg.role}/{seg.rank}"
            self._event(
                state,
                {
                    "ph": "X",
                    "name": seg.phase or "gap",
                    "cat": "critical_path",
                    "pid": STEPS_PID,
                    "tid": PATH_TID,
                    "ts": (ledger.start + seg.start) * 1e6,
                    "dur": seg.seconds * 1e6,
                    "args": args,
                },
            )

    def written_through(self) -> dict[str, int]:
        """The last step of each run already in its file (from the file's tail)."""
        out: dict[str, int] = {}
        for path in self.dir.glob("*.trace.json") if self.dir.exists() else ():
            run = _run_name(path)
            if run is None:
                continue
            with path.open("rb") as f:
                size = f.seek(0, os.SEEK_END)
                f.seek(max(0, size - TAIL_BYTES))
                steps = [int(m) for m in _STEP.findall(f.read())]
            if steps:
                out[run] = max(steps)
        return out

    def reopen(self) -> None:
        """SIGHUP: the files renamed since (a log rotation) are closed whole, each with its
        ``]``; the run's next step begins a new file at its path."""
        for run in [
            r for r, state in self._runs.items() if renamed(state.path, state.file.fileno())
        ]:
            self.forget(run)

    def forget(self, run: str) -> None:
        """The collector forgot ``run`` (it ended): its file is closed, as at a stop."""
        state = self._runs.pop(run, None)
        if state is not None:
            _close(state)

    def close(self) -> None:
        runs, self._runs = self._runs, {}
        for state in runs.values():
            _close(state)


def _close(state: _Run) -> None:
    state.file.write(b"{}]\n")  # an empty object closes the trailing comma
    state.file.close()


def _run_name(path: Path) -> str | None:
    """The run a trace file belongs to, from its ``rlpulse_run`` metadata event."""
    with path.open("rb") as f:
        for line in f.read(4096).split(b"\n")[:4]:
            if b'"rlpulse_run"' in line:
                try:
                    return str(json.loads(line.rstrip(b",\n"))["args"]["run"])
                except (ValueError, KeyError, TypeError):
                    return None
    return None


def _reopen(path: Path) -> None:
    """Ready a trace file for appending: drop its closing ``{}]`` and any torn last line."""
    with path.open("r+b") as f:
        size = f.seek(0, os.SEEK_END)
        f.seek(max(0, size - TAIL_BYTES))
        tail = f.read()
        body = tail[: tail.rfind(b",\n") + 2] if b",\n" in tail else tail
        f.truncate(size - len(tail) + len(body))
