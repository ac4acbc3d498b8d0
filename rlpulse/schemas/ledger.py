"""The step ledger: where one step's wall time went, from every rank's phase spans.

**Input.** A step's spans (``rlpulse.schemas.spans``: every rank's phases, placed on the
collector's timeline by each producer's measured clock offset) and, where the rollout logged
it, ``p90`` of ``rollout/response/finish`` (seconds from the start of a generation's work to
the moment 90% of the step's responses had finished, merged over every engine).

**Wall time.** From the earliest start of any span of the step to the latest end.

**The critical path** is chosen walking back from the wall's end. At each point ``t`` (first
the wall's end) the path takes, among the spans that start before ``t``, the one whose end,
cut at ``t``, is latest: the span the step was waiting for just before ``t``. Ties (several
spans running across ``t``) go to the earliest start. From its end (cut at ``t``) back to its
start the path is in that span; between its end and ``t``, when it ended before ``t``, no span
of the step ran at all: a *gap*. Then ``t`` moves to the span's start, until it reaches the
wall's start. Every second of the wall is therefore on the path exactly once: in one span
(the one the step waited for) or in a gap.

**Buckets.** Each second of the path goes to exactly one bucket, so the buckets sum to the
wall time (to float rounding):

* ``gaps``: path seconds in no span (driver work, data transfer, scheduling between phases);
* in a span of a generation that logged its responses with the phase (its ``longest`` is
  set), the seconds after ``start + onload + p90``: ``rollout_tail`` (the generation after
  90% of the step's responses had finished);
* then, in a span of a phase that other ranks of the same cluster also ran at overlapping
  times (a parallel phase), the seconds after the last of those others ended: ``straggler``
  (what the other ranks spent waiting for this, the slowest, rank);
* the rest of a span by its parts, laid out in the order a phase runs them: ``onload`` from
  its start, then ``execute``, then what the phase's own bookkeeping took between them
  (memory probes: the span's ``total`` less its parts), ``offload`` at its end. Onload,
  execute and offload go to the phase's bucket: ``sync`` for ``model_update``, ``reward`` for
  ``compute_rewards``, ``checkpoint`` for ``do_checkpoint``, ``work`` for every other phase;
  the bookkeeping goes to ``unaccounted``. A span without parts is all execute.

``overlap`` is stated beside the buckets and is not one of them: the seconds of the wall in
which phases of two or more roles ran at once (a pipeline overlapping roles; the demo's
reference beside the reward, the critic beside the actor). Each such second is on the path
once, in the span the step waited for; the others' work was hidden under it.

Per phase of the step, ``ledger/path/{cluster}/{phase}/{part}`` gives its path seconds by part
(``execute``, ``onload``, ``offload``, ``straggler``, ``tail``), and the record names the rank
behind each: the slowest rank of a straggler, the engine of the step's longest response.

>>> from rlpulse.schemas.spans import Span
>>> a = Span("actor_train", 0, "h", "actor_train", "train_step", 10.0, 12.0, 2.0)
>>> b = Span("actor_train", 1, "h", "actor_train", "train_step", 10.0, 13.0, 3.0)
>>> g = Span("rollout", 0, "h", "rollout", "generate", 7.0, 9.5, 2.5)
>>> ledger = compute([a, b, g])
>>> ledger.wall, ledger.buckets["work"], ledger.buckets["straggler"], ledger.buckets["gaps"]
(6.0, 4.5, 1.0, 0.5)
>>> [(s.role, s.rank, s.phase) for s in ledger.record.path]
[('rollout', 0, 'rollout/generate'), ('', -1, ''), ('actor_train', 1, 'actor_train/train_step')]
"""

from __future__ import annotations

import bisect
import collections
import functools
import itertools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import msgspec

