"""A run's configuration (its hyper-parameters): what a producer sends once
(``Producer.run_config``), the collector keeps with the run, and the sinks record: TensorBoard's
hparams, W&B's and SwanLab's run config, a ``config`` in the run's jsonl.

It travels as plain data, a msgpack map in the hello (``Hello.config``, ``PROTOCOL.md``): maps
with string keys, lists, strings, numbers, booleans and None. :func:`clean` makes a framework's
config such data: enums become their value, paths and dtypes their text, numpy and torch
scalars numbers, dataclasses maps, tuples and sets lists, integer keys strings; anything else
(a function, a model object) and what lies deeper than :data:`MAX_DEPTH` is left out, and its
dotted key is named so the producer can say what it left out. A config larger than
:data:`MAX_BYTES` once encoded is refused whole (a hello must stay within a message).

>>> from pathlib import PurePosixPath
>>> cleaned = clean({"actor": {"lr": 1e-6, "dir": PurePosixPath("/ckpt")}, "fn": print, 3: (1, 2)})
>>> cleaned.values, cleaned.left_out
({'actor': {'lr': 1e-06, 'dir': '/ckpt'}, '3': [1, 2]}, ('fn',))
>>> decode(encode(cleaned.values)) == cleaned.values
True
>>> flat({"actor": {"lr": 1e-6, "layers": [1, 2]}, "name": None})
{'actor.lr': 1e-06, 'actor.layers': '[1, 2]', 'name': 'null'}
"""

from __future__ import annotations

import dataclasses
import enum
import json
import os
import sys
from collections.abc import Mapping, Set
from dataclasses import dataclass
from typing import Any

import msgspec

from rlpulse.schemas.errors import SchemaError

MAX_BYTES = 60 * 1024
"""The most a run's config takes, encoded. A producer's hello holds it beside its name tables
(``protocol.MAX_PAYLOAD_BYTES`` leaves 64 KiB of a message for the rest): verl's whole resolved
PPO config takes about 21 KB, TRL's training arguments a few."""
MAX_DEPTH = 32
"""Maps and lists nested deeper are left out (a reference cycle ends here too)."""
Plain = None | bool | int | float | str | list[Any] | dict[str, Any]
_ENCODER = msgspec.msgpack.Encoder()
_INT_RANGE = (-(2**63), 2**64)


@dataclass(frozen=True)
class Cleaned:
    """:func:`clean`'s result: the plain ``values``, and the dotted keys of what was left out."""

    values: dict[str, Any]
    left_out: tuple[str, ...] = ()


def clean(config: Mapping[Any, Any]) -> Cleaned:
    """``config`` as plain data (see the module docstring); never raises for what it holds (a
    value that raises when read is left out)."""
    left_out: list[str] = []
    values = _map(config, "", 1, left_out)
    return Cleaned(values, tuple(left_out))


