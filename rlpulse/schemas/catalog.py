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
        self._near_index: _NearIndex | None = None
        """The fixed names (entries and their outputs) for :meth:`near_miss`, built on its
        first use."""

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

    def near_miss(self, name: str) -> str | None:
        """The catalog name ``name`` is most likely a misspelling of, or None.

        The rule: a name the catalog does not know (:meth:`resolve`) that is within
        :func:`near_edits` single-character edits (insert, delete or replace) of an entry's
        name or one of its output names: one edit for names under 10 characters, two from
        10 on. Template instances are not compared (their parameters vary by design).

        >>> from rlpulse.schemas.metrics import CATALOG
        >>> CATALOG.near_miss("actor/pg_los"), CATALOG.near_miss("my/own_metric")
        ('actor/pg_loss', None)
        """
        if self.resolve(name).known:
            return None
        most = near_edits(name)
        index = self._near_index
        if index is None:
            index = self._near_index = _near_index({*self.entries, *self._outputs})
        best: tuple[int, str] | None = None
        by_length = index[most]
        for length in range(len(name) - most, len(name) + most + 1):
            for known, first, second, third in by_length.get(length, ()):
                # ``most`` edits leave one of ``most + 1`` chunks of ``known`` intact (with
                # one edit, ``third`` is empty, found in any name: ``first`` and ``second``
                # then decide alone).
                if not (first in name or second in name or (most == 2 and third in name)):
                    continue
                d = _edits_within(name, known, most)
                if d is not None and (best is None or (d, known) < best):
                    best = (d, known)
        return None if best is None else best[1]

    def output_names(self) -> Iterator[str]:
        """Every reported name of the fixed entries, and one example per template combination."""
        for entry in self.entries.values():
            yield from entry.output_names().values()
        for template in self.templates:
            yield from template.examples()


_NearIndex = dict[int, dict[int, list[tuple[str, str, str, str]]]]
"""Edits allowed -> name length -> (name, its ``edits + 1`` chunks, padded with "")."""


def _near_index(names: Iterable[str]) -> _NearIndex:
    """``names`` by length, each with its chunks for one and for two edits: a name within
    ``k`` edits of another holds one of its ``k + 1`` disjoint chunks unchanged, so a name
    holding none of them is passed over at the cost of a substring search or three."""
    index: _NearIndex = {1: {}, 2: {}}
    for name in names:
        for most, by_length in index.items():
            cut = [len(name) * i // (most + 1) for i in range(most + 2)]
            chunks = [name[cut[i] : cut[i + 1]] for i in range(most + 1)] + [""]
            by_length.setdefault(len(name), []).append((name, chunks[0], chunks[1], chunks[2]))
    return index


def near_edits(name: str) -> int:
    """How many edits away from a catalog name ``name`` counts as a near miss
    (:meth:`Catalog.near_miss`): one under 10 characters, two from 10 on."""
    return 1 if len(name) < 10 else 2


def _edits_within(a: str, b: str, most: int) -> int | None:
    """The edit (Levenshtein) distance of ``a`` and ``b`` if at most ``most``, else None: the
    dynamic programme over the band ``|i - j| <= most`` only, ending as soon as a whole row
    is past ``most``."""
    if abs(len(a) - len(b)) > most:
        return None
    far = most + 1
    prev = [j if j <= most else far for j in range(len(b) + 1)]
    for i in range(1, len(a) + 1):
        row = [far] * (len(b) + 1)
        if i <= most:
            row[0] = i
        ca = a[i - 1]
        for j in range(max(1, i - most), min(len(b), i + most) + 1):
            cost = prev[j - 1] + (ca != b[j - 1])
            cost = min(cost, prev[j] + 1, row[j - 1] + 1)
            row[j] = cost if cost <= most else far
        if min(row) > most:
            return None
        prev = row
    d = prev[len(b)]
    return d if d <= most else None