from rlpulse.schemas.ledger_names import (  # the names, re-exported for the ledger's readers
    BUCKETS as BUCKETS,
    CHECKPOINT as CHECKPOINT,
    ENTRIES as ENTRIES,
    GAPS as GAPS,
    LEDGER_BUCKET as LEDGER_BUCKET,
    LEDGER_FRACTION as LEDGER_FRACTION,
    LEDGER_PATH as LEDGER_PATH,
    LEDGER_WALL as LEDGER_WALL,
    OVERLAP as OVERLAP,
    PATH_PARTS as PATH_PARTS,
    PHASE_BUCKET as PHASE_BUCKET,
    REWARD as REWARD,
    STRAGGLER as STRAGGLER,
    SYNC as SYNC,
    TAIL as TAIL,
    TEMPLATES as TEMPLATES,
    UNACCOUNTED as UNACCOUNTED,
    WORK as WORK,
)
from rlpulse.schemas.spans import Span
from rlpulse.schemas.topology import GENERATE


class PathSegment(msgspec.Struct, array_like=True, frozen=True):
    """A stretch of the critical path: ``role``/``rank`` in ``phase`` (``cluster/phase``), or a
    gap (``role`` "", ``rank`` -1, ``phase`` ""), from ``start`` to ``end`` seconds after the
    step's start."""

    role: str
    rank: int
    phase: str
    start: float
    end: float

    @property
    def seconds(self) -> float:
        return self.end - self.start


class Cause(msgspec.Struct, frozen=True, omit_defaults=True):
    """Why a step was slower than the run's rolling median (``rlpulse.schemas.attribution``):
    one bucket with the role, rank and phase behind it, its seconds over its own median and
    its share of the step's excess; or ``bucket`` "mixed" with the ``top`` three."""

    bucket: str
    role: str = ""
    rank: int = -1
    phase: str = ""
    seconds: float = 0.0
    share: float = 0.0
    top: list[Cause] = []

    def label(self) -> str:
        """``straggler actor_train/1 actor_train/train_step``, or ``mixed: a, b, c``."""
        if self.bucket == "mixed":
            return "mixed: " + ", ".join(c.label() for c in self.top)
        who = f" {self.role}/{self.rank}" if self.role else ""
        return f"{self.bucket}{who}{f' {self.phase}' if self.phase else ''}"


class StepLedger(msgspec.Struct, frozen=True, omit_defaults=True):
    """What a step record carries of its ledger beyond the ``ledger/...`` numbers: the
    critical path in order, who is behind each bucket, and the cause of a slow step."""

    start: float
    """The step's start on the collector's timeline (seconds since the epoch)."""
    wall: float
    path: list[PathSegment] = []
    who: dict[str, str] = {}
    """``bucket:cluster/phase`` -> ``role/rank`` behind it (the rank on the path)."""
    longest: float = 0.0
    """Tokens of the step's longest response; ``who["longest"]`` names its engine."""
    runs: dict[str, int] = {}
    """``cluster/phase`` -> how many times the rank that ran it most ran it in the step: the
    step's kind (a validation step runs ``rollout/generate`` twice), which attribution compares
    like with like (``rlpulse.schemas.attribution``)."""
    cause: Cause | None = None


@dataclass(frozen=True)
class Ledger:
    """One step's ledger (:func:`compute`)."""

    buckets: Mapping[str, float]
    """Seconds per bucket (:data:`BUCKETS`, summing to the wall time) and ``overlap``."""
    parts: Mapping[tuple[str, str, str], float]
    """Path seconds by ``(cluster, phase, part)``, for every part of every phase of the step
    (0 when not on the path)."""
    record: StepLedger

    @property
    def wall(self) -> float:
        return self.record.wall

    def metrics(self) -> dict[str, float]:
        """The ``ledger/...`` metrics of the step."""
        wall = self.record.wall
        out = {LEDGER_WALL.name: wall}
        for bucket, seconds in self.buckets.items():
            out[_BUCKET_NAMES[bucket]] = seconds
            if wall > 0:
                out[_FRACTION_NAMES[bucket]] = seconds / wall
        for key, seconds in self.parts.items():
            out[path_name(*key)] = seconds
        return out


_BUCKET_NAMES = {b: LEDGER_BUCKET.format(bucket=b) for b in (*BUCKETS, OVERLAP)}
_FRACTION_NAMES = {b: LEDGER_FRACTION.format(bucket=b) for b in (*BUCKETS, OVERLAP)}


