"""The rlpulse wire protocol, version 2, and the decoder of both versions. See ``PROTOCOL.md``.

A version-2 message is a msgpack array whose first element is its type tag (21 hello, 22
metrics, 23 done, 24 heartbeat, 25 bye): ``msgspec`` decodes it straight into the structs of
``rlpulse.schemas.messages``, checking every field's type and range in C. A producer declares its
metric names once, as numbered tables in its hello, and each entry refers to a table by number,
so a step's message carries numbers, not names. Version 1 (msgpack maps, names in every entry)
is still accepted: :func:`decode` tells them apart by the first byte (a map is version 1) and
hands version 1 to ``rlpulse.schemas.protocol_v1``. Acks keep the version-1 form, which producers of
both versions read. :func:`decode` raises :class:`SchemaError` naming what was wrong; nothing
it returns needs checking again, but for the rows of values, which the collector checks
against their table, in bulk. Two refusals are partial: a hello's bad table is left out (the
rest of the hello stands, see :func:`decode`), and a data message refused whole can still be
placed in its producer's numbering (:func:`rejected`), so one bad message never stalls the
messages after it.

>>> msg = decode(encode_hello(7, 0, run="r", role="actor_train", rank=1, world_size=2))
>>> (msg.run, msg.role, msg.rank, msg.world_size)
('r', 'actor_train', 1, 2)
"""

from __future__ import annotations

import os
import re
import socket
import time
from collections.abc import Mapping, Sequence

import msgspec

from rlpulse.schemas import protocol_v1
from rlpulse.schemas.checks import checked
from rlpulse.schemas.errors import SchemaError
from rlpulse.schemas.messages import (
    COLLECTOR_DROP_KEYS as COLLECTOR_DROP_KEYS,
    DEFAULT_LIMITS as DEFAULT_LIMITS,
    DROP_KEYS as DROP_KEYS,
    RELIABLE as RELIABLE,
    ROW_BYTES as ROW_BYTES,
    STAT_KEYS as STAT_KEYS,
    U63 as U63,
    Ack as Ack,
    Bye as Bye,
    Delta as Delta,
    Done as Done,
    Heartbeat as Heartbeat,
    Hello as Hello,
    Limits as Limits,
    Member as Member,
    Message as Message,
    Metrics as Metrics,
    RelayHello as RelayHello,
    Table as Table,
    TableDecl as TableDecl,
    WireEntry as WireEntry,
)

VERSION = 2
TAGS = {Hello: 21, Metrics: 22, Done: 23, Heartbeat: 24, Bye: 25, RelayHello: 27, Delta: 28}
"""The type tag of each version-2 message (the first element of its array)."""
_DECODER = msgspec.msgpack.Decoder(Hello | Metrics | Done | Heartbeat | Bye | RelayHello | Delta)
_ENCODER = msgspec.msgpack.Encoder()
_PATH = re.compile(r"at `\$((?:\[\d+\])*)`")
_MAP_FIRST_BYTES = frozenset(range(0x80, 0x90)) | {0xDE, 0xDF}
encode_ack = protocol_v1.encode_ack
MAX_PAYLOAD_BYTES = DEFAULT_LIMITS.max_bytes - 64 * 1024
"""The most a producer puts in one message, by :func:`packed_bytes`: its entries, or its
hello's tables. The decoder's default limit, less room for the envelope and the hello's
labels (the estimates are upper bounds already)."""


# ---------------------------------------------------------------------------- encoding


def new_producer_id() -> int:
    """A producer's (or relay's) id: 63 bits from the operating system's randomness. Never
    from the ``random`` module: every training program seeds it, so ranks (and runs) seeded
    alike would draw the same id and the collector would take one's data for the other's."""
    return int.from_bytes(os.urandom(8), "little") >> 1


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
    tables: Sequence[TableDecl] = (),
    metrics_url: str = "",
    logs: bool = True,
    resume: bool = False,
    config: bytes = b"",
    went_out: tuple[int, int] = (0, -1),
    sent: float = 0.0,
) -> bytes:
    """A hello; ``went_out``: ``(seq, step)`` of what went out so far (``Hello.went_out``);
    ``sent``: the producer's clock now (0: unstamped), from which the collector measures its
    clock's offset (``Hello.sent``)."""
    return _ENCODER.encode(
        Hello(
            producer,
            seq,
            run,
            role,
            rank,
            world_size,
            host if host is not None else socket.gethostname(),
            pid if pid is not None else os.getpid(),
            dict(expected or {}),
            list(tables),
            metrics_url,
            logs,
            resume,
            config,
            went_out,
            sent,
        )
    )


