"""Build decoded protocol messages as a version-2 producer sends them, and drive an
aggregator by hand with them.

A version-2 producer declares its lists of metric names as numbered tables in its hello, and
each entry refers to a table by number (``rlpulse.schemas.protocol``). :func:`metrics` takes
names and values as ``log()`` does and numbers the table of its names (:func:`table`);
:class:`Declaring` sends the hello again with a table before the first data that refers to
it, as the producer's sender does. :class:`Harness` and ``tests.collector.tiers.Tiers`` do
that for every message they deliver. The legacy version 1 is built only by the tests of its
decoding (``protocol_v1``).
"""

from __future__ import annotations

import array
from collections.abc import Iterable, Mapping, Sequence

import msgspec

from rlpulse.collector.config import CollectorConfig
from rlpulse.collector.runs.aggregator import Aggregator
from rlpulse.schemas import CATALOG, Summary, protocol as P
from rlpulse.schemas.record import StepRecord

TIMING = {"grace_s": 30.0, "liveness_s": 10.0, "settle_s": 0.0}
"""The aggregator timing most tests use: grace 30 s, liveness 10 s, no settle."""

FIRST_TABLE = 1000
""":func:`table` numbers from here: above the numbers of the tables tests build by hand (0
on), so :class:`Declaring` never takes one of those for one of its own."""
_TABLES: dict[tuple[tuple[str, ...], bytes], P.TableDecl] = {}
_BY_ID: dict[int, P.TableDecl] = {}


def table(names: Sequence[str]) -> P.TableDecl:
    """The table of ``names`` (reduction codes from the catalog). Numbered in order of first
    use in this process, the same for every producer: a hello may declare it before or after
    the data that refers to it is built."""
    kinds = bytes(int(CATALOG.resolve(n).reduction) for n in names)
    key = (tuple(names), kinds)
    decl = _TABLES.get(key)
    if decl is None:
        number = FIRST_TABLE + len(_TABLES)
        decl = _TABLES[key] = _BY_ID[number] = P.TableDecl(number, list(names), kinds)
    return decl


def hello(
    pid: int,
    run: str = "r",
    role: str = "actor_train",
    rank: int = 0,
    ws: int = 1,
    host: str = "host",
    tables: Iterable[P.TableDecl] = (),
    **kwargs,
) -> P.Hello:
    """Producer ``pid``'s hello (process id 1 on ``host``), encoded and decoded; ``kwargs``
    are :func:`protocol.encode_hello`'s (``resume``, ``metrics_url``, ``logs``...)."""
    msg = P.encode_hello(
        pid,
        1,
        run=run,
        role=role,
        rank=rank,
        world_size=ws,
        host=host,
        pid=1,
        tables=list(tables),
        **kwargs,
    )
    return P.decode(msg)  # type: ignore[return-value]


def metrics(
    pid: int, step: int, values: Mapping[str, Summary | float], t: float = 0.0, nonfinite=None
) -> P.Metrics:
    """One ``log(values, step)`` call of producer ``pid`` at time ``t``, in one message: a
    float is one sample, a :class:`Summary` a state; ``nonfinite`` counts by name."""
    rows = array.array("d")
    for v in values.values():
        state = v if isinstance(v, Summary) else Summary.of_scalar(v)
        rows.extend(state)
    entry = P.pack_entry(step, t, table(list(values)).id, rows.tobytes(), nonfinite)
    return P.decode(P.encode_metrics(pid, 1, [entry]))  # type: ignore[return-value]


