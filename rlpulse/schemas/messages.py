"""The messages of the wire protocol as the decoder returns them, the producer counters they
carry, the decoder's limits, and name tables. Encoding and decoding are ``rlpulse.schemas.protocol``'s
(version 2) and ``rlpulse.schemas.protocol_v1``'s (version 1, still accepted).

Messages are ``msgspec`` structs: version 2 decodes straight into them, with every field's
type and range checked in C; version 1 is parsed into the same structs. A metrics entry is a
tuple ``(step, time, table, values, nonfinite)``: ``table`` is a :class:`Table` in version 1
(names travel with each entry) and a table number in version 2 (names travel once, in the
producer's hello); ``values`` are the little-endian float64 rows of the states, four per name
(``rlpulse.schemas.values``); ``nonfinite`` counts NaN/Inf samples left out, by name (rare, so names
are fine there; a name all of whose samples were non-finite has no state, so it is not in the
table).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from msgspec import Meta, Struct

from rlpulse.schemas.errors import SchemaError
from rlpulse.schemas.reductions import Reduction
from rlpulse.schemas.spans import Span
from rlpulse.schemas.values import WIDTH

STAT_KEYS = (
    "logged",
    "sent_messages",
    "resent_messages",
    "unacked",
    "dropped_queue_full",
    "dropped_buffer_full",
    "dropped_send",
    "dropped_late",
    "dropped_conflict",
    "invalid",
    "nonfinite",
    "errors",
    "dropped_oversized",
    "dropped_rejected",
    "unconfirmed",
    "dropped_names",
    "samples_dropped",
    "samples_cut",
    "dropped_unreduced",
)
"""Producer counters carried by heartbeats and the goodbye (see ``rlpulse.producer.stats()``).
``unconfirmed`` (not a drop): calls sent but still unacknowledged when ``close()`` gave up,
which the collector may have merged; ``dropped_send`` counts only calls that never went out.
``samples_dropped`` and ``samples_cut`` (rows, not calls): rows of ``Samples`` values left out
as bad (``rlpulse.schemas.samples.clean_row``), and text fields cut to the byte limit.
``dropped_unreduced`` (values, not calls): values ``log()`` handed to the sender thread that
were dropped before it reduced them (beyond the producer's ``pending_limit_bytes``, or still
unreduced when ``close()`` had to end); the rest of their call still went, and their steps
were told to the collector as incomplete (:attr:`Metrics.incomplete`)."""
RELAY_STAT_KEYS = ("disk_errors", "state_unwritable")
"""What a relay's heartbeats add to the counters (``rlpulse.collector.tiers.upstream``): failed writes
under its ``state_dir``, and 1 while it cannot write there (0 otherwise). The collector above
shows them on its /metrics; a producer's heartbeats do not carry them."""
COLLECTOR_DROP_KEYS = ("dropped_late", "dropped_conflict", "dropped_rejected", "dropped_names")
"""Drops the collector counts itself and reports back in its acknowledgements."""
DROP_KEYS = (
    "dropped_queue_full",
    "dropped_buffer_full",
    "dropped_send",
    "dropped_oversized",
    "dropped_unreduced",
    *COLLECTOR_DROP_KEYS,
)
"""The counters of ``log()`` calls a producer dropped: its queue full, its unacknowledged
buffer full, never sent before it closed, or alone larger than a message may be (and of
values of calls dropped before the sender reduced them, ``dropped_unreduced``); or
delivered but not merged by the collector, which says so in its acknowledgements: late (their
step was already emitted), refused because another process holds the producer's (role, rank)
slot, in a message the collector rejected as malformed, or values of names the collector
left out (beyond its ``max_names_per_run``, or a name it computes itself)."""
ROW_BYTES = WIDTH * 8
"""Bytes of one state on the wire."""
KIND_CODES = frozenset(int(r) for r in Reduction)