def _map(config: Any, prefix: str, depth: int, left_out: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    try:
        items = list(config.items())
    except Exception:  # a mapping that cannot be read (an unresolved interpolation...)
        left_out.append(prefix.rstrip(".") or "<config>")
        return out
    for key, value in items:
        if isinstance(key, bool) or not isinstance(key, str | int | float):
            left_out.append(f"{prefix}{key!r:.60}")
            continue
        name = str(key)
        try:
            kept = _value(value, f"{prefix}{name}", depth, left_out)
        except _LeftOut:
            left_out.append(f"{prefix}{name}")
            continue
        out[name] = kept
    return out


class _LeftOut(Exception):
    """A value that is no plain data (or lies too deep)."""


def _value(value: Any, path: str, depth: int, left_out: list[str]) -> Any:
    if value is None or type(value) is bool or type(value) is str:
        return value
    if isinstance(value, bool):
        return bool(value)
    if isinstance(value, str):  # a subclass (a str enum included) as its text
        return value.value if isinstance(value, enum.Enum) else str(value)
    if isinstance(value, int):
        value = int(value)
        return value if _INT_RANGE[0] <= value < _INT_RANGE[1] else str(value)
    if isinstance(value, float):
        return float(value)
    if isinstance(value, enum.Enum):
        return _value(value.value, path, depth, left_out)
    if isinstance(value, os.PathLike):
        return str(value)
    if depth >= MAX_DEPTH:
        raise _LeftOut
    if isinstance(value, Mapping):
        return _map(value, f"{path}.", depth + 1, left_out)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
        return _map(fields, f"{path}.", depth + 1, left_out)
    if isinstance(value, list | tuple | Set):
        out = []
        for i, item in enumerate(value):
            try:
                out.append(_value(item, f"{path}[{i}]", depth + 1, left_out))
            except _LeftOut:
                left_out.append(f"{path}[{i}]")
        return out
    if _is_dtype(value):  # torch's, numpy's: the name is the value
        return str(value)
    item = getattr(value, "item", None)
    if item is not None and getattr(value, "ndim", None) == 0:  # numpy or torch scalar
        try:
            return _value(item(), path, depth, left_out)
        except Exception:
            raise _LeftOut from None
    raise _LeftOut


def _is_dtype(value: Any) -> bool:
    if type(value).__name__ == "dtype":  # torch.dtype
        return True
    numpy = sys.modules.get("numpy")  # never imported for this
    return numpy is not None and isinstance(value, numpy.dtype)


def encode(values: Mapping[str, Any]) -> bytes:
    """The wire form of plain ``values`` (a msgpack map); see :func:`clean`."""
    return _ENCODER.encode(values)


def decode(data: bytes, max_bytes: int = MAX_BYTES) -> dict[str, Any]:
    """A config sent by :func:`encode`, checked; :class:`SchemaError` (``bad_config``) names
    what is wrong: too large, not msgpack, not a map, a key that is no string, a value that is
    no plain data, nested too deep."""
    if len(data) > max_bytes:
        raise SchemaError("bad_config", f"a config of {len(data)} bytes (at most {max_bytes})")
    try:
        values = msgspec.msgpack.decode(data)
    except (msgspec.DecodeError, UnicodeDecodeError, ValueError) as exc:
        raise SchemaError("bad_config", f"not msgpack: {exc}"[:200]) from None
    if not isinstance(values, dict):
        raise SchemaError("bad_config", f"a config is a map, not a {type(values).__name__}")
    _check(values, 1)
    return values


def _check(value: Any, depth: int) -> None:
    if value is None or isinstance(value, bool | int | float | str):
        return
    if depth > MAX_DEPTH:
        raise SchemaError("bad_config", f"nested deeper than {MAX_DEPTH}")
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise SchemaError("bad_config", f"a key that is no string: {key!r:.60}")
            _check(item, depth + 1)
    elif isinstance(value, list):
        for item in value:
            _check(item, depth + 1)
    else:
        raise SchemaError("bad_config", f"a value that is no plain data: {type(value).__name__}")


def flat(values: Mapping[str, Any], prefix: str = "") -> dict[str, bool | float | str]:
    """``values`` as one level of dotted keys, each a number, a boolean or a string (lists and
    None as their JSON text): what TensorBoard's hparams take."""
    out: dict[str, bool | float | str] = {}
    for key, value in values.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flat(value, f"{name}."))
        elif isinstance(value, bool | str | int | float):
            out[name] = value
        else:
            out[name] = json.dumps(value)
    return out


def largest(values: Mapping[str, Any], n: int = 3) -> list[tuple[str, int]]:
    """The ``n`` top-level keys of ``values`` that take the most bytes encoded, with their
    sizes: what a producer names when it refuses a config too large."""
    sizes = [(key, len(_ENCODER.encode(value))) for key, value in values.items()]
    return sorted(sizes, key=lambda kv: -kv[1])[:n]
