"""Sample states: the rows behind the numbers (prompt, response, reward...), merged exactly.

A step's samples for one name are three sets of at most ``k`` rows each:

* ``top`` and ``bottom``: the rows with the largest and the smallest ``key`` (a numeric field
  the user names, e.g. ``reward``). The top ``k`` of a union is the top ``k`` of the parts'
  top ``k``, so each rank keeps only its own ``k`` and the merge is exact, through any number
  of relays, in any order.
* ``random``: a uniform random ``k`` of all rows, without replacement. Every row gets an
  independent uniform random key when it is reduced, and the set is the ``k`` smallest keys;
  the ``k`` smallest of a union are the ``k`` smallest of the parts' ``k`` smallest, so each
  row of every rank is equally likely to be kept, whatever the ranks' row counts.

Ties are broken by the random key, so a merge's result does not depend on arrival order. The
random keys come from a generator of rlpulse's own (:class:`KeySource`), seeded from the
operating system and re-seeded in a forked child: a program that seeds ``random``, numpy or
torch identically on every rank would otherwise draw the same keys on each. The keys travel
with the rows, so a merge, a relay or a restart from saved state keeps the same sample.

A state's memory is bounded by ``3 k`` rows, each bounded in bytes (:class:`SampleLimits`):
a long text is cut and says so; a bad row (a key that is not a finite number, a value that is
not a string, number, boolean or None) is dropped and counted.

>>> s = reduce_rows([{"reward": 1.0, "text": "a"}, {"reward": 0.0, "text": "b"}], "reward",
...                 origin=("actor", 0), limits=SampleLimits(k=1))
>>> [r.fields["text"] for r in s.top], [r.fields["text"] for r in s.bottom]
(['a'], ['b'])
"""

from __future__ import annotations

import heapq
import math
import os
import random
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import msgpack

from rlpulse.schemas.errors import SchemaError

FieldValue = str | int | float | bool | None
KEY_BITS = 63
"""Random keys are uniform integers in ``[0, 2**63)``: collisions are negligible (about
``n**2 / 2**64`` for ``n`` rows) and they fit msgpack's signed 64-bit integers."""
CUT_MARK = "…[cut {} bytes]"
"""Appended to a text cut to :attr:`SampleLimits.field_bytes`, with the bytes left out."""


@dataclass(frozen=True)
class SampleLimits:
    """How much of the rows a state keeps.

    ``k``: rows in each of top, bottom and random. ``field_bytes``: a string field is cut to
    this many UTF-8 bytes (and marked). ``row_fields``: a row with more fields is dropped.
    """

    k: int = 8
    field_bytes: int = 4096
    row_fields: int = 64

    def __post_init__(self) -> None:
        if not 1 <= self.k <= 1024:
            raise ValueError(f"samples k must be 1..1024, got {self.k!r}")
        if self.field_bytes < 16:
            raise ValueError(f"samples field_bytes must be at least 16, got {self.field_bytes!r}")
        if self.row_fields < 1:
            raise ValueError(f"samples row_fields must be at least 1, got {self.row_fields!r}")


class KeySource:
    """Uniform random keys from a generator no user code seeds: seeded from ``os.urandom`` when
    first used, and again in every forked child (which would otherwise repeat its parent's
    keys). Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._rng: random.Random | None = None

    def _reseed(self) -> None:
        self._rng = random.Random(os.urandom(32))

    def __call__(self) -> int:
        with self._lock:
            if self._rng is None:
                self._reseed()
                os.register_at_fork(after_in_child=self._after_fork)
            assert self._rng is not None
            return self._rng.getrandbits(KEY_BITS)

    def _after_fork(self) -> None:
        self._lock = threading.Lock()
        self._reseed()


KEYS = KeySource()
"""The process's key source (nothing is drawn until the first row is reduced)."""


