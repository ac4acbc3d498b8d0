"""One ``log()`` call's values, reduced, into one wire entry (``rlpulse.schemas.protocol``, version 2).

A value reaching here is a number (one sample), a :class:`~rlpulse.producer.reduce.Reduced`
(state, non-finite count and, for a distribution, its sketch), a GPU value whose state is now
known (``rlpulse.producer.deferred``), a ``Samples`` value (reduced here, on the sender thread:
``rlpulse.producer.samples``; its row counts the rows as a ``SUM`` and its state rides beside
it, as a sketch does), or ``INVALID`` (already counted by ``log()``). Non-finite samples are
left out and counted per name; a ``LAST`` metric takes exactly one sample.

Names travel once: each distinct list of names an entry carries becomes a numbered table
(:attr:`Encoder.tables`), declared in the producer's hello, and entries refer to it by number.
A training loop logs the same names step after step, so a run needs a handful of tables.
That also gives the common call its fast path: the same names as a call before, every value
a finite number, none a distribution's: a few ``array`` slice copies build its rows (a
loop over names cost about 1.3 µs each in the sender thread).

The collector's limits are applied here, before anything is sent (``DEFAULT_LIMITS``): a
collector refuses a table with a name too long or too many names, so such names are dropped
here instead, counted (``invalid``) and warned about once; and a table that would make the
hello larger than a message may be is refused, its calls dropped (``dropped_oversized``).
"""

from __future__ import annotations

import array
import math
import sys
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from rlpulse.producer.names import BAD_NAME, Names
from rlpulse.producer.reduce import InvalidValue, Reduced
from rlpulse.producer.samples import GAVE_UP, SampleReducer
from rlpulse.producer.stats import Counters
from rlpulse.producer.values import Samples
from rlpulse.schemas import protocol
from rlpulse.schemas.catalog import Catalog
from rlpulse.schemas.messages import DEFAULT_LIMITS, Limits, TableDecl
from rlpulse.schemas.reductions import Reduction
from rlpulse.schemas.samples import SampleLimits, SampleState, encode as encode_samples
from rlpulse.schemas.sketch import counts_of, encode as encode_sketch
from rlpulse.schemas.values import Summary

