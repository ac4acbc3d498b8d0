"""A PNG of one run's curves: score, losses, KL, entropy, clipping, lengths, rollout health
(the engine's log-probs against the trainer's, staleness), the rollout engine (tokens, KV
cache, requests, latency quantiles), throughput, phases and stragglers, memory and samples:
the panels :func:`rlpulse.runtools.panels.plan` chooses, under a header that counts the names
logged, drawn and not drawn, and says where the sample rows are.

matplotlib is imported only when a report is drawn (the ``report`` extra), and only its object
API is used (no pyplot, no global backend switch): the Agg canvas renders the PNG. Legends
stand beside their axes, never over the lines; every panel spans the run's steps, ticked at
whole steps; counts, times, sizes and fractions start at 0.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rlpulse.extras import MissingExtra, needs_extra
from rlpulse.runtools.panels import Panel, Plan, plan
from rlpulse.runtools.runs import Run
from rlpulse.runtools.samples import RunSamples


class ReportError(RuntimeError):
    """The report cannot be drawn (matplotlib missing, output not writable)."""


def rolling_mean(values: Sequence[float], window: int) -> list[float]:
    """Trailing mean over up to ``window`` values (shorter at the start).

    >>> rolling_mean([1.0, 3.0, 5.0, 7.0], 2)
    [1.0, 2.0, 4.0, 6.0]
    """
    outv, total = [], 0.0
    for i, v in enumerate(values):
        total += v
        if i >= window:
            total -= values[i - window]
        outv.append(total / min(i + 1, window))
    return outv


def steps_range(steps: Sequence[int]) -> tuple[float, float]:
    """The x range every panel shows: the run's first to last step, half a step beyond each
    (a step either side of a run of one step).

    >>> steps_range([1, 2, 3]), steps_range([6]), steps_range([])
    ((0.5, 3.5), (5.0, 7.0), (0.0, 1.0))
    """
    if not steps:
        return 0.0, 1.0
    first, last = min(steps), max(steps)
    pad = 0.5 if last > first else 1.0
    return first - pad, last + pad


COLUMNS = 3
"""Panels per row of the figure (fewer when there are fewer panels)."""


def figure(run: Run, the_plan: Plan, *, columns: int = COLUMNS) -> Any:
    """The matplotlib ``Figure`` of ``the_plan`` (on an Agg canvas), not yet saved."""
    try:
        with needs_extra("report", "the report"):
            from matplotlib.backends.backend_agg import FigureCanvasAgg
            from matplotlib.figure import Figure
            from matplotlib.ticker import MaxNLocator
    except MissingExtra as exc:
        raise ReportError(str(exc)) from None
    panels = list(the_plan.panels) or [Panel("nothing logged", "", ())]
    columns = max(1, min(columns, len(panels)))
    rows = -(-len(panels) // columns)
    header = the_plan.header(run, width=int(40 * columns))
    fig = Figure(figsize=(6.4 * columns, 3.0 * rows + 0.25 * len(header)), layout="constrained")
    FigureCanvasAgg(fig)
    x_range = steps_range(run.steps)
    fig.suptitle("\n".join(header), fontsize="medium")
    for index, panel in enumerate(panels):
        ax = fig.add_subplot(rows, columns, index + 1)
        ax.set_title(panel.title, fontsize="medium")
        ax.set_xlabel("step")
        ax.set_ylabel(panel.ylabel)
        ax.grid(True, alpha=0.3)
        # Every panel spans the run's steps, ticked at whole steps only.
        ax.set_xlim(*x_range)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True, min_n_ticks=1))
        if not panel.lines:
            ax.text(0.5, 0.5, "no names logged", ha="center", va="center",
                    transform=ax.transAxes, color="gray")  # fmt: skip
            continue
        for line in panel.lines:
            steps, values = run.curve(line.name)
            ax.plot(steps, values, label=line.label, color=line.color, linewidth=1.2,
                    marker="." if len(steps) < 30 else None)  # fmt: skip
        if panel.trend:
            steps, values = run.curve(panel.names[0])
            window = max(1, len(values) // 10)
            if window > 1:
                ax.plot(steps, rolling_mean(values, window), color="black", linestyle="--",
                        linewidth=1.0, label=f"{panel.labels[0]} ({window}-step mean)")  # fmt: skip
        if panel.zero:  # from 0, with room above the highest point
            highest = max((v for line in panel.lines for v in run.curve(line.name)[1]), default=0)
            ax.set_ylim(0.0, max(ax.get_ylim()[1], 1.05 * highest))
        # Beside the axes, never over the lines.
        ax.legend(fontsize="small", title=panel.legend_title or None, title_fontsize="small",
                  loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)  # fmt: skip
    return fig


def draw_report(run: Run, path: str | Path, samples: RunSamples | None = None) -> Plan:
    """Draw ``run`` into the PNG ``path``; returns the plan drawn."""
    the_plan = plan(run, samples)
    fig = figure(run, the_plan)
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, format="png", dpi=80)
    except OSError as exc:
        raise ReportError(f"cannot write {path}: {exc.strerror}") from None
    return the_plan
