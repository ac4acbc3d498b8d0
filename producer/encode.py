"""One ``log()`` call's values, reduced, into one wire entry (``schemas.protocol``, version 2).

A value reaching here is a number (one sample), a reduced ``(Summary, nonfinite)`` pair from
``producer.reduce``, a GPU value whose state is now known (``producer.deferred``), or
``INVALID`` (already counted by ``log()``). Non-finite samples are left out and counted per
name; a ``LAST`` metric takes exactly one sample.

Names travel once: each distinct list of names an entry carries becomes a numbered table
(:attr:`Encoder.tables`), declared in the producer's hello, and entries refer to it by number.
A training loop logs the same names step after step, so a run needs a handful of tables.
"""

from __future__ import annotations

import array
import math
import sys
from collections.abc import Callable, Mapping
from typing import Any

from producer.reduce import InvalidValue
from producer.stats import Counters
from schemas import protocol
from schemas.catalog import Catalog
from schemas.messages import TableDecl
from schemas.reductions import Reduction
from schemas.values import Summary

INVALID = object()
"""Placed in a payload by ``log()`` for a value it could not read (already counted)."""
_BIG_ENDIAN = sys.byteorder != "little"
_NUMBER = (float, int)
_LAST = int(Reduction.LAST)
MAX_TABLES = 4096
"""Distinct name lists one producer may declare; entries needing more are dropped, counted."""


class Encoder:
    """Turns payloads into wire entries; ``counters`` are the sender thread's.

    >>> # Encoder(CATALOG, {}, Counters(), warn).entry(3, time.time(), {"x": 1.0})
    """

    def __init__(
        self,
        catalog: Catalog,
        declared: Mapping[str, Reduction],
        counters: Counters,
        warn_once: Callable[[str, str], None],
    ) -> None:
        self.catalog = catalog
        self.declared = declared
        self.counters = counters
        self.warn_once = warn_once
        self._kinds: dict[str, int] = {}
        self._table_ids: dict[tuple[str, ...], int] = {}
        self.tables: list[TableDecl] = []
        """Every table declared so far, in order: what the hello says."""
        self.new_tables = False
        """A table was added since the flag was last cleared: say hello before sending."""

    def _kind(self, name: str) -> int:
        code = self._kinds.get(name)
        if code is None:
            code = int(self.catalog.resolve(name, self.declared.get(name)).reduction)
            self._kinds[name] = code
        return code

    def entry(self, step: int, t: float, payload: Mapping[Any, Any]) -> list | None:
        """The wire entry of one call; None when nothing in it is left to send."""
        names: list[str] = []
        kinds = bytearray()
        vals = array.array("d")
        nonfinite: dict[str, int] = {}
        c = self.counters
        for name, v in payload.items():
            if type(name) is not str or not name:
                c.invalid += 1
                self.warn_once(
                    f"name:{name!r}", f"metric names must be non-empty strings, got {name!r}"
                )
                continue
            if v is INVALID:
                continue
            if type(v) in _NUMBER:
                x = float(v)
                if not math.isfinite(x):
                    nonfinite[name] = 1
                    c.nonfinite += 1
                    continue
                state, nf = Summary.of_scalar(x), 0
            elif type(v) is tuple:
                state, nf = v
            else:
                try:
                    state, nf = v.state()  # a GPU value, ready by now
                except InvalidValue as exc:
                    c.invalid += 1
                    self.warn_once(f"value:{name}", f"{name}: {exc}; that metric is dropped")
                    continue
            if nf:
                nonfinite[name] = nf
                c.nonfinite += nf
            code = self._kind(name)
            if code == _LAST and state.weight != 1.0:
                if state.weight:
                    c.invalid += 1
                    self.warn_once(
                        f"last:{name}",
                        f"{name} keeps the last value: log a single number, not "
                        f"{state.weight:g} samples",
                    )
                continue
            vals.extend(state)
            names.append(name)
            kinds.append(code)
        if not names and not nonfinite:
            return None
        table = self._table(names, kinds)
        if table is None:
            return None
        if _BIG_ENDIAN:
            vals.byteswap()
        return protocol.pack_entry(step, t, table, vals.tobytes(), nonfinite)

    def _table(self, names: list[str], kinds: bytearray) -> int | None:
        key = tuple(names)
        table = self._table_ids.get(key)
        if table is None:
            if len(self.tables) >= MAX_TABLES:
                self.counters.errors += 1
                self.warn_once(
                    "tables",
                    f"{MAX_TABLES} distinct lists of metric names; entries with new ones dropped",
                )
                return None
            table = self._table_ids[key] = len(self.tables)
            self.tables.append(TableDecl(table, names, bytes(kinds)))
            self.new_tables = True
        return table