@functools.lru_cache(maxsize=8192)
def path_name(cluster: str, phase: str, part: str) -> str:
    """``ledger/path/{cluster}/{phase}/{part}`` (spelled once per run's phases, not per step)."""
    return LEDGER_PATH.format(cluster=cluster, phase=phase, part=part)


@functools.lru_cache(maxsize=8192)
def path_of(name: str) -> tuple[str, str, str] | None:
    """``(cluster, phase, part)`` of a ``ledger/path/...`` name, None for any other name."""
    found = LEDGER_PATH.match(name) if name.startswith("ledger/path/") else None
    return None if found is None else (found["cluster"], found["phase"], found["part"])


_PART_BUCKET = {"straggler": STRAGGLER, "tail": TAIL}


def item_key(bucket: str, cluster: str = "", phase: str = "") -> str:
    """How an item of the ledger (a bucket of one phase) is named: ``bucket:cluster/phase``."""
    return f"{bucket}:{cluster}/{phase}" if phase else bucket


def items(metrics: Mapping[str, float]) -> dict[str, float]:
    """A step's ledger as items (bucket of one phase, :func:`item_key`) with their seconds,
    read off its ``ledger/...`` metrics (so a record read back gives the same items)."""
    out: dict[str, float] = {}
    for bucket in (GAPS, UNACCOUNTED):
        seconds = metrics.get(_BUCKET_NAMES[bucket])
        if seconds:
            out[bucket] = seconds
    for name, seconds in metrics.items():
        where = path_of(name) if seconds else None
        if where is None:
            continue
        cluster, phase, part = where
        bucket = _PART_BUCKET.get(part) or PHASE_BUCKET.get(phase, WORK)
        key = item_key(bucket, cluster, phase)
        out[key] = out.get(key, 0.0) + seconds
    return out


def compute(spans: Iterable[Span], finish_p90: float | None = None) -> Ledger | None:
    """The ledger of a step with these spans (None without any span of positive length);
    ``finish_p90``: the step's ``rollout/response/finish/p90``, where rollout tails begin."""
    ordered = sorted(
        (s for s in spans if s.end > s.start),
        key=lambda s: (s.start, -s.end, s.role, s.rank, s.cluster, s.phase),
    )
    if not ordered:
        return None
    start, end = ordered[0].start, max(s.end for s in ordered)
    path = _critical_path(ordered, start, end)
    parallel: dict[tuple[str, str], list[Span]] = {}
    for s in ordered:
        parallel.setdefault((s.cluster, s.phase), []).append(s)
    runs = {f"{c}/{p}": _most_runs(these) for (c, p), these in parallel.items()}
    buckets = dict.fromkeys(BUCKETS, 0.0)
    # every part of every phase of the step, 0 when not on the path: a gauge that kept the
    # last step's value would show a stale straggler or tail
    parts = {(c, p, part): 0.0 for c, p in parallel for part in PATH_PARTS}
    on_path: dict[str, dict[tuple[str, int], float]] = {}
    segments = []
    for a, b, span in path:
        if span is None:
            buckets[GAPS] += b - a
            segments.append(PathSegment("", -1, "", a - start, b - start))
            continue
        segments.append(
            PathSegment(span.role, span.rank, f"{span.cluster}/{span.phase}", a - start, b - start)
        )
        for bucket, part, seconds in _split(span, a, b, finish_p90, parallel):
            if seconds <= 0:
                continue
            buckets[bucket] += seconds
            if part:
                key = (span.cluster, span.phase, part)
                parts[key] = parts.get(key, 0.0) + seconds
                held = on_path.setdefault(item_key(bucket, span.cluster, span.phase), {})
                held[(span.role, span.rank)] = held.get((span.role, span.rank), 0.0) + seconds
    buckets[OVERLAP] = _overlap(ordered)
    who = {k: "{}/{}".format(*max(v.items(), key=lambda kv: kv[1])[0]) for k, v in on_path.items()}
    longest = max((s for s in ordered if s.longest is not None), key=_longest, default=None)
    if longest is not None:
        who["longest"] = f"{longest.role}/{longest.rank}"
    tokens = (longest.longest or 0.0) if longest is not None else 0.0
    record = StepLedger(start, end - start, _merged(segments), who, tokens, runs)
    return Ledger(buckets, parts, record)


