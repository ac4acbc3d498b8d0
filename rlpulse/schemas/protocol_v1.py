"""Version 1 of the wire protocol: msgpack maps, metric names in every entry. Still accepted
(a producer of an earlier release keeps working) and parsed into the same messages as version
2 (``rlpulse.schemas.messages``); the encoders stay for that compatibility and its tests. Acks are
always sent in this form, which producers of both versions read.

>>> msg = decode(encode_hello(7, 0, run="r", role="actor_train", rank=1, world_size=2))
>>> (msg.run, msg.role, msg.rank, msg.world_size)
('r', 'actor_train', 1, 2)
"""

from __future__ import annotations

import math
import os
import socket
from collections.abc import Mapping, Sequence
from typing import Any

import msgpack
import numpy as np

from rlpulse.schemas.checks import checked_roles, checked_stats
from rlpulse.schemas.errors import SchemaError
from rlpulse.schemas.messages import (
    DEFAULT_LIMITS,
    MAX_STEP,
    ROW_BYTES,
    U63_MAX,
    Ack,
    Bye,
    Done,
    Heartbeat,
    Hello,
    Limits,
    Message,
    Metrics,
    Table,
)
from rlpulse.schemas.values import WIDTH, invalid_rows

VERSION = 1
HELLO, METRICS, DONE, HEARTBEAT, BYE, ACK = "hello", "metrics", "done", "heartbeat", "bye", "ack"
MAX_ACK_MEMBERS = 1 << 16
"""The most ``(member, late)`` pairs an ack to a relay carries."""


# ---------------------------------------------------------------------------- encoding


def _pack(obj: dict) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)


def encode_hello(
    producer: int,
    seq: int,
    *,
    run: str,
    role: str,
    rank: int,
    world_size: int,
    host: str | None = None,
    pid: int | None = None,
    expected: Mapping[str, int] | None = None,
) -> bytes:
    extra = {"roles": dict(expected)} if expected else {}
    return _pack(
        {
            **extra,
            "v": VERSION,
            "t": HELLO,
            "p": producer,
            "q": seq,
            "run": run,
            "role": role,
            "rank": rank,
            "ws": world_size,
            "host": host if host is not None else socket.gethostname(),
            "pid": pid if pid is not None else os.getpid(),
        }
    )


def pack_entry(
    step: int,
    t: float,
    names: Sequence[str],
    kinds: bytes,
    values: bytes,
    nonfinite: Mapping[str, int] | None = None,
) -> list:
    """One entry in wire form; ``values`` is 4 little-endian float64 per name."""
    return [step, t, list(names), kinds, values, dict(nonfinite or {})]


def encode_metrics(producer: int, seq: int, entries: Sequence[list]) -> bytes:
    return _pack({"v": VERSION, "t": METRICS, "p": producer, "q": seq, "e": list(entries)})


def encode_done(producer: int, seq: int, step: int) -> bytes:
    return _pack({"v": VERSION, "t": DONE, "p": producer, "q": seq, "s": step})


def encode_heartbeat(producer: int, seq: int, stats: Mapping[str, int]) -> bytes:
    return _pack({"v": VERSION, "t": HEARTBEAT, "p": producer, "q": seq, "st": dict(stats)})


def encode_bye(producer: int, seq: int, stats: Mapping[str, int]) -> bytes:
    return _pack({"v": VERSION, "t": BYE, "p": producer, "q": seq, "st": dict(stats)})


def encode_ack(
    producer: int,
    seq: int,
    late: int = 0,
    conflict: int = 0,
    run: str = "",
    rejected: int = 0,
    resend: bool = False,
    hold: bool = False,
    go: bool = False,
    asks: bool = False,
    names: int = 0,
    members: Sequence[tuple[int, int]] = (),
    stopping: bool = False,
) -> bytes:
    """An acknowledgement (:class:`~rlpulse.schemas.messages.Ack`); the feedback keys are sent only
    when set, and a producer that predates them ignores them."""
    extra: dict = {}
    if late:
        extra["l"] = late
    if conflict:
        extra["c"] = conflict
    if run:
        extra["r"] = run
    if rejected:
        extra["x"] = rejected
    if resend:
        extra["w"] = True
    if hold:
        extra["h"] = True
    if go:
        extra["g"] = True
    if asks:
        extra["a"] = True
    if names:
        extra["n"] = names
    if members:
        extra["m"] = [[pid, late] for pid, late in members]
    if stopping:
        extra["s"] = True
    return _pack({"v": VERSION, "t": ACK, "p": producer, "q": seq, **extra})


