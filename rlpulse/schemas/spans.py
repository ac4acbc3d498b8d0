"""Spans: one rank's run of one phase in one step, for timelines and stragglers.

A producer's ``phase()`` logs the phase's times in one ``log()`` at its end
(``time/{cluster}/{phase}/{total,execute,onload,offload}``, and ``.../gpu/...`` on a GPU). The
collector that receives it from the rank turns that entry into a :class:`Span`: it ends at the
entry's timestamp (the ``log()`` call, microseconds after ``total`` was measured) and starts
``total`` seconds earlier. Times are the rank's wall clock (``time.time()``): ranks on machines
whose clocks disagree show the disagreement.

Spans travel with the step they belong to (:class:`~rlpulse.schemas.record.StepRecord` ``spans``,
a relay's :class:`~rlpulse.schemas.messages.Delta`) and are merged by nothing: every rank's span is
kept. :func:`stragglers` reads a step's spans into the ``straggler/...`` metrics.

>>> a = Span("actor_train", 0, "h", "actor_train", "train_step", 10.0, 11.0)
>>> b = Span("actor_train", 1, "h", "actor_train", "train_step", 10.0, 13.0)
>>> c = Span("actor_train", 2, "h", "actor_train", "train_step", 10.0, 12.0)
>>> stragglers([a, b, c])["straggler/actor_train/train_step/lag"]
1.0
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

import msgspec

from rlpulse.schemas.topology import STRAGGLER


class Span(msgspec.Struct, array_like=True, frozen=True, gc=False):
    """``role``/``rank`` on ``host`` ran ``cluster``/``phase`` from ``start`` to ``end``
    (seconds since the epoch, on the collector's timeline: the rank's clock moved by its
    measured offset, ``rlpulse.collector.intake.clock``); ``execute`` is the work itself and
    ``gpu`` the GPU seconds of the phase's stream, ``onload`` and ``offload`` the seconds of
    loading and unloading model state (None when not measured). ``longest``: for a generation
    that logged its responses with the phase (``rlpulse.schemas.rollout``'s
    ``rollout/response/longest``), the tokens of its longest response, else None.

    The last three fields came after the others: a decoder that predates them ignores them
    (optional trailing fields, ``PROTOCOL.md``)."""

    role: str
    rank: int
    host: str
    cluster: str
    phase: str
    start: float
    end: float
    execute: float | None = None
    gpu: float | None = None
    onload: float | None = None
    offload: float | None = None
    longest: float | None = None

    @property
    def seconds(self) -> float:
        return self.end - self.start

    def moved(self, offset: float) -> Span:
        """This span ``offset`` seconds later (placed on another clock's timeline)."""
        return msgspec.structs.replace(self, start=self.start + offset, end=self.end + offset)


def stragglers(spans: Iterable[Span]) -> dict[str, float]:
    """Per ``cluster/phase`` run by two or more ranks: the slowest rank's lag behind the median
    rank (seconds and ratio) and its rank. A rank's time is the sum of its spans of the phase."""
    per_phase: dict[tuple[str, str], dict[tuple[str, int], float]] = {}
    for s in spans:
        ranks = per_phase.setdefault((s.cluster, s.phase), {})
        ranks[(s.role, s.rank)] = ranks.get((s.role, s.rank), 0.0) + s.seconds
    out: dict[str, float] = {}
    for (cluster, phase), ranks in per_phase.items():
        if len(ranks) < 2 or phase not in STRAGGLER.choices["phase"]:
            continue
        times = sorted(ranks.values())
        n = len(times)
        median = times[n // 2] if n % 2 else (times[n // 2 - 1] + times[n // 2]) / 2
        (_, slowest), worst = max(ranks.items(), key=lambda kv: (kv[1], -kv[0][1]))
        name = {
            stat: STRAGGLER.format(cluster=cluster, phase=phase, stat=stat)
            for stat in STRAGGLER.choices["stat"]
        }
        out[name["lag"]] = worst - median
        if median > 0:  # a ratio to nothing is no ratio
            out[name["lag_ratio"]] = worst / median
        out[name["slowest_rank"]] = float(slowest)
    return out


_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


def trace_path(directory: Path, run: str) -> Path:
    """Where the ``trace`` tracker writes the trace of ``run``, and where ``rlpulse report
    --timeline`` reads it (one spelling for both)."""
    return directory / f"{_UNSAFE.sub('_', run)}.trace.json"
