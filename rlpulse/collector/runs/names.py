"""A run's name table: one row per name its producers log, resolved once, and how each
producer's name table maps onto the rows.

A row is added when a name is first seen in the run, and resolved then, once: the producer's
reduction code comes with the name (its table), and the collector's catalog is consulted to
name the row's outputs and to find a disagreement. **Who wins**: for a name in the catalog,
the catalog's reduction (as a collector of another rlpulse version would have it merged);
for a name outside it, the reduction the producer sent. A disagreement is counted
(``kind_mismatch``, on /metrics) and warned once per name. Later tables that carry a known
name only compare the code they send with the row's: nothing is looked up per value.

Each producer table is translated to row indices once (:class:`Layout`, cached), and each
set of touched rows to how a step reads (:class:`ReadPlan`, cached).

>>> from rlpulse.schemas.metrics import CATALOG
>>> names = NameTable("r", catalog=CATALOG, health=Health(), max_names=8)
>>> names.layout(Table.shared(("actor/loss",), bytes([int(Reduction.MEAN)]))).size
1
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from rlpulse.collector.health import Health
from rlpulse.collector.ratelog import RateLimitedLog
from rlpulse.schemas.catalog import Catalog, Resolved
from rlpulse.schemas.messages import Table
from rlpulse.schemas.reductions import QUANTILE_STATS, Reduction, Stat
from rlpulse.schemas.values import READ

log = logging.getLogger("rlpulse.collector")
MAX_LAYOUTS = 4096
"""Name tables (and read plans) cached per run."""


@dataclass
class Layout:
    """Cached translation of one name table to row indices of a run."""

    idx: np.ndarray | slice
    """Row indices; a slice when they are consecutive (the usual case: a producer's names
    enter the table together), so merging works on views instead of fancy-index copies."""
    keep: np.ndarray | None
    last: np.ndarray
    touches_last: bool
    size: int
    """Names in the table (rows in each entry's values)."""
    last_all: np.ndarray
    """``LAST`` metrics among all the table's rows (``last`` is over the kept ones)."""
    dropped: int = 0
    """Names of the table left out (beyond ``max_names_per_run``, or derived)."""


class ReadPlan(NamedTuple):
    """How a step with a given set of touched rows reads: each output's name, row (among the
    touched ones) and statistic (a row of ``read_matrix``), and the distributions' quantiles
    (read off their sketches)."""

    names: tuple[str, ...]
    rows: np.ndarray
    stats: np.ndarray
    quantiles: tuple[tuple[str, int, Stat], ...]


class NameTable:
    """One run's names: rows, their resolution, and the cached layouts and read plans."""

    def __init__(self, run: str, *, catalog: Catalog, health: Health, max_names: int) -> None:
        self.run = run
        self.catalog = catalog
        self.health = health
        self.max_names = max_names
        self.names: list[str] = []
        self.index: dict[str, int] = {}
        self.resolved: list[Resolved] = []
        self.sent: list[int] = []
        """Per row, the reduction code of the table that added it (what producers send)."""
        self.agrees: list[bool] = []
        """Per row, whether that code agrees with how the row merges."""
        self.layouts: dict[Table, Layout] = {}
        self.full = False
        """Some name table of this run had names left out (:attr:`Layout.dropped`)."""
        self._read_plans: dict[bytes, ReadPlan] = {}
        self._ratelog = RateLimitedLog(log)

    def __len__(self) -> int:
        return len(self.names)

    def _row_of(self, name: str, code: int) -> int | None:
        """The row of ``name``, added (and resolved) on first sight; None when it is dropped
        (counted)."""
        j = self.index.get(name)
        if j is None:
            return self._add(name, code)
        if code != self.sent[j] or not self.agrees[j]:  # known to agree otherwise
            self._check(j, Reduction(code))
        return j

    def _add(self, name: str, code: int) -> int | None:
        sent = Reduction(code)
        resolved = self.catalog.resolve(name, sent)  # the one lookup of this row
        if resolved.derived:
            self.health.derived_logged += 1
            self._ratelog.warn(
                f"derived:{name}",
                f"{name} is computed by the collector; producers must not log it (dropped)",
            )
            return None
        if len(self.names) >= self.max_names:
            self.health.names_overflow += 1
            self._ratelog.warn(
                f"names:{self.run}",
                f"run {self.run!r} has {self.max_names} distinct names; dropping new name {name!r}",
            )
            return None
        j = len(self.names)
        self.index[name] = j
        self.names.append(name)
        self.resolved.append(resolved)
        self.sent.append(code)
        self.agrees.append(self._check(j, sent))
        return j

    def _check(self, j: int, sent: Reduction) -> bool:
        """Whether ``sent`` agrees with how row ``j`` merges; if not, counted and warned (the
        row wins)."""
        resolved = self.resolved[j]
        if resolved.accepts(sent):
            return True
        name = self.names[j]
        self.health.kind_mismatch += 1
        self._ratelog.warn(
            f"kind:{name}",
            f"{name}: producer sent reduction {sent.name}, the collector's catalog "
            f"says {resolved.reduction.name}; the catalog wins (counted in "
            "rlpulse_collector_kind_mismatch_total)",
        )
        return False

    def layout(self, table: Table) -> Layout:
        """How ``table``'s rows map onto this run's (cached per table)."""
        layout = self.layouts.get(table)
        if layout is not None:
            return layout
        rows = [
            self._row_of(name, kind) for name, kind in zip(table.names, table.kinds, strict=True)
        ]
        keep = np.array([j is not None for j in rows], dtype=bool)
        idx = np.array([j for j in rows if j is not None], dtype=np.int64)
        last = np.array([self.resolved[j].reduction is Reduction.LAST for j in idx], dtype=bool)
        consecutive = len(idx) > 0 and bool((np.diff(idx) == 1).all())
        where: np.ndarray | slice = slice(int(idx[0]), int(idx[-1]) + 1) if consecutive else idx
        last_all = np.array(
            [j is not None and self.resolved[j].reduction is Reduction.LAST for j in rows],
            dtype=bool,
        )
        dropped = int(table.size - keep.sum())
        layout = Layout(
            where,
            None if dropped == 0 else keep,
            last,
            bool(last.any()),
            table.size,
            last_all,
            dropped,
        )
        self.full |= dropped > 0
        if len(self.layouts) < MAX_LAYOUTS:
            self.layouts[table] = layout
        return layout

    def dist_row(self, name: str) -> int | None:
        """The row of ``name`` when it is a distribution metric here (its sketch merges)."""
        j = self.index.get(name)
        if j is not None and self.resolved[j].reduction is Reduction.DIST:
            return j
        return None

    def read_plan(self, touched: np.ndarray) -> ReadPlan:
        """How a step whose touched rows are ``touched`` reads (cached: a run's steps mostly
        touch the same rows)."""
        key = touched.tobytes()
        plan = self._read_plans.get(key)
        if plan is not None:
            return plan
        names, rows, stats, quantiles = [], [], [], []
        for i, j in enumerate(touched.tolist()):
            resolved = self.resolved[j]
            dist = resolved.reduction is Reduction.DIST
            for stat, out in resolved.outputs.items():
                if dist and stat in QUANTILE_STATS:
                    quantiles.append((out, i, stat))
                else:
                    names.append(out)
                    rows.append(i)
                    # a quantile logged on its own merges by max and reads the max
                    stats.append(READ.index(stat) if stat in READ else READ.index(Stat.MAX))
        plan = ReadPlan(
            tuple(names),
            np.array(rows, dtype=np.intp),
            np.array(stats, dtype=np.intp),
            tuple(quantiles),
        )
        if len(self._read_plans) >= MAX_LAYOUTS:
            self._read_plans.clear()
        self._read_plans[key] = plan
        return plan
