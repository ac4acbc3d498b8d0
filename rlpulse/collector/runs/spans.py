"""Spans from the entries a collector receives from its own ranks (``rlpulse.schemas.spans``).

An entry whose table has a phase's ``time/{cluster}/{phase}/total`` is the end of that phase
on that rank: :class:`SpanReader` reads it into a :class:`~rlpulse.schemas.spans.Span` with the
phase's ``execute`` and GPU ``total`` when the table has them. Which columns those are is
worked out once per name table (tables are shared and compared by identity), so an entry of
any other table costs one dictionary lookup.
"""

from __future__ import annotations

import math

import numpy as np

from rlpulse.schemas.messages import ROW_BYTES, Table
from rlpulse.schemas.spans import Span
from rlpulse.schemas.topology import TIME_PHASE, TIME_PHASE_GPU

MAX_TABLES = 4096
"""Tables whose phase columns are remembered (more: the memo starts over)."""


class _Columns:
    """One table's phases: per ``(cluster, phase)`` the row of total, execute, GPU total."""

    __slots__ = ("phases",)

    def __init__(self, table: Table) -> None:
        found: dict[tuple[str, str], list[int]] = {}
        for i, name in enumerate(table.names):
            host = TIME_PHASE.match(name)
            gpu = None if host else TIME_PHASE_GPU.match(name)
            params = host or gpu
            if params is None:
                continue
            part = params["part"]
            if part not in ("total", "execute") or (gpu and part != "total"):
                continue
            cols = found.setdefault((params["cluster"], params["phase"]), [-1, -1, -1])
            cols[2 if gpu else 0 if part == "total" else 1] = i
        self.phases = tuple(
            (cluster, phase, total, execute, gpu)
            for (cluster, phase), (total, execute, gpu) in found.items()
            if total >= 0
        )


class SpanReader:
    """Reads phase spans out of entries (``read``); one per collector."""

    def __init__(self) -> None:
        self._columns: dict[Table, _Columns] = {}

    def read(
        self, role: str, rank: int, host: str, t: float, table: Table, values: bytes
    ) -> list[Span]:
        """The spans one entry (logged at ``t``) holds: usually none, one for a phase's end."""
        cols = self._columns.get(table)
        if cols is None:
            if len(self._columns) >= MAX_TABLES:
                self._columns.clear()
            cols = self._columns[table] = _Columns(table)
        if not cols.phases or len(values) != table.nbytes:
            return []
        rows = np.frombuffer(values, dtype="<f8").reshape(-1, ROW_BYTES // 8)
        out = []
        for cluster, phase, total, execute, gpu in cols.phases:
            seconds = _value(rows, total)
            if seconds is None or not math.isfinite(seconds) or seconds < 0:
                continue
            out.append(
                Span(
                    role,
                    rank,
                    host,
                    cluster,
                    phase,
                    t - seconds,
                    t,
                    _value(rows, execute),
                    _value(rows, gpu),
                )
            )
        return out


def _value(rows: np.ndarray, i: int) -> float | None:
    """A column's logged value (a phase time is one sample: the row's max), None if absent."""
    if i < 0 or rows[i, 1] <= 0:
        return None
    return float(rows[i, 3])
