"""A timeline PNG of chosen steps from a run's trace file (the ``trace`` sink's output):
one row per rank (grouped by role), one bar per phase, step boundaries as lines.

>>> # draw_timeline(load_trace("runs/demo/traces/demo.trace.json"), range(3, 5), "t.png")
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from rlpulse.collector.sinks.trace import STEPS_TID
from rlpulse.runtools.report import ReportError


@dataclass(frozen=True)
class Bar:
    role: str
    rank: int
    host: str
    phase: str
    step: int
    start: float
    """Seconds since the epoch."""
    seconds: float


@dataclass(frozen=True)
class Trace:
    run: str
    bars: tuple[Bar, ...]
    steps: dict[int, tuple[float, float]]
    """Per step, its first phase's start and last phase's end."""


def load_trace(path: str | Path) -> Trace:
    """Read a trace file written by the ``trace`` sink (closed or still being written)."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise ReportError(f"{path}: cannot read: {exc.strerror}") from None
    body = text.strip()
    if body.endswith(","):
        body = body[:-1]
    if not body.endswith("]"):
        body += "]"
    try:
        events = json.loads(body)
    except ValueError as exc:
        raise ReportError(f"{path}: not a trace-event JSON array: {exc}") from None
    roles: dict[int, str] = {}
    threads: dict[tuple[int, int], str] = {}
    run = path.name.removesuffix(".trace.json")
    for e in events:
        if e.get("ph") != "M":
            continue
        if e["name"] == "process_name":
            roles[e["pid"]] = e["args"]["name"]
        elif e["name"] == "thread_name":
            threads[(e["pid"], e["tid"])] = e["args"]["name"]
        elif e["name"] == "rlpulse_run":
            run = e["args"]["run"]
    bars, steps = [], {}
    for e in events:
        if e.get("ph") != "X":
            continue
        start, seconds = e["ts"] / 1e6, e["dur"] / 1e6
        if e["pid"] == 0:  # the steps row; the critical path's row under it is not a bar
            if e.get("tid", 0) == STEPS_TID:
                steps[int(e["args"]["step"])] = (start, start + seconds)
            continue
        host = threads.get((e["pid"], e["tid"]), "").partition(" @ ")[2]
        bars.append(
            Bar(
                roles.get(e["pid"], "?"),
                e["tid"],
                host,
                e["name"],
                int(e["args"]["step"]),
                start,
                seconds,
            )
        )
    return Trace(run, tuple(bars), steps)


def parse_steps(spec: str) -> range:
    """``"3"`` or ``"3:6"`` (3, 4, 5) into a range; ReportError otherwise."""
    first, colon, end = spec.partition(":")
    try:
        lo = int(first)
        hi = int(end) if colon else lo + 1
    except ValueError:
        raise ReportError(f"--timeline {spec!r}: give a step (3) or a range (3:6)") from None
    if lo < 0 or hi <= lo:
        raise ReportError(f"--timeline {spec!r}: the range holds no step")
    return range(lo, hi)


def draw_timeline(trace: Trace, steps: Iterable[int], path: str | Path) -> int:
    """Draw ``steps`` of ``trace`` into ``path``; returns the number of bars drawn."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    wanted = set(steps)
    bars = [b for b in trace.bars if b.step in wanted]
    if not bars:
        have = sorted(trace.steps)
        span = f"{have[0]}..{have[-1]}" if have else "none"
        raise ReportError(f"no spans for steps {sorted(wanted)} in {trace.run} (steps: {span})")
    t0 = min(b.start for b in bars)
    rows = sorted({(b.role, b.rank) for b in bars})
    row_of = {r: i for i, r in enumerate(rows)}
    phases = sorted({b.phase for b in bars})
    colors = plt.get_cmap("tab10")
    color_of = {p: colors(i % 10) for i, p in enumerate(phases)}
    fig, ax = plt.subplots(figsize=(13.5, 1.5 + 0.35 * len(rows)))
    for b in bars:
        ax.broken_barh(
            [(b.start - t0, max(b.seconds, 1e-6))],
            (row_of[(b.role, b.rank)] - 0.4, 0.8),
            facecolors=color_of[b.phase],
        )
    for step in sorted(wanted):
        bounds = trace.steps.get(step)
        if bounds is None:
            continue
        ax.axvline(bounds[0] - t0, color="grey", lw=0.8, ls="--")
        ax.text(bounds[0] - t0, len(rows) - 0.4, f" step {step}", fontsize=8, va="bottom")
    ax.set_yticks(range(len(rows)), [f"{role}/{rank}" for role, rank in rows])
    ax.invert_yaxis()
    ax.set_xlabel("seconds")
    ax.set_title(f"{trace.run}: steps {min(wanted)}..{max(wanted)}")
    handles = [plt.Rectangle((0, 0), 1, 1, color=color_of[p]) for p in phases]
    ax.legend(handles, phases, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return len(bars)
