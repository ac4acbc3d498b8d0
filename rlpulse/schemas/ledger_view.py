"""How a step's ledger reads: one line (the ``stdout`` tracker), and a table of it against a
median step (``rlpulse why``). Read off a record's ``ledger/...`` metrics and its
:class:`~rlpulse.schemas.ledger.StepLedger`, so a record read back from jsonl reads the same.

A line groups the path's seconds by where they went: each role's own work (with its rollout
tail and straggler wait, and who), then ``sync``, ``reward`` and ``checkpoint``, ``gaps`` and
``unaccounted``; ``overlap`` is stated after the sum, and a slow step's cause last::

    step 12 4.10 s = rollout 2.30 (tail 1.10, rollout/0) + actor_train 1.20 + sync 0.30
      + gaps 0.30 | overlap 0.40 | slow: +1.0 s over the median 3.1 s: rollout_tail rollout/0

>>> from rlpulse.schemas import ledger as L
>>> from rlpulse.schemas.spans import Span
>>> g = Span("rollout", 0, "h", "rollout", "generate", 0.0, 2.3, 2.3, None, None, None, 60)
>>> t = Span("actor_train", 0, "h", "actor_train", "train_step", 2.6, 3.8, 1.2)
>>> led = L.compute([g, t], finish_p90=1.2)
>>> print(line(3, led.metrics(), led.record))
step 3 3.80 s = rollout 2.30 (tail 1.10, rollout/0: 60 tokens) + actor_train 1.20 + gaps 0.30 | overlap 0.00
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping, Sequence

from rlpulse.schemas.attribution import LEDGER_EXCESS, LEDGER_MEDIAN
from rlpulse.schemas.ledger import (
    BUCKETS,
    GAPS,
    LEDGER_BUCKET,
    LEDGER_WALL,
    OVERLAP,
    PHASE_BUCKET,
    STRAGGLER,
    UNACCOUNTED,
    StepLedger,
    path_of,
)


def groups(metrics: Mapping[str, float]) -> dict[str, dict[str, float]]:
    """The path's seconds by group (a role's work, or ``sync``/``reward``/``checkpoint``) and
    part: ``{"rollout": {"execute": 1.2, "tail": 1.1, ...}, "sync": {...}}``."""
    out: dict[str, dict[str, float]] = {}
    for name, seconds in metrics.items():
        where = path_of(name)
        if where is None:
            continue
        cluster, phase, part = where
        group = PHASE_BUCKET.get(phase, cluster)
        parts = out.setdefault(group, {})
        parts[part] = parts.get(part, 0.0) + seconds
    return out


def line(step: int, metrics: Mapping[str, float], ledger: StepLedger | None) -> str | None:
    """The step's ledger in one line (None without one)."""
    wall = metrics.get(LEDGER_WALL.name)
    if wall is None or ledger is None:
        return None
    f = _format(wall)
    terms = []
    for group, parts in sorted(groups(metrics).items(), key=lambda kv: -sum(kv[1].values())):
        total = sum(parts.values())
        if f(total) == f(0.0):
            continue
        notes = []
        if f(parts.get("tail", 0.0)) != f(0.0):
            engine = ledger.who.get("longest", "")
            tokens = f": {ledger.longest:g} tokens" if ledger.longest else ""
            notes.append(f"tail {f(parts['tail'])}, {engine}{tokens}")
        if f(parts.get("straggler", 0.0)) != f(0.0):
            who = sorted({w for k, w in ledger.who.items() if k.startswith(f"{STRAGGLER}:")})
            notes.append(f"straggler {f(parts['straggler'])}, {' '.join(who)}")
        terms.append(f"{group} {f(total)}" + (f" ({'; '.join(notes)})" if notes else ""))
    for bucket in (GAPS, UNACCOUNTED):
        seconds = metrics.get(LEDGER_BUCKET.format(bucket=bucket), 0.0)
        if bucket == GAPS or f(seconds) != f(0.0):
            terms.append(f"{bucket} {f(seconds)}")
    text = f"step {step} {f(wall)} s = " + " + ".join(terms)
    text += f" | overlap {f(metrics.get(LEDGER_BUCKET.format(bucket=OVERLAP), 0.0))}"
    if ledger.cause is not None:
        median = metrics.get(LEDGER_MEDIAN.name, 0.0)
        excess = metrics.get(LEDGER_EXCESS.name, 0.0)
        text += f" | slow: +{excess:.2g} s over the median {median:.3g} s: {ledger.cause.label()}"
    return text


def _format(wall: float) -> Callable[[float], str]:
    """Seconds to the precision the step's wall time needs (tenths from 10 s on)."""
    digits = 1 if wall >= 10 else 2
    return lambda x: f"{x:.{digits}f}"


def rows(
    metrics: Mapping[str, float], others: Sequence[Mapping[str, float]]
) -> list[tuple[str, float, float]]:
    """``(what, this step, the median over others)`` for the wall time, each bucket and each
    phase part on the path that this step or the median step has, in bucket order."""
    names = [LEDGER_WALL.name, *(LEDGER_BUCKET.format(bucket=b) for b in (*BUCKETS, OVERLAP))]
    paths = sorted({n for m in (metrics, *others) for n in m if n.startswith("ledger/path/")})
    out = []
    for name in (*names, *paths):
        mine = metrics.get(name, 0.0)
        median = statistics.median(m.get(name, 0.0) for m in others) if others else 0.0
        if name in names or mine or median:
            out.append((name.removeprefix("ledger/"), mine, median))
    return out
