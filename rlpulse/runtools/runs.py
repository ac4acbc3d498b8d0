"""Runs read back from jsonl: one :class:`Run` per run name, each metric a curve over steps.

A jsonl file is what the ``jsonl`` sink writes: one :meth:`rlpulse.schemas.record.StepRecord.to_json`
object per line. One file may hold several runs (one collector serves many). A step written
twice (a collector restarted from its ``state_dir`` replays what a sink may already have
written) counts once: the later line wins.

>>> import json, tempfile, pathlib
>>> path = pathlib.Path(tempfile.mkdtemp()) / "r.jsonl"
>>> lines = [{"run": "a", "step": s, "metrics": {"system/tps": 10.0 * s}} for s in (1, 2)]
>>> _ = path.write_text("".join(json.dumps(x) + "\\n" for x in lines))
>>> run, = load_runs(path).values()
>>> run.curve("system/tps")
((1, 2), (10.0, 20.0))
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlpulse.schemas.record import StepRecord


class RunFileError(ValueError):
    """A jsonl file that cannot be read as runs; ``path`` and ``line`` say where."""

    def __init__(self, path: Path | str, message: str, line: int | None = None) -> None:
        where = f"{path}:{line}" if line is not None else str(path)
        super().__init__(f"{where}: {message}")
        self.path = str(path)
        self.line = line


@dataclass(frozen=True)
class Run:
    """One run's steps, as curves: ``series[name]`` is ``((step, value), ...)`` by step.

    ``partial`` counts the steps emitted without every rank; ``source`` is the file read.

    >>> r = Run("r", steps=(0, 1, 2), series={"system/tps": ((1, 100.0), (2, 300.0))})
    >>> r.max("system/tps"), r.mean("system/tps"), r.mean("actor/ref_kl")
    (300.0, 200.0, None)
    """

    name: str
    steps: tuple[int, ...] = ()
    series: Mapping[str, tuple[tuple[int, float], ...]] = field(default_factory=dict)
    partial: int = 0
    source: str = ""
    repeated: int = 0
    """Steps the file holds more than once (two jobs under one run name appended to one
    file, or a run replayed into it): the last of each is used, and the tools warn."""
    config: Mapping[str, Any] | None = None
    """The run's configuration as the collector recorded it (``config`` on the step after it
    arrived: ``Producer.run_config``), the latest one; None when the file holds none."""

    def repeat_warning(self) -> str | None:
        """What to tell the user when the file held some of this run's steps twice."""
        if not self.repeated:
            return None
        return (
            f"run {self.name!r} in {self.source}: {self.repeated} steps appear more than once "
            "(two jobs wrote under this run name, or steps were re-emitted); the last of each "
            "is used: give each job its own run name, or --resume a run on purpose"
        )

    def has(self, name: str) -> bool:
        return bool(self.series.get(name))

    def curve(self, name: str) -> tuple[tuple[int, ...], tuple[float, ...]]:
        """Steps and values of ``name``, NaN and infinities left out (empty if never logged)."""
        points = [(s, v) for s, v in self.series.get(name, ()) if math.isfinite(v)]
        return tuple(s for s, _ in points), tuple(v for _, v in points)

    def last(self, name: str) -> float | None:
        values = self.curve(name)[1]
        return values[-1] if values else None

    def max(self, name: str) -> float | None:
        values = self.curve(name)[1]
        return max(values) if values else None

    def argmax(self, name: str) -> int | None:
        """The first step at which ``name`` reached its maximum."""
        steps, values = self.curve(name)
        return steps[values.index(max(values))] if values else None

    def mean(self, name: str) -> float | None:
        """Mean over the steps that logged ``name`` (each step counts once)."""
        values = self.curve(name)[1]
        return math.fsum(values) / len(values) if values else None


def read_records(path: str | Path) -> tuple[dict[str, dict[int, StepRecord]], dict[str, int]]:
    """Every step record in ``path``: by run (in order of first appearance), then by step
    (a step written twice: the later line), and per run how many steps were repeated."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise RunFileError(path, f"cannot read: {exc.strerror}") from None
    records: dict[str, dict[int, StepRecord]] = {}
    repeated: dict[str, int] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = StepRecord.from_json(json.loads(line))
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise RunFileError(path, f"not a step record ({exc})", number) from None
        steps = records.setdefault(record.run, {})
        if record.step in steps:  # a repeated step: counted, and the last one wins
            repeated[record.run] = repeated.get(record.run, 0) + 1
        steps[record.step] = record
    if not records:
        raise RunFileError(path, "holds no steps")
    return records, repeated


def load_runs(path: str | Path) -> dict[str, Run]:
    """Every run in ``path``, by name, in order of first appearance."""
    records, repeated = read_records(path)
    return {
        name: _run(name, steps, str(path), repeated.get(name, 0)) for name, steps in records.items()
    }


def load_run(path: str | Path, run: str | None = None) -> Run:
    """The run named ``run`` in ``path``; without a name, the file's only run."""
    runs = load_runs(path)
    if run is None:
        if len(runs) > 1:
            raise RunFileError(path, f"holds several runs ({', '.join(runs)}): choose one")
        return next(iter(runs.values()))
    if run not in runs:
        raise RunFileError(path, f"has no run {run!r} (it has {', '.join(runs)})")
    return runs[run]


def _run(name: str, by_step: Mapping[int, StepRecord], source: str, repeated: int = 0) -> Run:
    steps = tuple(sorted(by_step))
    series: dict[str, list[tuple[int, float]]] = {}
    for step in steps:
        for metric, value in by_step[step].metrics.items():
            series.setdefault(metric, []).append((step, float(value)))
    configs = [by_step[step].config for step in steps if by_step[step].config]
    return Run(
        name=name,
        steps=steps,
        series={k: tuple(v) for k, v in series.items()},
        partial=sum(1 for r in by_step.values() if r.partial),
        source=source,
        repeated=repeated,
        config=dict(configs[-1]) if configs else None,
    )