class Declaring:
    """An aggregator fed as version-2 producers feed one: a producer's hello declares every
    table its data sent so far referred to, and its first data that refers to a table its
    hello did not declare comes after the hello again, with that table (what
    ``rlpulse.producer.sender`` does when a ``log()`` call brings a new list of names).
    Keeps, per producer, its last hello and the tables of its data.

    >>> agg = Aggregator(print, CollectorConfig(**TIMING))
    >>> feed = Declaring(agg)
    >>> feed.handle(hello(1), 0.0)
    >>> feed.handle(metrics(1, 0, {"x": 1.0}), 0.0)  # hello(1) again first, declaring "x"
    """

    def __init__(self, agg: Aggregator) -> None:
        self.agg = agg
        self.hellos: dict[int, P.Hello] = {}
        self.used: dict[int, dict[int, P.TableDecl]] = {}

    def handle(self, msg: P.Message, now: float, **kwargs) -> None:
        """``Aggregator.handle`` of ``msg`` (``kwargs`` too), after a hello that declares its
        tables when one must go first."""
        for said in self.declared(msg):
            self.agg.handle(said, now, **kwargs)

    def declared(self, msg: P.Message) -> list[P.Message]:
        """``msg``, after the hello that must go first, if any."""
        if isinstance(msg, P.Metrics):
            used = self.used.setdefault(msg.producer, {})
            for entry in msg.entries:  # a table numbered by :func:`table`
                if type(entry[2]) is int and entry[2] in _BY_ID:
                    used.setdefault(entry[2], _BY_ID[entry[2]])
            said = self.hellos.get(msg.producer)
            if said is not None and not used.keys() <= {d.id for d in said.tables}:
                return [self._declaring(said), msg]
        elif isinstance(msg, P.Hello):
            return [self._declaring(msg)]
        return [msg]

    def _declaring(self, msg: P.Hello) -> P.Hello:
        ids = {d.id for d in msg.tables}
        more = [d for i, d in self.used.get(msg.producer, {}).items() if i not in ids]
        if more:
            msg = msgspec.structs.replace(msg, tables=[*msg.tables, *more])
        self.hellos[msg.producer] = msg
        return msg


class Harness:
    """An aggregator driven by hand: messages in (each after the hello that declares its
    tables, :class:`Declaring`), emitted records collected, time advanced by the test (grace
    30 s, liveness 10 s, no settle unless overridden)."""

    def __init__(self, **kwargs) -> None:
        self.records: list[StepRecord] = []
        config = CollectorConfig(**{**TIMING, **kwargs})
        self.agg = Aggregator(self.records.append, config)
        self.now = 0.0
        self.feed = Declaring(self.agg)

    def send(self, *msgs: P.Message) -> None:
        for m in msgs:
            for said in self.feed.declared(m):
                self.agg.handle(said, self.now)  # a test may have swapped in its own agg
        self.agg.poll(self.now)

    def tick(self, seconds: float) -> None:
        self.now += seconds
        self.agg.poll(self.now)

    def steps(self) -> list[int]:
        return [r.step for r in self.records]

    def by_run(self, run: str) -> list[StepRecord]:
        return [r for r in self.records if r.run == run]


def through_a_restart(
    order: Sequence[P.Message], checkpoint_at: float, crash_at: float
) -> tuple[list[StepRecord], list[StepRecord]]:
    """``order`` into a collector that checkpoints at fraction ``checkpoint_at`` of the
    messages before the crash, crashes at fraction ``crash_at``, and is recovered as the
    daemon does it: the checkpoint restored, the steps emitted since noted from the outbox,
    the write-ahead log replayed from the oldest open step's first data. Then the rest.
    Return what it emitted in all, and what a collector that never stopped emitted."""
    end = int(crash_at * len(order))
    c = int(checkpoint_at * end)

    def feed(h: Harness, msgs: Sequence[P.Message], start: int) -> None:
        for i, msg in enumerate(msgs, start):
            h.agg.handle(msg, h.now, position=i)
            h.agg.poll(h.now)

    whole = Harness()
    feed(whole, order, 0)
    first = Harness()
    feed(first, order[:c], 0)
    snapshot, emitted_at_c = first.agg.snapshot(), len(first.records)
    oldest = first.agg.oldest_position()
    wal_from = c if oldest is None else int(oldest)  # type: ignore[call-overload]
    feed(first, order[c:end], c)  # then it crashes
    second = Harness()
    second.agg.restore(snapshot, 0.0)
    for record in first.records[emitted_at_c:]:  # in the sinks' outbox
        second.agg.note_emitted(record)
    for i in range(wal_from, end):
        second.agg.handle(order[i], 0.0, position=i, replay=True)
    second.agg.poll(0.0)
    feed(second, order[end:], end)
    return first.records + second.records, whole.records
