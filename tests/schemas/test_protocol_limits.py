"""The decoder's limits never cost more than what breaks them (issue 22, items 4 and 6): a
hello's bad table is left out and reported, its good tables kept; a data message refused
whole can still be placed in its producer's numbering, and the collector's sequencing then
goes on past it instead of waiting forever."""

from __future__ import annotations

import msgspec
import pytest

from rlpulse.collector.intake.delivery import Delivery
from rlpulse.schemas import protocol, protocol_v1
from rlpulse.schemas.errors import SchemaError
from rlpulse.schemas.messages import DEFAULT_LIMITS, Member

LONG = "y" * (DEFAULT_LIMITS.max_name_length + 1)
GOOD = protocol.TableDecl(0, ["loss"], bytes([1]))
TOO_LONG = protocol.TableDecl(1, ["ok", LONG], bytes([1, 1]))
TOO_MANY = protocol.TableDecl(
    2, [f"m{i}" for i in range(DEFAULT_LIMITS.max_names + 1)], b"\1" * 10_001
)
BAD_KINDS = protocol.TableDecl(3, ["a"], bytes([99]))
LATER = protocol.TableDecl(4, ["loss", "acc"], bytes([1, 1]))


def hello(*tables: protocol.TableDecl, producer: int = 7, seq: int = 1) -> bytes:
    return protocol.encode_hello(
        producer, seq, run="r", role="a", rank=0, world_size=1, tables=tables
    )


# ---------------------------------------------------------------------------- tables


def test_a_hello_keeps_its_good_tables_and_reports_each_bad_one() -> None:
    problems: list[SchemaError] = []
    msg = protocol.decode(hello(GOOD, TOO_LONG, TOO_MANY, BAD_KINDS, LATER), problems=problems)
    assert isinstance(msg, protocol.Hello)
    assert [t.id for t in msg.tables] == [0, 4]
    assert [(p.reason, p.data) for p in problems] == [
        ("bad_names", 1),
        ("bad_names", 2),
        ("bad_kinds", 3),
    ]
    assert "table 1" in problems[0].detail


def test_a_hello_with_only_good_tables_is_returned_as_it_is() -> None:
    problems: list[SchemaError] = []
    raw = hello(GOOD, LATER)
    assert protocol.decode(raw, problems=problems) == protocol.decode(raw)
    assert problems == []


def test_a_relay_hello_keeps_its_good_tables_too() -> None:
    relay = protocol.RelayHello(3, 1, "h", 1, [GOOD, TOO_LONG], [Member(9, "r", "a", 0, 1, "h")])
    problems: list[SchemaError] = []
    msg = protocol.decode(protocol.encode(relay), problems=problems)
    assert [t.id for t in msg.tables] == [0] and [p.data for p in problems] == [1]


def test_a_table_number_declared_twice_still_refuses_the_hello() -> None:
    with pytest.raises(SchemaError) as err:
        protocol.decode(hello(GOOD, protocol.TableDecl(0, ["x"], bytes([1]))))
    assert err.value.reason == "bad_field"


# ---------------------------------------------------------------------------- rejected


def refused(raw: bytes, limits: protocol.Limits = DEFAULT_LIMITS) -> protocol.Rejected | None:
    with pytest.raises(SchemaError) as err:
        protocol.decode(raw, limits)
    return protocol.rejected(raw, err.value)


def test_a_refused_data_message_is_placed_by_its_header() -> None:
    entry = protocol.pack_entry(2**63, 0.0, 0, b"")
    assert refused(protocol.encode_metrics(9, 4, [entry] * 3)) == protocol.Rejected(
        9, 4, "bad_step", 3
    )
    assert refused(protocol.encode_done(9, 5, 2**63)) == protocol.Rejected(9, 5, "bad_field", 0)
    small = protocol.Limits(max_bytes=64)
    big = protocol.encode_metrics(9, 6, [protocol.pack_entry(1, 0.0, 0, b"\0" * 64)])
    assert refused(big, small) == protocol.Rejected(9, 6, "oversized", 1)


def test_what_cannot_be_placed_is_not() -> None:
    bad_hello = protocol.encode_hello(7, 1, run="", role="a", rank=0, world_size=1)
    assert refused(bad_hello) is None  # no sequence number of its own
    assert refused(msgspec.msgpack.encode([22, 9])) is None  # no number
    assert refused(msgspec.msgpack.encode([22, -1, 4, []])) is None  # no producer
    assert refused(b"\xc1garbage") is None
    assert refused(protocol_v1.encode_done(9, 1, -2)) is None  # version 1: not read


def test_an_ack_carries_the_rejected_count_both_ways() -> None:
    ack = protocol.decode(protocol.encode_ack(7, 12, rejected=40))
    assert isinstance(ack, protocol.Ack) and (ack.seq, ack.rejected) == (12, 40)
    assert protocol.decode(protocol.encode_ack(7, 12)).rejected == 0


# ---------------------------------------------------------------------------- sequencing


def seqs(out: list) -> list[int]:
    return [m.seq for m, _ in out]


def done(seq: int) -> protocol.Done:
    return protocol.Done(7, seq, seq)


def test_a_rejected_message_takes_its_number_and_is_acknowledged_as_rejected() -> None:
    d = Delivery()
    d.accept(protocol.decode(hello(GOOD)), b"id")
    assert seqs(d.accept(done(1), b"id")) == [1]
    assert d.accept(protocol.Rejected(7, 2, "oversized", 25), b"id") == []
    assert seqs(d.accept(done(3), b"id")) == [3]  # no gap: 3 follows the rejected 2
    assert d.accept(protocol.Rejected(7, 2, "oversized", 25), b"id") == []  # a resend
    ((_, raw),) = d.acks()
    ack = protocol.decode(raw)
    assert (ack.seq, ack.rejected) == (3, 25) and d.health.duplicates == 1


def test_a_rejected_message_of_a_producer_not_registered_yet_is_held() -> None:
    d = Delivery()
    assert d.accept(protocol.Rejected(7, 1, "bad_step", 2), b"id") == []
    assert d.accept(done(2), b"id") == []
    assert seqs(d.accept(protocol.decode(hello(GOOD)), b"id")) == [1, 2]  # the hello, then 2
    assert d.rejected == {7: 2}


def test_a_hello_past_what_the_collector_remembers_moves_it_on() -> None:
    """A rejection was acknowledged but never reached the write-ahead log, and the collector
    restarted: the producer's hello says it has nothing below 3 left, so 3 follows."""
    d = Delivery()
    d.restore({"7": 1})
    d.accept(protocol.decode(hello(GOOD, seq=3)), b"id")
    assert seqs(d.accept(done(3), b"id")) == [3]
    d.accept(protocol.decode(hello(GOOD, seq=2)), b"id")  # an old hello never moves it back
    assert d.last_seq[7] == 3