# ---------------------------------------------------------------------------- decoding


def _members(raw: object) -> tuple[tuple[int, int], ...]:
    """An ack's ``m``: ``[[member, late], ...]`` (at most ``MAX_ACK_MEMBERS`` pairs)."""
    listed = raw if type(raw) is list and len(raw) <= MAX_ACK_MEMBERS else None
    ok = listed is not None
    pairs = []
    for pair in listed or ():
        if not (
            type(pair) is list
            and len(pair) == 2
            and all(type(v) is int and 0 <= v <= U63_MAX for v in pair)
        ):
            ok = False
            break
        pairs.append((pair[0], pair[1]))
    if not ok:
        raise SchemaError(
            "bad_field", f"an ack's members ('m') must be [[id, late], ...], got {raw!r:.80}"
        )
    return tuple(pairs)


def _no_ext(code: int, data: bytes) -> None:
    raise SchemaError("bad_msgpack", f"msgpack ext type {code} is not allowed")


def _int(obj: Mapping, key: str, what: str, lo: int = 0, hi: int = U63_MAX) -> int:
    value = obj.get(key)
    if type(value) is not int or not lo <= value <= hi:
        raise SchemaError(
            "bad_field", f"{what} ({key!r}) must be an integer in [{lo}, {hi}], got {value!r:.80}"
        )
    return value


def _str(obj: Mapping, key: str, what: str, limit: int) -> str:
    value = obj.get(key)
    if type(value) is not str or not 0 < len(value) <= limit:
        raise SchemaError(
            "bad_field",
            f"{what} ({key!r}) must be a non-empty string of at most {limit} characters, "
            f"got {value!r:.80}",
        )
    return value


def _stats(obj: Mapping) -> dict[str, int]:
    raw = obj.get("st")
    if not isinstance(raw, dict):
        raise SchemaError("bad_field", f"stats ('st') must be a map, got {type(raw).__name__}")
    return checked_stats(raw)


_TABLES: dict[tuple, Table] = {}
"""Name lists already validated -> their table. Producers send the same list step after step;
re-checking 60 names each time was a quarter of the collector's decode time."""
_TABLES_SIZE = 4096


def _table(names: object, kinds: object, limits: Limits) -> Table:
    key: tuple[Any, ...] | None
    try:
        # names as received: a TypeError below says it is no list of hashable names.
        key = (limits, tuple(names), kinds)  # type: ignore[arg-type]
        table = _TABLES.get(key)
    except TypeError:  # not a list, or an unhashable element: certainly not names
        key, table = None, None
    if table is None:
        table = Table.checked(names, kinds, limits)
        if key is not None:
            if len(_TABLES) >= _TABLES_SIZE:
                _TABLES.clear()
            _TABLES[key] = table
    return table


def _entry(raw: object, limits: Limits) -> tuple:
    if not isinstance(raw, list) or len(raw) != 6:
        raise SchemaError(
            "bad_entry", "an entry must be a list [step, time, names, kinds, values, nonfinite]"
        )
    step, t, names, kinds, values, nonfinite = raw
    if type(step) is not int or not 0 <= step <= MAX_STEP:
        raise SchemaError("bad_step", f"step must be a non-negative integer, got {step!r:.80}")
    if type(t) not in (float, int) or not math.isfinite(t):
        raise SchemaError("bad_entry", f"entry time must be a finite number, got {t!r:.80}")
    table = _table(names, kinds, limits)
    n = table.size
    if type(values) is not bytes or len(values) != n * ROW_BYTES:
        got = len(values) if isinstance(values, bytes) else type(values).__name__
        raise SchemaError(
            "bad_values", f"values must be {n * ROW_BYTES} bytes (4 float64 per name), got {got}"
        )
    problem = invalid_rows(np.frombuffer(values, dtype="<f8").reshape(n, WIDTH))
    if problem is not None:
        raise SchemaError("bad_values", problem)
    if not isinstance(nonfinite, dict):
        raise SchemaError("bad_entry", "nonfinite must be a map of name to count")
    for key, count in nonfinite.items():
        if (
            type(key) is not str
            or len(key) > limits.max_name_length
            or type(count) is not int
            or count < 0
        ):
            raise SchemaError("bad_entry", "nonfinite must map metric names to non-negative counts")
    return (step, float(t), table, values, nonfinite)


