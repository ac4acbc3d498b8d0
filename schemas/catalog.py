"""The metric catalog: every metric rlpulse knows, with unit, help, reduction and outputs.

An :class:`Entry` is one metric as it is *logged* (``critic/advantages``); its outputs are the
names it is *reported* under (``critic/advantages/mean``, ``.../max``, ``.../min``). A
:class:`Template` is a family whose name has parameters (``time/{cluster}/{phase}/total``).

:meth:`Catalog.resolve` maps any logged name to what merges and reports it:

* an entry's own name: its reduction and all its outputs;
* one of its output names (``critic/score/max``, as frameworks that pre-reduce log it): that
  statistic alone, merged by the statistic's own reduction (a max merges by max);
* a name matching a template: the template instantiated;
* anything else: a weighted mean reported under the name itself, unless the producer
  declared another reduction.

**Who decides.** The catalog is read on three sides of a value's way: the producer, to
encode the reduction it sends with each name; the collector, to merge the name and name its
outputs; the Prometheus sink, for the unit, type and help of each name reported. The
*collector's* catalog decides (:meth:`Catalog.resolve` there, then
:meth:`Resolved.accepts` for what each producer sent): for a name in it, its reduction and
outputs, whatever the producer sent (a disagreement, as between two rlpulse versions, is
counted as ``kind_mismatch`` and warned); for a name outside it, the reduction the producer
declared (``Producer(reductions=...)``), which the name table carries. The producer's lookup
only chooses what to send, and the Prometheus sink only describes what the collector
reported: neither overrides a merge.

>>> from rlpulse.schemas.metrics import CATALOG
>>> r = CATALOG.resolve("critic/score")
>>> r.reduction.name, sorted(r.outputs.values())
('MEAN', ['critic/score/max', 'critic/score/mean', 'critic/score/min'])
"""

from __future__ import annotations

import re
import string
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field

from rlpulse.schemas.reductions import DEFAULT_STAT, STAT_REDUCTION, Reduction, Stat

_SEGMENT = r"[A-Za-z0-9_.\-]+"


@dataclass(frozen=True)
class Resolved:
    """How one logged name merges and which names it reports under."""

    name: str
    reduction: Reduction
    outputs: Mapping[Stat, str]
    unit: str = ""
    help: str = ""
    known: bool = False
    derived: bool = False
    cumulative: bool = False

    def accepts(self, sent: Reduction) -> bool:
        """Whether a producer that sent this name as ``sent`` agrees with how it merges
        (see "Who decides" above); where not, the collector merges it as resolved here. A
        distribution's row travels as a pooled mean, so ``MEAN`` agrees with ``DIST``.

        >>> from rlpulse.schemas.metrics import CATALOG
        >>> CATALOG.resolve("actor/pg_clipfrac").accepts(Reduction.MAX)
        False
        """
        return self.reduction is sent or (
            sent is Reduction.MEAN and self.reduction is Reduction.DIST
        )


@dataclass(frozen=True)
class Entry:
    """One metric with a fixed name.

    ``outputs`` lists the statistics reported, each under ``output_format`` with ``{name}`` and
    ``{stat}`` filled in; left empty, the reduction's one statistic is reported under ``name``. ``derived`` metrics are computed by the collector and never logged;
    ``cumulative`` ones only grow over a run (Prometheus counters).
    """

    name: str
    reduction: Reduction
    unit: str
    help: str
    outputs: tuple[Stat, ...] = ()
    output_format: str = "{name}/{stat}"
    derived: bool = False
    cumulative: bool = False

    def output_names(self) -> dict[Stat, str]:
        """Reported names by statistic. Without ``outputs`` the metric reports its reduction's
        statistic under its own name; with them, each listed statistic under ``output_format``."""
        if not self.outputs:
            return {DEFAULT_STAT[self.reduction]: self.name}
        return {s: self.output_format.format(name=self.name, stat=s.value) for s in self.outputs}

    def resolved(self) -> Resolved:
        return Resolved(
            self.name,
            self.reduction,
            self.output_names(),
            self.unit,
            self.help,
            known=True,
            derived=self.derived,
            cumulative=self.cumulative,
        )