def pack_entry(
    step: int,
    t: float,
    table: int,
    values: bytes,
    nonfinite: Mapping[str, int] | None = None,
    sketches: Mapping[int, bytes] | None = None,
    samples: Mapping[int, bytes] | None = None,
) -> tuple:
    """One entry in wire form: ``table`` is the number of a table the hello declared;
    ``values`` is 4 little-endian float64 per name of it; ``nonfinite`` counts by name.
    ``sketches`` (table row -> ``rlpulse.schemas.sketch`` bytes, distribution metrics only)
    make a sixth element, which :func:`encode_metrics` moves to :attr:`Metrics.sketches`;
    ``samples`` (table row -> ``rlpulse.schemas.samples.encode`` bytes) a seventh, moved to
    :attr:`Metrics.samples`."""
    if samples:
        return (step, t, table, values, dict(nonfinite or {}), dict(sketches or {}), dict(samples))
    if sketches:
        return (step, t, table, values, dict(nonfinite or {}), dict(sketches))
    return (step, t, table, values, dict(nonfinite or {}))


def packed_bytes(entry: tuple) -> int:
    """An upper bound of the bytes one :func:`pack_entry` entry takes in a metrics message
    (msgpack: at most 9 bytes per integer or float, 5 per string, bytes or map header)."""
    values, nonfinite = entry[3], entry[4]
    size = 48 + len(values)
    for name in nonfinite:
        size += 14 + len(name.encode())
    for side in entry[5:]:  # sketches, then samples states: (entry, row, bytes) each
        size += sum(24 + len(buf) for buf in side.values())
    return size


def declared_bytes(names: Sequence[str], kinds: bytes | bytearray) -> int:
    """An upper bound of the bytes a :class:`TableDecl` of these names takes in a hello."""
    return 24 + len(kinds) + sum(5 + len(name.encode()) for name in names)


def encode_metrics(
    producer: int,
    seq: int,
    entries: Sequence[tuple],
    done: int = -1,
    incomplete: Sequence[int] = (),
) -> bytes:
    """``incomplete``: steps sent (or not sent) without some of their values
    (:attr:`Metrics.incomplete`); their element is written only when there are some."""
    if not incomplete and all(len(e) == 5 for e in entries):
        return _ENCODER.encode(Metrics(producer, seq, list(entries), done))
    sketches = [
        (i, row, sketch)
        for i, e in enumerate(entries)
        if len(e) > 5
        for row, sketch in e[5].items()
    ]
    samples = [
        (i, row, state) for i, e in enumerate(entries) if len(e) > 6 for row, state in e[6].items()
    ]
    plain = [e[:5] for e in entries]
    return _ENCODER.encode(Metrics(producer, seq, plain, done, sketches, samples, list(incomplete)))


def encode_done(producer: int, seq: int, step: int, incomplete: Sequence[int] = ()) -> bytes:
    return _ENCODER.encode(Done(producer, seq, step, list(incomplete)))


def encode_heartbeat(
    producer: int, seq: int, stats: Mapping[str, int], flush: bool = False, sent: float = 0.0
) -> bytes:
    """A heartbeat; ``sent`` as in :func:`encode_hello`."""
    return _ENCODER.encode(Heartbeat(producer, seq, dict(stats), flush, sent))


def encode_bye(
    producer: int, seq: int, stats: Mapping[str, int], incomplete: Sequence[int] = ()
) -> bytes:
    return _ENCODER.encode(Bye(producer, seq, dict(stats), list(incomplete)))


def encode(msg: Message) -> bytes:
    """Any version-2 message struct (the relay's own messages are built as structs)."""
    return _ENCODER.encode(msg)


# ---------------------------------------------------------------------------- decoding


def _reason(buf: bytes, exc: msgspec.ValidationError) -> SchemaError:
    """The reject reason of a version-2 message msgspec refused, from where it failed."""
    found = _PATH.search(str(exc))
    path = [int(i) for i in re.findall(r"\d+", found.group(1))] if found else []
    detail = f"{exc}"[:200]
    if path == [0]:
        return SchemaError("bad_version", f"not a message type of version 1 or 2: {detail}")
    if len(path) >= 2 and path[0] == 3:
        try:
            tag = msgspec.msgpack.decode(buf)[0]
        except Exception:
            tag = None
        if tag == TAGS[Metrics]:
            if len(path) >= 3 and path[2] == 0:
                return SchemaError("bad_step", f"step must be a non-negative integer: {detail}")
            return SchemaError("bad_entry", detail)
    return SchemaError("bad_field", detail)


def decode(
    buf: bytes, limits: Limits = DEFAULT_LIMITS, problems: list[SchemaError] | None = None
) -> Message:
    """Parse and validate one message of either version; raise :class:`SchemaError` saying
    what is wrong. A hello (or a relay's) with tables that break the limits is returned
    without them, and each left-out table is appended to ``problems`` (its id in ``data``)."""
    if len(buf) > limits.max_bytes:
        raise SchemaError(
            "oversized", f"message of {len(buf)} bytes exceeds the limit of {limits.max_bytes}"
        )
    if buf[:1] and buf[0] in _MAP_FIRST_BYTES:
        return protocol_v1.decode(buf, limits)
    try:
        msg = _DECODER.decode(buf)
    except msgspec.ValidationError as exc:
        raise _reason(buf, exc) from None
    except Exception as exc:  # DecodeError, and UnicodeDecodeError for a string that is not UTF-8
        raise SchemaError(
            "bad_msgpack", f"not a msgpack document: {type(exc).__name__}: {exc}"[:200]
        ) from None
    return checked(msg, limits, problems)