def decode(buf: bytes, limits: Limits = DEFAULT_LIMITS) -> Message:
    """Parse and validate one version-1 message (a msgpack map); raise :class:`SchemaError`
    saying what is wrong. The size limit is the caller's (``rlpulse.schemas.protocol.decode``)."""
    try:
        obj = msgpack.unpackb(buf, raw=False, strict_map_key=True, ext_hook=_no_ext, timestamp=0)
    except SchemaError:
        raise
    except Exception as exc:  # msgpack raises many types for garbage
        raise SchemaError(
            "bad_msgpack", f"not a msgpack document: {type(exc).__name__}: {exc}"[:200]
        ) from None
    if not isinstance(obj, dict):
        raise SchemaError("bad_envelope", f"a message must be a map, got {type(obj).__name__}")
    version = obj.get("v")
    if version != VERSION or type(version) is not int:
        raise SchemaError(
            "bad_version",
            f"protocol version {version!r:.40} is not supported (this collector speaks 1 and 2)",
        )
    kind = obj.get("t")
    producer = _int(obj, "p", "producer id")
    seq = _int(obj, "q", "sequence number")
    if kind == METRICS:
        raw = obj.get("e")
        if not isinstance(raw, list) or not 0 < len(raw) <= limits.max_entries:
            raise SchemaError(
                "bad_envelope", f"'e' must be a list of 1..{limits.max_entries} entries"
            )
        return Metrics(producer, seq, [_entry(e, limits) for e in raw])
    if kind == HELLO:
        lab = limits.max_label_length
        hello = Hello(
            producer,
            seq,
            run=_str(obj, "run", "run name", lab),
            role=_str(obj, "role", "role", lab),
            rank=_int(obj, "rank", "rank", hi=1 << 24),
            world_size=_int(obj, "ws", "world size", lo=1, hi=1 << 24),
            host=_str(obj, "host", "host name", 255),
            pid=_int(obj, "pid", "process id"),
            expected=checked_roles(obj.get("roles", {}), lab),
        )
        if hello.rank >= hello.world_size:
            raise SchemaError(
                "bad_field", f"rank {hello.rank} is not below world size {hello.world_size}"
            )
        return hello
    if kind == DONE:
        return Done(producer, seq, _int(obj, "s", "step", hi=MAX_STEP))
    if kind == HEARTBEAT:
        return Heartbeat(producer, seq, _stats(obj))
    if kind == BYE:
        return Bye(producer, seq, _stats(obj))
    if kind == ACK:
        run = obj.get("r", "")
        if type(run) is not str or len(run) > limits.max_label_length:
            raise SchemaError(
                "bad_field", f"an ack's run ('r') must be a run name, got {run!r:.80}"
            )
        counts = {k: obj.get(k, 0) for k in ("l", "c", "x", "n")}
        return Ack(
            producer,
            seq,
            _int(counts, "l", "late count"),
            _int(counts, "c", "conflicts"),
            run,
            _int(counts, "x", "rejected count"),
            obj.get("h") is True,
            obj.get("w") is True,
            obj.get("g") is True,
            _members(obj.get("m", [])),
            _int(counts, "n", "names dropped"),
            obj.get("a") is True,
            obj.get("s") is True,
        )
    raise SchemaError("bad_envelope", f"unknown message type {kind!r:.40}")