@dataclass(frozen=True)
class Template:
    """A family of metrics whose names have parameters.

    ``choices`` restricts a parameter to listed values; other parameters match one name
    segment. ``format(**params)`` spells a concrete name, so code never writes one by hand.

    >>> t = Template("time/{cluster}/{phase}/{part}", Reduction.MAX, "s", "phase time",
    ...              choices={"part": ("total", "execute")})
    >>> t.format(cluster="actor_train", phase="train_step", part="total")
    'time/actor_train/train_step/total'
    >>> t.match("time/actor_train/train_step/total") is not None
    True
    """

    pattern: str
    reduction: Reduction
    unit: str
    help: str
    choices: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    units: Mapping[str, str] = field(default_factory=dict)
    """Per-parameter-value unit overrides: ``{"stat=max_allocated_frac": "ratio"}``."""
    derived: bool = False
    """Computed by the collector, never logged (as for an :class:`Entry`)."""

    def __post_init__(self) -> None:
        regex = ""
        for literal, param, _, _ in string.Formatter().parse(self.pattern):
            regex += re.escape(literal)
            if param is None:
                continue
            options = self.choices.get(param)
            body = "|".join(re.escape(o) for o in options) if options else _SEGMENT
            regex += f"(?P<{param}>{body})"
        object.__setattr__(self, "_regex", re.compile(regex + r"\Z"))

    @property
    def params(self) -> tuple[str, ...]:
        return tuple(p for _, p, _, _ in string.Formatter().parse(self.pattern) if p)

    def format(self, **params: str | int) -> str:
        """The concrete name; raises ValueError if a parameter is missing or not allowed."""
        missing = set(self.params) - set(params)
        if missing:
            raise ValueError(f"{self.pattern}: missing parameters {sorted(missing)}")
        name = self.pattern.format(**params)
        if self.match(name) is None:
            raise ValueError(f"{name!r} does not fit {self.pattern} (parameters {params})")
        return name

    def match(self, name: str) -> dict[str, str] | None:
        m = self._regex.match(name)  # type: ignore[attr-defined]
        return m.groupdict() if m else None

    def unit_for(self, params: Mapping[str, str]) -> str:
        for key, value in params.items():
            unit = self.units.get(f"{key}={value}")
            if unit:
                return unit
        return self.unit

    def examples(self) -> Iterator[str]:
        """One concrete name per combination of the restricted parameters (others as 'x')."""
        names = self.params
        combos: list[dict[str, str]] = [{}]
        for p in names:
            combos = [{**c, p: v} for c in combos for v in self.choices.get(p, ("x",))]
        for combo in combos:
            yield self.pattern.format(**combo)


def family(name: str, unit: str, help: str, fmt: str = "{name}/{stat}") -> Entry:
    """A pooled mean reported with its global max and min (``critic/advantages/mean``...).

    >>> sorted(family("a/b", "1", "x").output_names().values())
    ['a/b/max', 'a/b/mean', 'a/b/min']
    """
    return Entry(
        name,
        Reduction.MEAN,
        unit,
        help,
        outputs=(Stat.MEAN, Stat.MAX, Stat.MIN),
        output_format=fmt,
    )


class Catalog:
    """Entries and templates, looked up by any logged name. Lookups are cached."""

    def __init__(self, entries: Iterable[Entry], templates: Iterable[Template] = ()) -> None:
        self.entries: dict[str, Entry] = {}
        self._outputs: dict[str, tuple[Entry, Stat]] = {}
        for entry in entries:
            if entry.name in self.entries:
                raise ValueError(f"catalog entry {entry.name!r} is defined twice")
            self.entries[entry.name] = entry
            for stat, out in entry.output_names().items():
                if out != entry.name:
                    self._outputs[out] = (entry, stat)
        self.templates: tuple[Template, ...] = tuple(templates)
        self._cache: dict[str, Resolved] = {}

    def __contains__(self, name: str) -> bool:
        return self.resolve(name).known

    def resolve(self, name: str, declared: Reduction | None = None) -> Resolved:
        """What ``name`` merges by and reports as (see the module docstring).

        ``declared`` is the producer's reduction for names outside the catalog; the catalog's
        own declaration always wins for names inside it.
        """
        cached = self._cache.get(name)
        if cached is not None and (declared is None or cached.known):
            return cached
        resolved = self._lookup(name)
        if resolved is None:
            red = declared if declared is not None else Reduction.MEAN
            resolved = Resolved(name, red, {DEFAULT_STAT[red]: name})
            if declared is not None:
                return resolved
        if len(self._cache) < 100_000:
            self._cache[name] = resolved
        return resolved

    def _lookup(self, name: str) -> Resolved | None:
        entry = self.entries.get(name)
        if entry is not None:
            return entry.resolved()
        hit = self._outputs.get(name)
        if hit is not None:
            entry, stat = hit
            return Resolved(
                name,
                STAT_REDUCTION[stat],
                {stat: name},
                entry.unit,
                entry.help,
                known=True,
                derived=entry.derived,
            )
        for template in self.templates:
            params = template.match(name)
            if params is not None:
                red = template.reduction
                return Resolved(
                    name,
                    red,
                    {DEFAULT_STAT[red]: name},
                    template.unit_for(params),
                    template.help,
                    known=True,
                    derived=template.derived,
                )
        return None

    def output_names(self) -> Iterator[str]:
        """Every reported name of the fixed entries, and one example per template combination."""
        for entry in self.entries.values():
            yield from entry.output_names().values()
        for template in self.templates:
            yield from template.examples()
