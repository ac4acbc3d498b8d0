"""Spans from the entries a collector receives from its own ranks (``rlpulse.schemas.spans``).

An entry whose table has a phase's ``time/{cluster}/{phase}/total`` is the end of that phase
on that rank: :class:`SpanReader` reads it into a :class:`~rlpulse.schemas.spans.Span` with the
phase's ``execute``, ``onload``, ``offload`` and GPU ``total`` when the table has them, and, for
a phase that logged ``rollout/response/longest`` with it (``Phase.add``), that value. Which
columns those are is worked out once per name table (tables are shared and compared by
identity), so an entry of any other table costs one dictionary lookup.
"""

from __future__ import annotations

import math

import numpy as np

from rlpulse.schemas.messages import ROW_BYTES, Table
from rlpulse.schemas.rollout import ROLLOUT_RESPONSE_LONGEST
from rlpulse.schemas.spans import Span
from rlpulse.schemas.topology import TIME_PHASE, TIME_PHASE_GPU

MAX_TABLES = 4096
"""Tables whose phase columns are remembered (more: the memo starts over)."""


_PARTS = {"total": 0, "execute": 1, "onload": 2, "offload": 3}
"""A phase's host parts: their place in a phase's columns (the GPU total comes after)."""
_LONGEST = ROLLOUT_RESPONSE_LONGEST.name


class _Columns:
    """One table's phases: per ``(cluster, phase)`` the rows of total, execute, onload,
    offload and GPU total (-1: absent), and the row of ``rollout/response/longest``."""

    __slots__ = ("longest", "phases")

    def __init__(self, table: Table) -> None:
        found: dict[tuple[str, str], list[int]] = {}
        self.longest = -1
        for i, name in enumerate(table.names):
            if name == _LONGEST:
                self.longest = i
                continue
            host = TIME_PHASE.match(name)
            gpu = None if host else TIME_PHASE_GPU.match(name)
            params = host or gpu
            if params is None:
                continue
            part = params["part"]
            if gpu and part != "total":
                continue
            cols = found.setdefault((params["cluster"], params["phase"]), [-1] * 5)
            cols[4 if gpu else _PARTS[part]] = i
        self.phases: tuple[tuple[str, str, int, int, int, int, int], ...] = tuple(
            (cluster, phase, cols[0], cols[1], cols[2], cols[3], cols[4])
            for (cluster, phase), cols in found.items()
            if cols[0] >= 0
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
        longest = _value(rows, cols.longest) if len(cols.phases) == 1 else None
        out = []
        for cluster, phase, total, execute, onload, offload, gpu in cols.phases:
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
                    _value(rows, onload),
                    _value(rows, offload),
                    longest,
                )
            )
        return out


def _value(rows: np.ndarray, i: int) -> float | None:
    """A column's logged value (a phase time is one sample: the row's max), None if absent."""
    if i < 0 or rows[i, 1] <= 0:
        return None
    return float(rows[i, 3])