def _most_runs(spans: Sequence[Span]) -> int:
    """How many of ``spans`` (one phase's) the rank with the most of them ran."""
    counts = collections.Counter((s.role, s.rank) for s in spans)
    return max(counts.values())


def _longest(span: Span) -> tuple[float, float]:
    return (span.longest or 0.0, span.end)


def _critical_path(
    ordered: Sequence[Span], start: float, end: float
) -> list[tuple[float, float, Span | None]]:
    """The path as ``(from, to, span)`` in time order, ``span`` None for a gap. ``ordered``
    is sorted by start; with the running maximum of the ends, each step back is two bisections
    (the path of a step of thousands of spans costs milliseconds, not a pass per point)."""
    starts = [s.start for s in ordered]
    reach = list(itertools.accumulate((s.end for s in ordered), max))
    out: list[tuple[float, float, Span | None]] = []
    t = end
    while t > start:
        m = bisect.bisect_left(starts, t)  # the spans starting before t
        cut = min(reach[m - 1], t)  # the latest end among them, cut at t
        j = bisect.bisect_left(reach, cut, 0, m)  # the earliest start reaching it
        span = ordered[j]
        if cut < t:
            out.append((cut, t, None))
        out.append((span.start, cut, span))
        t = span.start
    out.reverse()
    return out


def _split(
    span: Span,
    a: float,
    b: float,
    finish_p90: float | None,
    parallel: Mapping[tuple[str, str], list[Span]],
) -> Iterable[tuple[str, str, float]]:
    """``(bucket, part, seconds)`` of the path's stretch ``[a, b]`` of ``span``."""
    if finish_p90 is not None and span.phase == GENERATE and span.longest is not None:
        tail_from = span.start + (span.onload or 0.0) + finish_p90
        if tail_from < b:
            yield TAIL, "tail", b - max(a, tail_from)
            b = max(a, tail_from)
    others = [
        o.end
        for o in parallel[(span.cluster, span.phase)]
        if (o.role, o.rank) != (span.role, span.rank) and o.start < span.end and o.end > span.start
    ]
    if others and max(others) < b:
        yield STRAGGLER, "straggler", b - max(a, max(others))
        b = max(a, max(others))
    if b <= a:
        return
    total = span.seconds
    onload, offload = max(span.onload or 0.0, 0.0), max(span.offload or 0.0, 0.0)
    execute = span.execute if span.execute is not None else total - onload - offload
    execute = max(execute, 0.0)
    own = onload + execute + offload
    if own > total:  # parts measured apart may add up to a little more than the total
        onload, execute, offload = (x * total / own for x in (onload, execute, offload))
    bucket = PHASE_BUCKET.get(span.phase, WORK)
    u, v = a - span.start, b - span.start
    bounds = (0.0, onload, onload + execute, total - offload, total)
    for i, (part, which) in enumerate(
        (("onload", bucket), ("execute", bucket), ("", UNACCOUNTED), ("offload", bucket))
    ):
        seconds = min(v, bounds[i + 1]) - max(u, bounds[i])
        if seconds > 0:
            yield which, part, seconds


def _overlap(spans: Sequence[Span]) -> float:
    """Seconds in which spans of two or more roles ran at once."""
    events = sorted(
        itertools.chain.from_iterable(((s.start, 1, s.role), (s.end, -1, s.role)) for s in spans)
    )
    active: dict[str, int] = {}
    out, last = 0.0, events[0][0]
    for t, delta, role in events:
        if sum(1 for n in active.values() if n > 0) >= 2:
            out += t - last
        last = t
        active[role] = active.get(role, 0) + delta
    return out


def _merged(segments: list[PathSegment]) -> list[PathSegment]:
    """Consecutive stretches of the same rank's phase (or gaps) as one."""
    out: list[PathSegment] = []
    for seg in segments:
        prev = out[-1] if out else None
        if prev is not None and (prev.role, prev.rank, prev.phase) == (
            seg.role,
            seg.rank,
            seg.phase,
        ):
            out[-1] = PathSegment(seg.role, seg.rank, seg.phase, prev.start, seg.end)
        else:
            out.append(seg)
    return out