class SampleRow(NamedTuple):
    """One kept row: its random key, its ranking value, where it came from, and its fields."""

    rkey: int
    key: float
    role: str
    rank: int
    fields: dict[str, FieldValue]

    def record(self) -> dict[str, FieldValue]:
        """The row as logged plus its ``role`` and ``rank`` (the user's own fields of those
        names win; the origin then reads ``origin_role``/``origin_rank``)."""
        out = dict(self.fields)
        out["origin_role" if "role" in out else "role"] = self.role
        out["origin_rank" if "rank" in out else "rank"] = self.rank
        return out


def _best(row: SampleRow) -> tuple[float, int]:
    return (-row.key, row.rkey)


def _worst(row: SampleRow) -> tuple[float, int]:
    return (row.key, row.rkey)


def _rkey(row: SampleRow) -> int:
    return row.rkey


@dataclass(frozen=True)
class SampleState:
    """One name's samples at one step: top, bottom and random ``k`` rows, best first, worst
    first and by random key; ``rows``: rows reduced into it; ``dropped``: bad rows left out;
    ``cut``: text fields cut to the byte limit."""

    key: str
    k: int
    top: tuple[SampleRow, ...]
    bottom: tuple[SampleRow, ...]
    random: tuple[SampleRow, ...]
    rows: int = 0
    dropped: int = 0
    cut: int = 0

    def merge(self, other: SampleState) -> SampleState:
        """The state of both parts' rows together (the parts hold different rows). Exact,
        associative and commutative. Parts ranked by different keys cannot merge; parts with
        different ``k`` merge at the smaller one."""
        if other.key != self.key:
            raise SchemaError(
                "bad_values", f"samples ranked by {self.key!r} and by {other.key!r} cannot merge"
            )
        k = min(self.k, other.k)
        return SampleState(
            self.key,
            k,
            tuple(heapq.nsmallest(k, (*self.top, *other.top), key=_best)),
            tuple(heapq.nsmallest(k, (*self.bottom, *other.bottom), key=_worst)),
            tuple(heapq.nsmallest(k, (*self.random, *other.random), key=_rkey)),
            self.rows + other.rows,
            self.dropped + other.dropped,
            self.cut + other.cut,
        )

    def record(self) -> dict[str, Any]:
        """What the step's JSON-lines record carries for this name."""
        return {
            "key": self.key,
            "top": [r.record() for r in self.top],
            "bottom": [r.record() for r in self.bottom],
            "random": [r.record() for r in self.random],
            "rows": self.rows,
            "dropped": self.dropped,
            "cut": self.cut,
        }

    def to_wire(self) -> dict[str, Any]:
        """A msgpack-ready map: each kept row once (a row can be in several sets), and the
        sets as indices into them."""
        table: dict[int, int] = {}
        rows: list[list[Any]] = []
        sets = []
        for part in (self.top, self.bottom, self.random):
            idx = []
            for r in part:
                if r.rkey not in table:
                    table[r.rkey] = len(rows)
                    rows.append([r.rkey, r.key, r.role, r.rank, r.fields])
                idx.append(table[r.rkey])
            sets.append(idx)
        return {
            "key": self.key,
            "k": self.k,
            "rows": rows,
            "sets": sets,
            "n": [self.rows, self.dropped, self.cut],
        }

    @classmethod
    def from_wire(cls, raw: Any) -> SampleState:
        """Check and rebuild a state sent by :meth:`to_wire`; :class:`SchemaError` names what
        is wrong."""
        try:
            key, k, rows, sets, counts = (raw[f] for f in ("key", "k", "rows", "sets", "n"))
            if not isinstance(key, str) or type(k) is not int or not 1 <= k <= 1024:
                raise ValueError("key or k")
            table = [_wire_row(r) for r in rows]
            parts = [tuple(table[i] for i in idx) for idx in sets]
            if len(parts) != 3 or any(len(p) > k for p in parts):
                raise ValueError("sets")
            n, dropped, cut = (int(c) for c in counts)
        except (KeyError, TypeError, ValueError, IndexError) as e:
            raise SchemaError("bad_values", f"not a samples state ({e})", raw) from None
        return cls(key, k, parts[0], parts[1], parts[2], n, dropped, cut)