U63_MAX = 2**63 - 1
"""The largest step, sequence number or count the wire carries (msgpack's signed range)."""
U63 = Annotated[int, Meta(ge=0, le=U63_MAX)]
MAX_STEP = 2**62 - 1
"""The largest step ``log()`` takes and the wire carries: the values above it, still in
:data:`U63`, are the collector's mark for a producer that has finished every step (its
goodbye), so the last step a producer may log is still finished by its goodbye. ``log()``
refuses a larger step and counts it (``stats()["invalid"]``); the collector rejects one
(``bad_step``)."""
Step = Annotated[int, Meta(ge=0, le=MAX_STEP)]
Incomplete = list[Step]
"""Steps a producer sent, or could not send, without some of its values (it dropped them
before reducing them: ``ProducerConfig.pending_limit_bytes``, or ``close()``): the collector
emits each partial, naming the producer's rank. Optional and last in :class:`Metrics`,
:class:`Done` and :class:`Bye`, so a collector that predates it ignores it."""
WentOut = tuple[U63, Annotated[int, Meta(ge=-1, le=MAX_STEP)]]
"""``(seq, step)`` of :attr:`Hello.went_out`; ``(0, -1)``: nothing went out yet. Messages from
the hello's ``seq`` (the oldest unacknowledged) up to this ``seq`` went out unacknowledged:
resent now, they may have been applied already by the collector that was there (one that
stopped, keeping no ``state_dir``, before it acknowledged them). Optional and last, so a
collector that predates it ignores it."""
Size = Annotated[int, Meta(ge=1, le=1 << 24)]
Rank = Annotated[int, Meta(ge=0, le=1 << 24)]
Finite = Annotated[float, Meta(ge=-1.7976931348623157e308, le=1.7976931348623157e308)]
WireEntry = tuple[Step, Finite, U63, bytes, dict[str, U63]]
"""``(step, time, table, values, nonfinite)`` as version 2 sends it. Version 1 is parsed into
the same tuple with a :class:`Table` for the number."""
SketchRef = tuple[U63, U63, bytes]
"""``(entry index, table row, sketch bytes)``: a distribution metric's quantile sketch."""
SampleRef = tuple[U63, U63, bytes]
"""``(entry index, table row, state bytes)``: a ``Samples`` value's state
(``rlpulse.schemas.samples.encode``)."""


@dataclass(frozen=True)
class Limits:
    """Bounds the decoder enforces on one message."""

    max_bytes: int = 8 * 1024 * 1024
    max_entries: int = 4096
    max_names: int = 10_000
    max_name_length: int = 256
    max_label_length: int = 128


DEFAULT_LIMITS = Limits()
"""The decoder's bounds unless a collector configures its own (``rlpulse.collector.config``)."""


class Table:
    """A validated list of metric names and their reduction codes, as one producer sends
    them. Compared by identity: the collector caches per table how its names map to rows.

    >>> Table(("a", "b"), bytes([1, 4])).size
    2
    """

    __slots__ = ("kinds", "names", "nbytes", "size")

    def __init__(self, names: tuple[str, ...], kinds: bytes) -> None:
        self.names = names
        self.kinds = kinds
        self.size = len(names)
        self.nbytes = self.size * ROW_BYTES

    @classmethod
    def shared(cls, names: tuple[str, ...], kinds: bytes) -> Table:
        """The one table for these names and codes (producers logging the same names share
        it, so the collector merges their entries together)."""
        key = (names, kinds)
        table = _SHARED.get(key)
        if table is None:
            if len(_SHARED) >= _SHARED_SIZE:
                _SHARED.clear()
            table = _SHARED[key] = cls(names, kinds)
        return table

    @classmethod
    def checked(cls, names: object, kinds: object, limits: Limits) -> Table:
        """A table from wire data; raise :class:`SchemaError` naming what is wrong."""
        if not isinstance(names, (list, tuple)) or len(names) > limits.max_names:
            raise SchemaError(
                "bad_names", f"names must be a list of at most {limits.max_names} strings"
            )
        for name in names:
            if type(name) is not str or not 0 < len(name) <= limits.max_name_length:
                raise SchemaError(
                    "bad_names",
                    f"metric name must be a string of 1..{limits.max_name_length} characters, "
                    f"got {name!r:.80}",
                )
        if len(set(names)) != len(names):
            raise SchemaError("bad_names", "an entry names the same metric twice")
        n = len(names)
        if type(kinds) is not bytes or len(kinds) != n or not set(kinds) <= KIND_CODES:
            raise SchemaError(
                "bad_kinds",
                f"kinds must be {n} bytes, each a reduction code in {sorted(KIND_CODES)}",
            )
        return cls(tuple(names), kinds)


_SHARED: dict[tuple[tuple[str, ...], bytes], Table] = {}
_SHARED_SIZE = 65_536


class TableDecl(Struct, array_like=True, frozen=True, gc=False):
    """A name table as a version-2 hello declares it: its number, names and codes."""

    id: U63
    names: list[str]
    kinds: bytes


