"""A PNG of one run's main curves: score and reward, KL, entropy, clip fractions, lengths,
throughput, and GPU and CPU memory by phase and device.

Panels name catalog entries (``rlpulse.schemas.metrics``), never spelled-out strings. A catalog
panel whose metrics the run never logged is left out of the picture and named in its title
("not logged: KL, ..."). Names the catalog does not know (a job's own, ``my/reward_bonus``)
get panels of their own, grouped by their first path segment, so a job that logs only its own
names still gets its curves. matplotlib is imported only when a report is drawn (the ``report`` extra), and only its
object API is used (no pyplot, no global backend switch): the Agg canvas renders the PNG.

>>> from rlpulse.runtools.runs import Run
>>> run = Run("r", steps=(0, 1), series={"system/tps": ((1, 9.0),)})
>>> [p.title for p in plan(run)][:2]
['Score and reward', 'KL']
>>> plan(run)[5].names
('system/tps',)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from rlpulse.extras import MissingExtra, needs_extra
from rlpulse.runtools.runs import Run
from rlpulse.schemas import metrics as M
from rlpulse.schemas.catalog import Entry
from rlpulse.schemas.reductions import Stat


class ReportError(RuntimeError):
    """The report cannot be drawn (matplotlib missing, output not writable)."""


def out(entry: Entry, stat: Stat | None = None) -> str:
    """The reported name of ``entry`` (its ``stat`` output for a family with several)."""
    names = entry.output_names()
    if stat is None:
        (name,) = names.values()
        return name
    return names[stat]


@dataclass(frozen=True)
class Panel:
    """One subplot: its title, y label and the reported names drawn in it (those the run has)."""

    title: str
    ylabel: str
    names: tuple[str, ...]
    labels: tuple[str, ...]
    trend: bool = False  # also draw a rolling mean of the first curve


OWN_PER_PANEL = 6
"""Curves in a panel of the run's own names."""
MAX_OWN_PANELS = 12
"""Panels of the run's own names at most; the names beyond are counted in the title."""


@dataclass(frozen=True)
class _Spec:
    title: str
    ylabel: str
    pick: Callable[[Run], list[tuple[str, str]]]  # run -> [(name, legend label)]
    trend: bool = False


def _fixed(*names: str) -> Callable[[Run], list[tuple[str, str]]]:
    return lambda run: [(n, n) for n in names if run.has(n)]


def _memory_gpu(run: Run) -> list[tuple[str, str]]:
    """Peak allocated GPU memory during each phase, by worker group, phase and device."""
    picked = []
    for name in sorted(run.series):
        p = M.MEMORY_GPU.match(name)
        if p and (p["when"], p["state"], p["stat"]) == ("end", "onload", "max_allocated"):
            picked.append((name, f"{p['cluster']}/{p['phase']} gpu{p['device_id']}"))
    return picked


def _memory_cpu(run: Run) -> list[tuple[str, str]]:
    """Resident memory of the worker process at the end of each phase."""
    picked = []
    for name in sorted(run.series):
        p = M.MEMORY_CPU.match(name)
        if p and (p["when"], p["kind"]) == ("end", "rss"):
            picked.append((name, f"{p['cluster']}/{p['phase']} rss"))
    return picked


SPECS: tuple[_Spec, ...] = (
    _Spec(
        "Score and reward",
        "score",
        _fixed(
            out(M.CRITIC_SCORE, Stat.MEAN),
            out(M.CRITIC_REWARDS, Stat.MEAN),
            out(M.VAL_SCORE, Stat.MEAN),
        ),
        trend=True,
    ),
    _Spec(
        "KL",
        "nats",
        _fixed(
            out(M.ACTOR_REF_KL), out(M.ACTOR_KL_LOSS), out(M.ACTOR_APPROXKL), out(M.ACTOR_POLICYKL)
        ),
    ),
    _Spec("Entropy", "nats per token", _fixed(out(M.CRITIC_ENTROPY, Stat.MEAN))),
    _Spec(
        "Clip fraction",
        "fraction of tokens",
        _fixed(
            out(M.ACTOR_CLIPFRAC),
            out(M.ACTOR_PPO_RATIO_CLIPFRAC),
            out(M.ACTOR_PPO_RATIO_HIGH_CLIPFRAC),
            out(M.ACTOR_PPO_RATIO_LOW_CLIPFRAC),
            out(M.CRITIC_CLIPFRAC),
        ),
    ),
    _Spec(
        "Lengths",
        "tokens",
        _fixed(
            out(M.RESPONSE_LENGTH, Stat.MEAN),
            out(M.RESPONSE_LENGTH, Stat.MAX),
            out(M.PROMPT_LENGTH, Stat.MEAN),
        ),
    ),
    _Spec("Throughput", "tokens/s", _fixed(out(M.SYSTEM_TPS))),
    _Spec("GPU memory, peak allocated", "GiB", _memory_gpu),
    _Spec("CPU memory, rss at phase end", "GiB", _memory_cpu),
)