def _wire_row(raw: Sequence[Any]) -> SampleRow:
    rkey, key, role, rank, fields = raw
    if type(rkey) is not int or not isinstance(role, str) or type(rank) is not int:
        raise ValueError("row origin")
    if not isinstance(fields, dict) or not all(isinstance(f, str) for f in fields):
        raise ValueError("row fields")
    return SampleRow(rkey, float(key), role, rank, fields)


CHUNK = 4096
"""Rows checked before the kept sets are cut back to ``k``: memory ``O(k + CHUNK)`` rows."""


def reduce_rows(
    rows: Iterable[Any],
    key: str,
    *,
    origin: tuple[str, int],
    limits: SampleLimits = SampleLimits(),
    keys: Callable[[], int] = KEYS,
) -> SampleState:
    """One rank's rows reduced to a state: each row checked and bounded, given a random key,
    and only the top, bottom and random ``k`` kept. Rows are taken ``CHUNK`` at a time, each
    chunk cut back to the three sets with ``heapq.nsmallest`` (memory ``O(k + CHUNK)``)."""
    role, rank = origin
    dropped = cut = n = 0
    k = limits.k
    top: list[SampleRow] = []
    bottom: list[SampleRow] = []
    rand: list[SampleRow] = []
    chunk: list[SampleRow] = []
    for raw in rows:
        checked = clean_row(raw, key, limits)
        if checked is None:
            dropped += 1
            continue
        fields, value, cuts = checked
        cut += cuts
        chunk.append(SampleRow(keys(), value, role, rank, fields))
        if len(chunk) >= CHUNK:
            n += len(chunk)
            top, bottom, rand = _keep(k, top, bottom, rand, chunk)
            chunk = []
    n += len(chunk)
    top, bottom, rand = _keep(k, top, bottom, rand, chunk)
    return SampleState(key, k, tuple(top), tuple(bottom), tuple(rand), n, dropped, cut)


def _keep(
    k: int,
    top: list[SampleRow],
    bottom: list[SampleRow],
    rand: list[SampleRow],
    chunk: list[SampleRow],
) -> tuple[list[SampleRow], list[SampleRow], list[SampleRow]]:
    """The three sets of ``k`` over the sets so far and ``chunk`` (ties in the key broken by
    the random key, as :meth:`SampleState.merge` does)."""
    return (
        heapq.nsmallest(k, (*top, *chunk), key=_best),
        heapq.nsmallest(k, (*bottom, *chunk), key=_worst),
        heapq.nsmallest(k, (*rand, *chunk), key=_rkey),
    )


def clean_row(
    raw: Any, key: str, limits: SampleLimits
) -> tuple[dict[str, FieldValue], float, int] | None:
    """A row's fields as the wire carries them, its key value and how many texts were cut; or
    None for a bad row (not a mapping of string names; a key missing or not a finite number;
    a value that is not a string, number, boolean or None; too many fields).

    The sender runs this for every row: exact types are tested first (``type(v) is str``),
    subclasses and numpy or torch scalars only when those fail."""
    if (type(raw) is not dict and not isinstance(raw, Mapping)) or len(raw) > limits.row_fields:
        return None
    found = raw.get(key)
    kind = type(found)
    number = found if kind is float or kind is int else _number(found)
    if number is None:
        return None
    value = float(number)
    if not math.isfinite(value):
        return None
    fields: dict[str, FieldValue] = {}
    cuts = 0
    limit = limits.field_bytes
    short = limit // 4  # a text of at most this many characters fits: UTF-8 is <= 4 bytes each
    for name, v in raw.items():
        if type(name) is not str and not isinstance(name, str):
            return None
        kind = type(v)
        if kind is str:
            if len(v) > short:
                v, was_cut = cut_text(v, limit)
                cuts += was_cut
        elif kind is float or kind is bool or v is None:
            pass
        elif kind is int:
            if not -(2**63) <= v < 2**64:
                return None
        else:
            checked = _other(v, limit)
            if checked is None:
                return None
            v, was_cut = checked
            cuts += was_cut
        fields[name] = v
    return fields, value, cuts