class Hello(Struct, array_like=True, frozen=True, gc=False, tag=21):
    """Registration. ``seq`` is the producer's oldest unacknowledged sequence number: every
    reliable message below it has been acknowledged. ``tables`` (version 2) are every name
    table the producer's entries refer to. The last fields are optional, so a producer that
    predates them still decodes (and a collector that predates them ignores them)."""

    producer: U63
    seq: U63
    run: str
    role: str
    rank: Rank
    world_size: Size
    host: str
    pid: U63
    expected: dict[str, Size] = {}
    """The run's whole topology, role -> world size, when the producer knows it: the
    collector then waits for roles that have not registered yet."""
    tables: list[TableDecl] = []
    metrics_url: str = ""
    """A Prometheus ``/metrics`` URL the producer's process serves (``rlpulse.schemas.endpoint``), for
    the collector's service discovery; "" for none."""
    logs: bool = True
    """False: the producer only registers ``metrics_url`` and logs nothing, so it is no rank
    of its run: the collector never waits for it."""
    resume: bool = False
    """The producer continues a run that may already have ended on this collector (a job
    restarted from a checkpoint): the collector then continues that run instead of starting
    a new attempt of it (``rlpulse.collector.runs.membership``)."""
    config: bytes = b""
    """The run's configuration, its hyper-parameters (``rlpulse.schemas.runconfig``: a msgpack
    map of plain data, at most ``runconfig.MAX_BYTES``), as the producer last gave it; b"" for
    none. Checked by the collector when it changes (``bad_config``)."""
    went_out: WentOut = (0, -1)
    """``(seq, step)``: the highest sequence number, and the highest step of a ``log()`` call,
    among this producer's data messages that went out so far, to whichever collector was
    there (:data:`WentOut`). A collector that keeps no ``state_dir`` learns from it what an
    earlier instance of it may have applied (``rlpulse.collector.runs.earlier``)."""
    sent: Finite = 0.0
    """The producer's wall clock (``time.time()``, the clock of its ``log()`` times) when it
    sent this message; 0: not stamped (a producer that predates it). The collector measures
    the producer's clock offset from it (``rlpulse.collector.intake.clock``)."""


class Metrics(Struct, array_like=True, frozen=True, gc=False, tag=22):
    """A batch of ``log()`` calls (:data:`WireEntry`). ``done`` >= 0 also says the producer
    has finished every step up to it (a ``done`` message folded in)."""

    producer: U63
    seq: U63
    entries: list[WireEntry]
    done: Annotated[int, Meta(ge=-1, le=MAX_STEP)] = -1
    sketches: list[SketchRef] = []
    """``(entry, row, sketch)``: the quantile sketch (``rlpulse.schemas.sketch``) of row
    ``row`` of entry ``entry``'s table, for distribution metrics. Optional and last, so a
    collector that predates it reads the message as before (mean, max and min only)."""
    samples: list[SampleRef] = []
    """``(entry, row, state)``: the samples state (``rlpulse.schemas.samples``) of row ``row``
    of entry ``entry``'s table, whose value counts the rows. Optional, as ``sketches``: a
    collector that predates it reads the row count only."""
    incomplete: Incomplete = []
    """Steps this producer sent, or could not send, without some of their values
    (:data:`Incomplete`); the entries of this message may be for other steps."""


class Done(Struct, array_like=True, frozen=True, gc=False, tag=23):
    """The producer has finished every step up to and including ``step``."""

    producer: U63
    seq: U63
    step: Step
    incomplete: Incomplete = []
    """As in :class:`Metrics`."""


class Heartbeat(Struct, array_like=True, frozen=True, gc=False, tag=24):
    """Liveness and the producer's counters. ``flush`` asks for an acknowledgement now: the
    collector otherwise acknowledges data up to ``ACK_DELAY_S`` late (one ack per producer
    per interval, not one per message), and a ``flush()`` or ``close()`` is waiting."""

    producer: U63
    seq: U63
    stats: dict[str, U63]
    flush: bool = False
    sent: Finite = 0.0
    """As :attr:`Hello.sent`: when the producer sent it, on its clock (0: not stamped)."""


class Bye(Struct, array_like=True, frozen=True, gc=False, tag=25):
    """The producer is closing: it has finished every step it will log."""

    producer: U63
    seq: U63
    stats: dict[str, U63]
    incomplete: Incomplete = []
    """As in :class:`Metrics`: typically the steps whose values ``close()`` could not reduce
    in time."""