def plan(run: Run) -> list[Panel]:
    """The catalog's panels for ``run`` (empty ``names``: not logged), then :func:`own_panels`."""
    panels = []
    for spec in SPECS:
        picked = spec.pick(run)
        panels.append(
            Panel(
                spec.title,
                spec.ylabel,
                tuple(n for n, _ in picked),
                tuple(label for _, label in picked),
                spec.trend,
            )
        )
    return panels + own_panels(run)


def own_names(run: Run) -> list[str]:
    """The names ``run`` logged that the catalog does not know, sorted."""
    return sorted(name for name in run.series if name not in M.CATALOG)


def own_panels(run: Run) -> list[Panel]:
    """Panels of the run's own names: one per first path segment (``my/...``), at most
    ``OWN_PER_PANEL`` curves each, at most ``MAX_OWN_PANELS`` in all."""
    groups: dict[str, list[str]] = {}
    for name in own_names(run):
        groups.setdefault(name.split("/")[0], []).append(name)
    panels = []
    for prefix, names in groups.items():
        for i in range(0, len(names), OWN_PER_PANEL):
            chunk = tuple(names[i : i + OWN_PER_PANEL])
            part = f" ({i // OWN_PER_PANEL + 1})" if len(names) > OWN_PER_PANEL else ""
            title = f"{prefix}/*{part}" if any("/" in n for n in chunk) else "own names"
            panels.append(Panel(title, "", chunk, chunk))
    return panels[:MAX_OWN_PANELS]


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


def draw_report(run: Run, path: str | Path, *, columns: int = 2) -> list[Panel]:
    """Draw ``run`` into the PNG ``path``; returns the panels drawn."""
    try:
        with needs_extra("report", "the report"):
            from matplotlib.backends.backend_agg import FigureCanvasAgg
            from matplotlib.figure import Figure
    except MissingExtra as exc:
        raise ReportError(str(exc)) from None
    everything = plan(run)
    panels = [p for p in everything if p.names]
    missing = [p.title for p in everything if not p.names]
    left = len(own_names(run)) - sum(len(p.names) for p in own_panels(run))
    if not panels:  # nothing to draw: one empty panel that says so
        panels = [Panel("nothing logged", "", (), ())]
    rows = -(-len(panels) // columns)
    fig = Figure(figsize=(6.0 * columns, 3.2 * rows), layout="constrained")
    FigureCanvasAgg(fig)
    partial = f", {run.partial} partial" if run.partial else ""
    span = f"steps {run.steps[0]}-{run.steps[-1]}" if run.steps else "no steps"
    notes = [f"not logged: {', '.join(missing)}"] if missing else []
    if left > 0:
        notes.append(f"{left} more names of the run's own not drawn")
    title = f"{run.name}: {len(run.steps)} steps ({span}{partial})"
    fig.suptitle("\n".join([title, *notes]), fontsize="medium")
    for index, panel in enumerate(panels):
        ax = fig.add_subplot(rows, columns, index + 1)
        ax.set_title(panel.title)
        ax.set_xlabel("step")
        ax.set_ylabel(panel.ylabel)
        ax.grid(True, alpha=0.3)
        if not panel.names:
            ax.text(
                0.5,
                0.5,
                "not logged",
                ha="center",
                va="center",
                transform=ax.transAxes,
                color="gray",
            )
            continue
        for name, label in zip(panel.names, panel.labels, strict=True):
            steps, values = run.curve(name)
            ax.plot(
                steps, values, label=label, linewidth=1.2, marker="." if len(steps) < 30 else None
            )
        if panel.trend:
            steps, values = run.curve(panel.names[0])
            window = max(1, len(values) // 10)
            if window > 1:
                ax.plot(
                    steps,
                    rolling_mean(values, window),
                    "k--",
                    linewidth=1.0,
                    label=f"{panel.labels[0]} ({window}-step mean)",
                )
        ax.legend(fontsize="small")
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, format="png", dpi=100)
    except OSError as exc:
        raise ReportError(f"cannot write {path}: {exc.strerror}") from None
    return panels