INVALID = object()
"""Placed in a payload by ``log()`` for a value it could not read (already counted)."""
_BIG_ENDIAN = sys.byteorder != "little"
_NUMBER = (float, int)
_LAST = int(Reduction.LAST)
_DIST = int(Reduction.DIST)
_MEAN = int(Reduction.MEAN)
_SUM = int(Reduction.SUM)
PASSED = frozenset((float, int, SampleState))
"""Value types ``log()`` passes on as they are: the sender reads them (numbers, and a
``SampleState`` reduced already, ``rlpulse.producer.samples.reduce_then_fill``: at most 3 k
rows). ``Samples`` pass too, within ``pending_limit_bytes``: the sender reduces their rows."""
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
        limits: Limits = DEFAULT_LIMITS,
        samples: SampleReducer | None = None,
    ) -> None:
        self.samples = samples or SampleReducer(("", 0), SampleLimits(), counters)
        """Reduces ``Samples`` values (its counters should be ``counters``)."""
        self.names = Names(catalog, declared, warn_once, limits)
        """Each name's reduction code, resolved once per name."""
        self.counters = counters
        self.warn_once = warn_once
        self.limits = limits
        self._table_ids: dict[tuple[str, ...], int] = {}
        self._plain: dict[tuple[Any, ...], int] = {}
        """Name lists (a payload's keys, in order) whose every name went into a table with
        no distribution metric: a call with those keys and finite numbers only takes
        :meth:`_plain_entry`."""
        self.tables: list[TableDecl] = []
        """Every table declared so far, in order: what the hello says."""
        self._hello_bytes = 0
        """What the tables take in the hello (:func:`protocol.declared_bytes`)."""
        self.new_tables = False
        """A table was added since the flag was last cleared: say hello before sending."""
        self.gave_up = False
        """A ``Samples`` value was dropped unreduced (``close()`` ending) since the flag was
        last cleared: its step is incomplete."""

    def entry(self, step: int, t: float, payload: Mapping[Any, Any]) -> tuple | None:
        """The wire entry of one call; None when nothing in it is left to send."""
        keys = tuple(payload)
        table = self._plain.get(keys)
        if table is not None:
            fast = _plain_entry(step, t, table, payload)
            if fast is not None:
                return fast
        names: list[str] = []
        kinds = bytearray()
        vals = array.array("d")
        nonfinite: dict[str, int] = {}
        sketches: dict[int, bytes] = {}  # table row -> sketch, of distribution metrics
        samples: dict[int, bytes] = {}  # table row -> samples state
        dist = False
        c = self.counters
        known = self.names.codes
        most = self.limits.max_names
        for name, v in payload.items():
            code = known.get(name) if type(name) is str else None
            if code is None:
                code = self.names.code(name)
            if code == BAD_NAME:
                c.invalid += 1
                continue
            if v is INVALID:
                continue
            sample = None
            if type(v) is Samples or type(v) is SampleState:
                reduced = self.samples.reduce(v, name)
                if reduced is None:
                    continue
                if reduced is GAVE_UP:  # close() is ending: lost, counted, its step told
                    c.dropped_unreduced += 1
                    self.gave_up = True
                    continue
                assert type(reduced) is SampleState
                sample = encode_samples(reduced)
                state, nf, sketch = Summary.of_scalar(float(reduced.rows)), 0, None
                code = _SUM  # the row counts the rows, whatever the name (a user's too)
            elif type(v) in _NUMBER:
                try:
                    x = float(v)
                except OverflowError:  # an int beyond float64
                    c.invalid += 1
                    self.warn_once(f"value:{name}", f"{name}: an int beyond float64; dropped")
                    continue
                if not math.isfinite(x):
                    nonfinite[name] = 1
                    c.nonfinite += 1
                    continue
                state, nf = Summary.of_scalar(x), 0
                sketch = sketch_of_number(x) if code == _DIST else None
            else:
                try:
                    if type(v) is not Reduced:
                        v = v.state()  # a GPU value, ready by now
                except InvalidValue as exc:
                    c.invalid += 1
                    self.warn_once(f"value:{name}", f"{name}: {exc}; that metric is dropped")
                    continue
                state, nf, sketch = v
            if nf:
                nonfinite[name] = nf
                c.nonfinite += nf
            if code == _LAST and state.weight != 1.0:
                if state.weight:
                    c.invalid += 1
                    self.warn_once(
                        f"last:{name}",
                        f"{name} keeps the last value: log a single number, not "
                        f"{state.weight:g} samples",
                    )
                continue
            if len(names) >= most:
                c.invalid += 1
                self.warn_once(
                    "names-per-call",
                    f"a log() call holds more than {most} metric names (the collector's limit "
                    f"per entry): {name!r:.80} and the names after it are dropped (counted as "
                    "invalid)",
                )
                continue
            if code == _DIST:  # the row merges as a mean; the sketch rides beside it
                dist = True
                if sketch is not None:
                    sketches[len(names)] = sketch
                code = _MEAN
            elif sample is not None:
                samples[len(names)] = sample
            vals.extend(state)
            names.append(name)
            kinds.append(code)
        if not names and not nonfinite:
            return None
        table = self._table(names, kinds)
        if table is None:
            return None
        if len(names) == len(keys) and not dist and not samples and len(self._plain) < MAX_TABLES:
            self._plain[keys] = table
        if _BIG_ENDIAN:
            vals.byteswap()
        return protocol.pack_entry(step, t, table, vals.tobytes(), nonfinite, sketches, samples)

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
            size = protocol.declared_bytes(names, kinds)
            if self._hello_bytes + size > protocol.MAX_PAYLOAD_BYTES:
                self.counters.dropped_oversized += 1
                self.warn_once(
                    "hello-size",
                    f"a new list of {len(names)} metric names would make this producer's hello "
                    f"larger than {protocol.MAX_PAYLOAD_BYTES} bytes; log() calls with new "
                    "name lists are dropped (counted in stats() as dropped_oversized)",
                )
                return None
            self._hello_bytes += size
            table = self._table_ids[key] = len(self.tables)
            self.tables.append(TableDecl(table, names, bytes(kinds)))
            self.new_tables = True
        return table


def _plain_entry(step: int, t: float, table: int, payload: Mapping[Any, Any]) -> tuple | None:
    """The entry of a call whose values are all finite numbers, one sample each, built by a
    few ``array`` slice copies into a template of its rows; None when a value is not such a
    number (the caller takes the general path, which says why).

    numpy did the same in one pass, as fast warm, but a sender thread that has just woken
    from its sleep runs it cold, and there numpy's machinery cost twice the array module's:
    median 79-159 µs against 44-75 µs for 60 values, 5-20 ms after a sleep, on this machine
    (warm: 8-11 against 5.5 µs)."""
    values = list(payload.values())
    for v in values:
        if type(v) not in _NUMBER:
            return None
    try:
        col = array.array("d", values)
    except OverflowError:  # an int beyond float64
        return None
    if not math.isfinite(sum(col)):  # a non-finite value (or a sum that overflows)
        return None
    template = _ROW_TEMPLATES.get(len(col))
    if template is None:
        template = _ROW_TEMPLATES[len(col)] = array.array("d", (0.0, 1.0, 0.0, 0.0)) * len(col)
    rows = array.array("d", template)  # per name: sum = x, weight 1, min = x, max = x
    rows[0::4] = col
    rows[2::4] = col
    rows[3::4] = col
    if _BIG_ENDIAN:
        rows.byteswap()
    return protocol.pack_entry(step, t, table, rows.tobytes(), {}, {})


_ROW_TEMPLATES: dict[int, array.array] = {}
"""The rows of ``n`` one-sample summaries before their values are filled in, by ``n`` (at
most one per length of a table: ``DEFAULT_LIMITS.max_names``)."""


def sketch_of_number(x: float) -> bytes:
    """The sketch of one sample (a number logged under a distribution metric)."""
    return encode_sketch(counts_of(np.array([x])))