class Ack(Struct, array_like=True, frozen=True, gc=False, tag=26):
    """Collector to producer: every reliable message up to ``seq`` is durably accepted.

    Accepted is not merged: ``late`` and ``conflict`` count, cumulatively, the producer's
    entries the collector delivered but left out (their step was already emitted; another
    process holds the producer's slot), so the producer's ``stats()`` says what it lost.
    ``run`` is the run the collector records the producer under, when it differs from the
    name the producer gave (a new attempt of a run that already ended: ``name-2``).
    ``rejected`` counts, cumulatively, the entries of the producer's messages the collector
    rejected as malformed but acknowledged all the same, so they are not resent forever."""

    producer: U63
    seq: U63
    late: U63 = 0
    conflict: U63 = 0
    run: str = ""
    rejected: U63 = 0
    hold: bool = False
    """Stop sending data for now: the collector holds this producer back (it is ahead of
    the others and its run holds ``max_open_steps`` open steps); nothing after ``seq`` was
    applied yet (what it sent meanwhile is kept, within a bound, and applied once there is
    room). A later ack with ``resend`` lets it go on."""
    resend: bool = False
    """Send again, now, everything not acknowledged: the collector has room again, and some
    of what this producer sent while held did not fit in what it keeps."""
    go: bool = False
    """Go on sending what was not sent yet: the collector has room again and kept
    everything this producer sent while held (applied now, or still on its way)."""
    members: tuple[tuple[int, int], ...] = ()
    """To a relay: ``(member, late)`` for each producer behind it some of whose entries this
    collector left out as late (cumulative), so the relay tells each producer."""
    names: U63 = 0
    """Cumulatively, values of the producer's entries left out because their name was one too
    many for its run (``max_names_per_run``) or is one the collector computes itself."""
    asks: bool = False
    """This collector asks for what it misses (``resend`` when a producer's message or
    heartbeat shows a gap), so the producer never resends on a timer alone."""
    stopping: bool = False
    """The collector's last acknowledgement before it stops: it applied nothing of this
    producer's after ``seq`` and applies nothing more, so what went out unacknowledged was not
    applied (the next hello's :attr:`Hello.went_out` leaves it out)."""


class Member(Struct, array_like=True, frozen=True, gc=False):
    """A producer behind a relay, as the relay announces it upstream: its registration, and
    whether the relay presumes it gone (silent for ``liveness_s``)."""

    producer: U63
    run: str
    role: str
    rank: Rank
    world_size: Size
    host: str
    expected: dict[str, Size] = {}
    gone: bool = False
    metrics_url: str = ""
    logs: bool = True
    resume: bool = False
    config: bytes = b""
    """``metrics_url``, ``logs``, ``resume`` and ``config`` as in :class:`Hello`."""


class RelayHello(Struct, array_like=True, frozen=True, gc=False, tag=27):
    """A relay (a collector with an ``upstream``) registering with the collector above it:
    ``seq`` as in :class:`Hello`; ``tables`` its entries refer to; ``members`` the producers it
    speaks for. Sent again whenever a table or a member is new or changed."""

    producer: U63
    seq: U63
    host: str
    pid: U63
    tables: list[TableDecl] = []
    members: list[Member] = []
    sent: Finite = 0.0
    """As :attr:`Hello.sent`: when the relay sent it, on its clock (0: not stamped)."""


class Delta(Struct, array_like=True, frozen=True, gc=False, tag=28):
    """What a relay forwards: for one run, merged entries ``(step, t_first, t_last, table,
    values, nonfinite, contributors, roles)`` (states, never means: the relay's ranks pooled;
    ``contributors`` the producers whose data is in it, ``roles`` per table row the roles that
    logged it, joined by ``+``), then ``watermarks`` ``(member, step)``: each member has
    finished every step up to it and all its data for them has been forwarded."""

    producer: U63
    seq: U63
    run: str
    entries: list[tuple[Step, Finite, Finite, U63, bytes, dict[str, U63], list[U63], list[str]]]
    watermarks: list[tuple[U63, U63]]
    spans: list[tuple[U63, Span]] = []
    """``(step, span)``: the phases the relay's ranks ran (``rlpulse.schemas.spans``), kept per rank."""
    sketches: list[SketchRef] = []
    """Merged quantile sketches of the entries' distribution metrics, as in :class:`Metrics`."""
    samples: list[SampleRef] = []
    """Merged samples states of the entries' ``Samples`` names, as in :class:`Metrics`."""
    incomplete: list[tuple[U63, Step]] = []
    """``(member, step)``: a producer behind the relay said it sent ``step`` without some of
    its values (:data:`Incomplete`), so the collector above emits that step partial naming
    the member's rank. Optional and last."""


Message = Hello | Metrics | Done | Heartbeat | Bye | Ack | RelayHello | Delta
RELIABLE = (Metrics, Done, Bye, Delta)
"""Messages that carry data: sequenced, acknowledged, resent until acknowledged."""
