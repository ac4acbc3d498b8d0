"""The rlpulse wire protocol, version 1: msgpack maps over ZeroMQ. See ``PROTOCOL.md``. The
message types (``schemas.messages``) are importable from here too.

Only msgpack's core types are used (no ext types, no pickle). :func:`decode` validates every
field and raises :class:`SchemaError` naming what was wrong; nothing it returns needs checking
again.

>>> msg = decode(encode_hello(7, 0, run="r", role="actor_train", rank=1, world_size=2))
>>> (msg.run, msg.role, msg.rank, msg.world_size)
('r', 'actor_train', 1, 2)
"""

from __future__ import annotations

import math
import os
import socket
import time
from collections.abc import Mapping, Sequence

import msgpack
import numpy as np

from schemas.errors import SchemaError
from schemas.messages import (
    DEFAULT_LIMITS as DEFAULT_LIMITS,
    DROP_KEYS as DROP_KEYS,
    RELIABLE as RELIABLE,
    STAT_KEYS as STAT_KEYS,
    Ack as Ack,
    Bye as Bye,
    Done as Done,
    Entry as Entry,
    Heartbeat as Heartbeat,
    Hello as Hello,
    Limits as Limits,
    Message as Message,
    Metrics as Metrics,
)
from schemas.reductions import Reduction
from schemas.values import MIN, WEIGHT, WIDTH

VERSION = 1
HELLO, METRICS, DONE, HEARTBEAT, BYE, ACK = "hello", "metrics", "done", "heartbeat", "bye", "ack"
_KIND_CODES = frozenset(int(r) for r in Reduction)
_MAX_U63 = 2**63 - 1
_ROW_BYTES = WIDTH * 8


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


def encode_ack(producer: int, seq: int) -> bytes:
    return _pack({"v": VERSION, "t": ACK, "p": producer, "q": seq})


# ---------------------------------------------------------------------------- decoding


def _no_ext(code: int, data: bytes) -> None:
    raise SchemaError("bad_msgpack", f"msgpack ext type {code} is not allowed")


def _int(obj: Mapping, key: str, what: str, lo: int = 0, hi: int = _MAX_U63) -> int:
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
            f"{what} ({key!r}) must be a non-empty string of at most {limit} characters, got {value!r:.80}",
        )
    return value


def _stats(obj: Mapping) -> dict[str, int]:
    raw = obj.get("st")
    if not isinstance(raw, dict):
        raise SchemaError("bad_field", f"stats ('st') must be a map, got {type(raw).__name__}")
    out: dict[str, int] = {}
    for key in STAT_KEYS:
        value = raw.get(key, 0)
        if type(value) is not int or value < 0:
            raise SchemaError(
                "bad_field", f"stat {key!r} must be a non-negative integer, got {value!r:.80}"
            )
        out[key] = value
    return out


def _roles(obj: Mapping, limit: int) -> dict[str, int]:
    raw = obj.get("roles", {})
    if not isinstance(raw, dict) or len(raw) > 64:
        raise SchemaError(
            "bad_field", "roles must be a map of at most 64 role names to world sizes"
        )
    for role, ws in raw.items():
        if (
            type(role) is not str
            or not 0 < len(role) <= limit
            or type(ws) is not int
            or not 1 <= ws <= 1 << 24
        ):
            raise SchemaError(
                "bad_field",
                f"roles: {role!r:.40} -> {ws!r:.20} is not a role name and a world size",
            )
    return raw


_NAME_CACHE: dict[tuple, int] = {}
"""Name lists already validated -> their longest name. Producers send the same list step
after step; re-checking 60 names each time was a quarter of the collector's decode time."""
_NAME_CACHE_SIZE = 4096