def row_problem(raw: Any, key: str, limits: SampleLimits) -> str | None:
    """Why :func:`clean_row` drops ``raw``, in words (None when it keeps it): the slow path,
    for a warning about the first bad row, never run on every row."""
    if not isinstance(raw, Mapping):
        return f"not a mapping: {type(raw).__name__}"
    if len(raw) > limits.row_fields:
        return f"{len(raw)} fields, more than {limits.row_fields}"
    if key not in raw:
        return f"no {key!r}"
    found = raw[key]
    number = found if type(found) in (float, int) else _number(found)
    if number is None:
        return f"its {key!r} is not a number, got {type(found).__name__}"
    if not math.isfinite(float(number)):
        return f"its {key!r} is not finite ({float(number)})"
    for name, v in raw.items():
        if not isinstance(name, str):
            return f"a field name that is not a string: {name!r:.80}"
        if isinstance(v, int) and not isinstance(v, bool) and not -(2**63) <= v < 2**64:
            return f"field {name!r} is an int beyond 64 bits"
        if not isinstance(v, str | float | int | bool) and v is not None and _number(v) is None:
            return f"field {name!r} is a {type(v).__name__}, not a string, number, boolean or None"
    return None


def _other(v: Any, limit: int) -> tuple[FieldValue, bool] | None:
    """A field value of another type than ``str``, ``float``, ``int``, ``bool`` or None: a
    subclass of those as its base value, a numpy or torch scalar as a Python number; None for
    anything else (the row is bad)."""
    if isinstance(v, str):
        return cut_text(str(v), limit)
    if isinstance(v, bool):
        return bool(v), False
    if isinstance(v, int):
        return (int(v), False) if -(2**63) <= v < 2**64 else None
    if isinstance(v, float):
        return float(v), False
    number = _number(v)
    return None if number is None else (number, False)


def _number(v: Any) -> float | int | None:
    """A numpy or torch scalar as a Python number (``.item()`` of a 0-d value), else None."""
    item = getattr(v, "item", None)
    if item is None or getattr(v, "ndim", 1) != 0:
        return None
    try:
        out = item()
    except (TypeError, ValueError, RuntimeError):
        return None
    return out if isinstance(out, int | float) and not isinstance(out, bool) else None


def cut_text(text: str, limit: int) -> tuple[str, bool]:
    """``text`` within ``limit`` UTF-8 bytes, the mark included, cut on a character boundary;
    and whether it was cut."""
    data = text.encode("utf-8", "replace")
    if len(data) <= limit:
        return text, False
    room = limit - len(CUT_MARK.format(len(data)).encode())
    head = data[: max(room, 0)].decode("utf-8", "ignore")
    left = len(data) - len(head.encode())
    return head + CUT_MARK.format(left), True


def encode(state: SampleState) -> bytes:
    """A state as msgpack bytes (its :meth:`SampleState.to_wire` map): what rides beside an
    entry on the wire, as a distribution's sketch does."""
    return msgpack.packb(state.to_wire(), use_bin_type=True)


def decode(data: bytes) -> SampleState:
    """The state :func:`encode` wrote; :class:`SchemaError` names what is wrong."""
    try:
        raw = msgpack.unpackb(data, raw=False, strict_map_key=True)
    except (ValueError, TypeError, msgpack.ExtraData, msgpack.FormatError) as e:
        raise SchemaError("bad_values", f"samples are not msgpack ({e})") from None
    return SampleState.from_wire(raw)