class Rejected(msgspec.Struct, frozen=True, gc=False):
    """A data message the collector refused, as far as it can still be read: whose it is,
    its number, why it was refused, and how many entries (``log()`` calls) it held. It takes
    the message's place in the producer's numbering (``rlpulse.collector.intake.delivery``), and the
    acknowledgement tells the producer what it lost, so the messages after it go on.

    >>> rejected(encode_done(7, 3, 2**63), SchemaError("bad_step", "too large"))
    Rejected(producer=7, seq=3, reason='bad_step', entries=0)
    """

    producer: int
    seq: int
    reason: str
    entries: int


class _Header(msgspec.Struct, array_like=True, frozen=True, gc=False):
    """The first fields every version-2 data message starts with (the rest is skipped)."""

    tag: int
    producer: U63
    seq: U63
    body: msgspec.Raw = msgspec.Raw(b"")


_HEADER = msgspec.msgpack.Decoder(_Header)
_ENTRY_COUNT = msgspec.msgpack.Decoder(list[msgspec.Raw])
_SEQUENCED_TAGS = frozenset(TAGS[kind] for kind in RELIABLE)


def rejected(buf: bytes, error: SchemaError) -> Rejected | None:
    """The :class:`Rejected` stand-in of a version-2 data message :func:`decode` refused with
    ``error``, when its type, producer and number can still be read; None otherwise (the
    message is then dropped unacknowledged, as any unreadable one)."""
    try:
        head = _HEADER.decode(buf)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    if head.tag not in _SEQUENCED_TAGS:
        return None
    entries = 0
    if head.tag == TAGS[Metrics]:
        try:
            entries = len(_ENTRY_COUNT.decode(head.body))
        except (msgspec.DecodeError, msgspec.ValidationError):
            entries = 1  # lost, whatever it held: count at least one call
    return Rejected(head.producer, head.seq, error.reason, entries)


_UINT_WIDTH = {0xCC: 1, 0xCD: 2, 0xCE: 4, 0xCF: 8}
"""msgpack's unsigned integers by their first byte: how many bytes follow."""
_PEEKED_TAGS = frozenset(TAGS[kind] for kind in (Metrics, Done, Bye, Delta))
_PEEKED_V1 = frozenset((protocol_v1.METRICS, protocol_v1.DONE, protocol_v1.BYE))


def peek_producer(buf: bytes | memoryview) -> int | None:
    """The producer of a data message (metrics, done, bye, a relay's delta; either version),
    read off its first bytes without decoding the rest; None for anything else (a hello, a
    heartbeat, bytes that are no message), which :func:`decode` then judges. Lets the
    collector let go of a large message it would not keep before paying to decode it.

    >>> peek_producer(encode_done(7, 3, 2)), peek_producer(protocol_v1.encode_done(9, 1, 2))
    (7, 9)
    >>> peek_producer(encode_heartbeat(7, 3, {})) is None
    True
    """
    head = bytes(buf[:64])
    try:
        first = head[0]
        if 0x90 <= first <= 0x9F or first in (0xDC, 0xDD):  # version 2: an array
            i = 1 if first <= 0x9F else 3 if first == 0xDC else 5
            if head[i] not in _PEEKED_TAGS:
                return None
            return _uint(head, i + 1)[0]
        if 0x80 <= first <= 0x8F or first in (0xDE, 0xDF):  # version 1: a map, "p" after "t"
            i = 1 if first <= 0x8F else 3 if first == 0xDE else 5
            kind: str | None = None
            for _ in range(4):
                key, i = _fixstr(head, i)
                value, i = _fixstr(head, i) if 0xA0 <= head[i] <= 0xBF else _uint(head, i)
                if key == "t":
                    kind = value  # type: ignore[assignment]
                elif key == "p":
                    return value if kind in _PEEKED_V1 else None  # type: ignore[return-value]
    except (IndexError, KeyError, TypeError, UnicodeDecodeError):
        pass
    return None


def _uint(head: bytes, i: int) -> tuple[int, int]:
    """The msgpack unsigned integer at ``head[i]``, and where the next item starts (KeyError
    if it is none)."""
    code = head[i]
    if code < 0x80:
        return code, i + 1
    width = _UINT_WIDTH[code]
    if len(head) < i + 1 + width:
        raise IndexError(i)
    return int.from_bytes(head[i + 1 : i + 1 + width], "big"), i + 1 + width


def _fixstr(head: bytes, i: int) -> tuple[str, int]:
    """The short msgpack string at ``head[i]``, and where the next item starts."""
    n = head[i] - 0xA0
    if not 0 <= n < 32 or len(head) < i + 1 + n:
        raise IndexError(i)
    return head[i + 1 : i + 1 + n].decode(), i + 1 + n


def now() -> float:
    """Wall-clock seconds, the time base of entry timestamps."""
    return time.time()