def _checked_names(names: list, limits: Limits) -> tuple[str, ...]:
    key = tuple(names)
    try:
        longest = _NAME_CACHE.get(key)
    except TypeError:  # an unhashable element: certainly not a name
        longest = None
    if longest is not None and longest <= limits.max_name_length:
        return key
    for name in names:
        if type(name) is not str or not 0 < len(name) <= limits.max_name_length:
            raise SchemaError(
                "bad_names",
                f"metric name must be a string of 1..{limits.max_name_length} characters, got {name!r:.80}",
            )
    if len(set(names)) != len(names):
        raise SchemaError("bad_names", "an entry names the same metric twice")
    if len(_NAME_CACHE) >= _NAME_CACHE_SIZE:
        _NAME_CACHE.clear()
    _NAME_CACHE[key] = max(map(len, names), default=0)
    return key


def _entry(raw: object, limits: Limits) -> Entry:
    if not isinstance(raw, list) or len(raw) != 6:
        raise SchemaError(
            "bad_entry", "an entry must be a list [step, time, names, kinds, values, nonfinite]"
        )
    step, t, names, kinds, values, nonfinite = raw
    if type(step) is not int or not 0 <= step <= _MAX_U63:
        raise SchemaError("bad_step", f"step must be a non-negative integer, got {step!r:.80}")
    if type(t) not in (float, int) or not math.isfinite(t):
        raise SchemaError("bad_entry", f"entry time must be a finite number, got {t!r:.80}")
    if not isinstance(names, list) or len(names) > limits.max_names:
        raise SchemaError(
            "bad_names", f"names must be a list of at most {limits.max_names} strings"
        )
    checked = _checked_names(names, limits)
    n = len(names)
    if type(kinds) is not bytes or len(kinds) != n or not set(kinds) <= _KIND_CODES:
        raise SchemaError(
            "bad_kinds", f"kinds must be {n} bytes, each a reduction code in {sorted(_KIND_CODES)}"
        )
    if type(values) is not bytes or len(values) != n * _ROW_BYTES:
        raise SchemaError(
            "bad_values",
            f"values must be {n * _ROW_BYTES} bytes (4 float64 per name), got {len(values) if isinstance(values, bytes) else type(values).__name__}",
        )
    rows = np.frombuffer(values, dtype="<f8").reshape(n, WIDTH)
    if n:
        if not np.isfinite(rows[:, :MIN]).all():
            raise SchemaError(
                "bad_values",
                "sum and weight must be finite (NaN/Inf samples are dropped by the producer)",
            )
        if (rows[:, WEIGHT] < 0).any():
            raise SchemaError("bad_values", "weight must not be negative")
        extremes = rows[:, MIN:]
        if np.isinf(extremes).any():
            raise SchemaError("bad_values", "min and max must be finite or NaN (not observed)")
        if (extremes[:, 0] > extremes[:, 1]).any():
            raise SchemaError("bad_values", "min is greater than max")
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
    return Entry(step, float(t), checked, kinds, rows, nonfinite)


def decode(buf: bytes, limits: Limits = DEFAULT_LIMITS) -> Message:
    """Parse and validate one message; raise :class:`SchemaError` saying what is wrong."""
    if len(buf) > limits.max_bytes:
        raise SchemaError(
            "oversized", f"message of {len(buf)} bytes exceeds the limit of {limits.max_bytes}"
        )
    try:
        obj = msgpack.unpackb(
            buf,
            raw=False,
            strict_map_key=True,
            ext_hook=_no_ext,
            timestamp=0,
        )
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
            f"protocol version {version!r:.40} is not supported (this collector speaks {VERSION})",
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
        return Metrics(producer, seq, tuple(_entry(e, limits) for e in raw))
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
            expected=_roles(obj, lab),
        )
        if hello.rank >= hello.world_size:
            raise SchemaError(
                "bad_field", f"rank {hello.rank} is not below world size {hello.world_size}"
            )
        return hello
    if kind == DONE:
        return Done(producer, seq, _int(obj, "s", "step"))
    if kind == HEARTBEAT:
        return Heartbeat(producer, seq, _stats(obj))
    if kind == BYE:
        return Bye(producer, seq, _stats(obj))
    if kind == ACK:
        return Ack(producer, seq)
    raise SchemaError("bad_envelope", f"unknown message type {kind!r:.40}")


def now() -> float:
    """Wall-clock seconds, the time base of entry timestamps."""
    return time.time()
