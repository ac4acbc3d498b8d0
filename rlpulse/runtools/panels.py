"""What ``rlpulse report`` draws for a run: its panels, each a list of lines (a reported name,
its label and colour), and what the run logged that no panel draws.

A panel draws quantities (:mod:`rlpulse.runtools.quantities`), each under every name it is
logged as, so a run of the demo trainer, of verl or of TRL gets the same titles; names with
parameters (phases, memory by device, stragglers) come from the catalog's templates
(``rlpulse.schemas.topology``). A panel whose names the run never logged is left out. Names
nothing here knows (a job's own, ``my/reward_bonus``) get panels of their own, grouped by
their first path segment. :class:`Plan` counts the names logged and not drawn, and the
histogram bucket counts behind the quantiles drawn, so nothing logged goes unmentioned.
:mod:`rlpulse.runtools.report` draws a plan with matplotlib.

>>> from rlpulse.runtools.runs import Run
>>> run = Run("r", steps=(0, 1), series={"system/tps": ((1, 9.0),), "reward": ((1, 0.5),)})
>>> [(p.title, p.names) for p in plan(run).panels]
[('Score and reward', ('reward',)), ('Throughput', ('system/tps',))]
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from rlpulse.runtools import quantities as Q
from rlpulse.runtools.quantities import Quantity
from rlpulse.runtools.runs import Run
from rlpulse.runtools.samples import RunSamples, steps_text
from rlpulse.schemas import metrics as M


@dataclass(frozen=True)
class Line:
    """One curve: the reported name, its legend label and its colour (matplotlib's)."""

    name: str
    label: str
    color: str


@dataclass(frozen=True)
class Panel:
    """One subplot: its title, y label and lines. ``trend``: also a rolling mean of the first
    line; ``zero``: the y axis starts at 0 (a count, a time, a size); ``legend_title``: the
    part of the names every label leaves out."""

    title: str
    ylabel: str
    lines: tuple[Line, ...]
    trend: bool = False
    zero: bool = False
    legend_title: str = ""

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(line.name for line in self.lines)

    @property
    def labels(self) -> tuple[str, ...]:
        return tuple(line.label for line in self.lines)


@dataclass(frozen=True)
class Plan:
    """The figure of a run: the panels drawn, the names logged but not drawn, how many
    histogram bucket counts stand behind the quantiles drawn, and where the samples are."""

    panels: tuple[Panel, ...]
    logged: int
    not_drawn: tuple[str, ...]
    buckets: int = 0
    samples_note: str = ""

    def header(self, run: Run, width: int = 160) -> list[str]:
        """The lines above the panels."""
        partial = f", {run.partial} partial" if run.partial else ""
        span = f"steps {run.steps[0]}-{run.steps[-1]}" if run.steps else "no steps"
        lines = [f"{run.name}: {len(run.steps)} steps ({span}{partial})"]
        drawn = self.logged - len(self.not_drawn) - self.buckets
        counts = f"{self.logged} names logged: {drawn} drawn"
        if self.buckets:
            counts += f", {self.buckets} histogram bucket counts drawn as their quantiles"
        if self.not_drawn:
            listed = _clip(", ".join(self.not_drawn), width - 60)
            counts += f"; logged, not drawn: {len(self.not_drawn)} names ({listed})"
        lines.append(counts)
        if self.samples_note:
            lines.append(self.samples_note)
        return lines


def _clip(text: str, width: int) -> str:
    """``text`` cut to ``width`` characters at a comma, with how to see the rest."""
    if len(text) <= width:
        return text
    cut = text[:width].rsplit(", ", 1)[0]
    return f"{cut}, ...; rlpulse report prints them all"


MAX_LINES = 10
"""Curves in one panel at most (matplotlib's ten distinct colours); more are split over
panels titled ``(1/2)``, ``(2/2)``."""
OWN_PER_PANEL = 6
"""Curves in a panel of the run's own names."""
MAX_OWN_PANELS = 12
"""Panels of the run's own names at most; the names beyond are counted as not drawn."""

Picked = list[tuple[str, str]]
"""(reported name, legend label) pairs of one panel."""


@dataclass(frozen=True)
class _Spec:
    title: str
    ylabel: str
    pick: Callable[[Run], Picked]
    trend: bool = False
    zero: bool = False
    quantities: tuple[Quantity, ...] = ()


def _of(*quantities: Quantity) -> Callable[[Run], Picked]:
    def pick(run: Run) -> Picked:
        names = dict.fromkeys(n for q in quantities for n in q.logged(run))
        return [(n, n) for n in names]

    return pick


def spec(
    title: str, ylabel: str, *quantities: Quantity, trend: bool = False, zero: bool = False
) -> _Spec:
    """A panel drawing every name of ``quantities`` a run logged (legend: the names)."""
    return _Spec(title, ylabel, _of(*quantities), trend, zero, quantities)


def _templated(
    match: Callable[[str], dict[str, str] | None], label: Callable[[dict[str, str]], str | None]
) -> Callable[[Run], Picked]:
    """Names of a catalog template: ``label(params)`` for each match, None to leave it out."""

    def pick(run: Run) -> Picked:
        picked = []
        for name in sorted(run.series):
            params = match(name)
            text = label(params) if params is not None else None
            if text is not None and run.has(name):
                picked.append((name, text))
        return picked

    return pick


def _and(*picks: Callable[[Run], Picked]) -> Callable[[Run], Picked]:
    return lambda run: [p for pick in picks for p in pick(run)]


def _phase(p: dict[str, str]) -> str | None:
    return f"{p['cluster']}/{p['phase']}" if p["part"] == "total" else None


def _gpu_peak(p: dict[str, str]) -> str | None:
    """Peak allocated GPU memory during each phase, by worker group, phase and device."""
    wanted = ("end", "onload", "max_allocated")
    if (p["when"], p["state"], p["stat"]) != wanted:
        return None
    return f"{p['cluster']}/{p['phase']} gpu{p['device_id']}"


def _cpu_rss(p: dict[str, str]) -> str | None:
    """Resident memory of the worker process at the end of each phase."""
    return f"{p['cluster']}/{p['phase']} rss" if (p["when"], p["kind"]) == ("end", "rss") else None


def _lag(p: dict[str, str]) -> str | None:
    return f"{p['cluster']}/{p['phase']}" if p["stat"] == "lag" else None


ENGINE = "Rollout engine: "
HEALTH = "Rollout health: "
SPECS: tuple[_Spec, ...] = (
    spec("Score and reward", "score", Q.TRAIN_SCORE, Q.TRAIN_REWARD, Q.VAL_SCORE, trend=True),
    spec("Accuracy", "fraction", Q.ACCURACY, zero=True),
    spec("Policy loss", "loss", Q.POLICY_LOSS, Q.WEIGHTED_PG_LOSS, Q.TOTAL_LOSS, Q.ENTROPY_LOSS),
    spec("Value loss", "loss", Q.VALUE_LOSS, Q.VALUE_ERROR),
    spec("KL to the reference", "nats", Q.REF_KL, Q.KL_LOSS),
    spec("KL to the old policy", "nats", Q.POLICY_KL),
    spec("Entropy", "nats per token", Q.ENTROPY),
    spec(
        "Clip fraction",
        "fraction",
        Q.POLICY_CLIPFRAC,
        Q.RATIO_CLIPFRAC,
        Q.VALUE_CLIPFRAC,
        zero=True,
    ),
    spec("Lengths", "tokens", Q.RESPONSE_LENGTH, Q.PROMPT_LENGTH, zero=True),
    spec("Advantages, returns and values", "", Q.ADVANTAGES),
    spec(HEALTH + "rollout minus trainer log-prob", "nats", Q.LOGPROB_DIFF),
    spec(HEALTH + "rollout minus trainer probability", "probability", Q.PROBS_DIFF, zero=True),
    spec(HEALTH + "trainer over rollout probability", "ratio", Q.PROB_RATIO),
    spec(HEALTH + "staleness", "steps", Q.STALENESS, zero=True),
    spec(ENGINE + "tokens", "tokens per step", Q.ENGINE_TOKENS, zero=True),
    spec(ENGINE + "KV cache", "fraction", Q.ENGINE_CACHE, zero=True),
    spec(ENGINE + "requests", "requests", Q.ENGINE_REQUESTS, zero=True),
    spec(ENGINE + "time to first token", "s", Q.ENGINE_TTFT, zero=True),
    spec(ENGINE + "end-to-end latency", "s", Q.ENGINE_E2E, zero=True),
    spec(ENGINE + "inter-token latency", "s", Q.ENGINE_ITL, zero=True),
    spec(ENGINE + "queue time", "s", Q.ENGINE_QUEUE, zero=True),
    spec("Throughput", "tokens/s", Q.THROUGHPUT, zero=True),
    _Spec("Phase time, slowest rank", "s", _templated(M.TIME_PHASE.match, _phase), zero=True),
    _Spec(
        "Phase GPU time, slowest rank", "s", _templated(M.TIME_PHASE_GPU.match, _phase), zero=True
    ),
    spec("Driver stages", "s", Q.DRIVER_STAGES, zero=True),
    _Spec(
        "Stragglers: slowest rank's lag behind the median",
        "s",
        _templated(M.STRAGGLER.match, _lag),
        zero=True,
    ),
    _Spec(
        "GPU memory, peak allocated",
        "GiB",
        _and(_templated(M.MEMORY_GPU.match, _gpu_peak), _of(Q.GPU_MEMORY)),
        zero=True,
        quantities=(Q.GPU_MEMORY,),
    ),
    _Spec(
        "CPU memory",
        "GiB",
        _and(_templated(M.MEMORY_CPU.match, _cpu_rss), _of(Q.CPU_MEMORY)),
        zero=True,
        quantities=(Q.CPU_MEMORY,),
    ),
    spec("Samples logged", "rows", Q.SAMPLES, zero=True),
    spec("Learning rate", "", Q.LEARNING_RATE),
    spec("Gradient norm", "", Q.GRAD_NORM, zero=True),
    spec("KL coefficient", "", Q.KL_COEF, zero=True),
    spec("Validation diversity", "fraction", Q.DIVERSITY, zero=True),
    spec("SFT loss", "nats", Q.SFT_LOSS),
)
KNOWN: tuple[Quantity, ...] = tuple(q for s in SPECS for q in s.quantities)
"""Every quantity a panel draws: their names are not the run's own."""


def _common_prefix(names: Sequence[str]) -> str:
    """The ``/``-ended start all ``names`` share ("" for fewer than two names).

    >>> _common_prefix(["a/b/p50", "a/b/p99"]), _common_prefix(["a/x", "b/y"])
    ('a/b/', '')
    """
    if len(names) < 2:
        return ""
    first, last = min(names), max(names)
    i = 0
    while i < min(len(first), len(last)) and first[i] == last[i]:
        i += 1
    return first[:i].rsplit("/", 1)[0] + "/" if "/" in first[:i] else ""


def _panels(title: str, ylabel: str, picked: Picked, **kw: Any) -> list[Panel]:
    """``picked`` as panels of at most :data:`MAX_LINES` lines, each colour once a panel."""
    size = -(-len(picked) // -(-len(picked) // MAX_LINES))  # as even as can be: 11 -> 6 + 5
    chunks = [picked[i : i + size] for i in range(0, len(picked), size)]
    panels = []
    for index, chunk in enumerate(chunks):
        prefix = ""
        if all(name == label for name, label in chunk):
            prefix = _common_prefix([n for n, _ in chunk])
        lines = tuple(
            Line(name, label[len(prefix) :], f"C{i}") for i, (name, label) in enumerate(chunk)
        )
        part = f" ({index + 1}/{len(chunks)})" if len(chunks) > 1 else ""
        panels.append(Panel(title + part, ylabel, lines, legend_title=prefix, **kw))
    return panels


def own_names(run: Run) -> list[str]:
    """The names ``run`` logged that neither the catalog nor a panel's quantity knows, sorted."""
    return sorted(
        name
        for name in run.series
        if name not in M.CATALOG and not any(q.matches(name) for q in KNOWN)
    )


def own_panels(run: Run) -> list[Panel]:
    """Panels of the run's own names: one per first path segment (``my/...``), at most
    ``OWN_PER_PANEL`` curves each, at most ``MAX_OWN_PANELS`` in all."""
    groups: dict[str, list[str]] = {}
    for name in own_names(run):  # names without a "/" together, under ""
        groups.setdefault(name.split("/")[0] if "/" in name else "", []).append(name)
    panels = []
    for prefix, names in sorted(groups.items()):
        for i in range(0, len(names), OWN_PER_PANEL):
            chunk = names[i : i + OWN_PER_PANEL]
            part = f" ({i // OWN_PER_PANEL + 1})" if len(names) > OWN_PER_PANEL else ""
            title = (f"{prefix}/*" if prefix else "own names") + part
            lines = tuple(Line(n, n, f"C{j}") for j, n in enumerate(chunk))
            panels.append(Panel(title, "", lines))
    return panels[:MAX_OWN_PANELS]


def _buckets(run: Run, drawn: set[str]) -> set[str]:
    """The histogram bucket counts behind a quantile drawn (the quantiles are read off them)."""
    out: set[str] = set()
    for h in M.HISTOGRAMS:
        if any(e.name in drawn for e in h.quantile_entries.values()):
            out.update(n for n in run.series if h.buckets.match(n))
    return out


def samples_note(samples: RunSamples | None) -> str:
    """Where the run's sample rows are: which names, at which steps, and the command."""
    if samples is None or not samples.steps:
        return ""
    names = sorted({n for by_name in samples.steps.values() for n in by_name})
    last = max(samples.steps)
    return (
        f"samples ({', '.join(names)}) at steps {steps_text(list(samples.steps))}: "
        f"rlpulse samples {samples.source} --step {last}"
    )


def plan(run: Run, samples: RunSamples | None = None) -> Plan:
    """The panels of ``run`` that have data (the catalog's and the quantities', then
    :func:`own_panels`), and the names logged that none draws."""
    panels: list[Panel] = []
    for s in SPECS:
        picked = s.pick(run)
        if picked:
            panels += _panels(s.title, s.ylabel, picked, trend=s.trend, zero=s.zero)
    panels += own_panels(run)
    drawn = {n for p in panels for n in p.names}
    logged = [n for n in run.series if run.has(n)]
    buckets = _buckets(run, drawn)
    not_drawn = tuple(sorted(n for n in logged if n not in drawn and n not in buckets))
    return Plan(tuple(panels), len(logged), not_drawn, len(buckets), samples_note(samples))
