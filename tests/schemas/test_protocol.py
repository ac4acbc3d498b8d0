"""The decoder accepts what producers send, in version 2 and version 1, and rejects anything
else with a reason."""

from __future__ import annotations

import array
import contextlib
import math

import msgpack
import pytest
from hypothesis import given, settings, strategies as st

from rlpulse.schemas import SchemaError, protocol as P, protocol_v1 as V1
from rlpulse.schemas.messages import Table, TableDecl

VALUES = array.array("d", (1, 1, 1, 1, 2, 1, 2, 2)).tobytes()


def entry(
    names=("a", "b"), kinds=bytes([1, 4]), values=(1, 1, 1, 1, 2, 1, 2, 2), step=3, nonfinite=None
):
    """A version-1 entry (names inline)."""
    return V1.pack_entry(
        step, 1.5, list(names), kinds, array.array("d", values).tobytes(), nonfinite
    )


def hello2(**kwargs) -> bytes:
    args = {"run": "r", "role": "critic", "rank": 0, "world_size": 1, "host": "h", "pid": 9}
    return P.encode_hello(5, 0, **(args | kwargs))


def raw(obj) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)


def test_round_trip_of_every_version_2_message() -> None:
    table = TableDecl(0, ["a", "b"], bytes([1, 4]))
    hello = P.decode(hello2(expected={"critic": 1, "actor_train": 4}, tables=[table]))
    assert hello == P.Hello(
        5, 0, "r", "critic", 0, 1, "h", 9, {"critic": 1, "actor_train": 4}, [table]
    )
    metrics = P.decode(P.encode_metrics(5, 1, [P.pack_entry(3, 1.5, 0, VALUES, {"a": 2})], done=2))
    assert isinstance(metrics, P.Metrics) and (metrics.seq, metrics.done) == (1, 2)
    assert metrics.entries == [(3, 1.5, 0, VALUES, {"a": 2})]
    assert P.decode(P.encode_done(5, 2, 7)) == P.Done(5, 2, 7)
    stats = dict.fromkeys(P.STAT_KEYS, 0) | {"dropped_send": 4}
    assert P.decode(P.encode_heartbeat(5, 3, stats)).stats == stats
    assert P.decode(P.encode_bye(5, 4, stats | {"from_the_future": 1})).stats == stats
    assert P.decode(P.encode_ack(5, 4)) == P.Ack(5, 4)


def test_version_1_is_parsed_into_the_same_messages() -> None:
    hello = P.decode(
        V1.encode_hello(5, 0, run="r", role="critic", rank=0, world_size=1, host="h", pid=9)
    )
    assert hello == P.Hello(5, 0, "r", "critic", 0, 1, "h", 9)
    metrics = P.decode(V1.encode_metrics(5, 1, [entry(nonfinite={"a": 2})]))
    assert isinstance(metrics, P.Metrics) and (metrics.seq, metrics.done) == (1, -1)
    ((step, t, table, values, nonfinite),) = metrics.entries
    assert (step, t, values, nonfinite) == (3, 1.5, VALUES, {"a": 2})
    assert isinstance(table, Table) and (table.names, table.kinds) == (("a", "b"), bytes([1, 4]))
    again = P.decode(V1.encode_metrics(5, 2, [entry()]))
    assert again.entries[0][2] is table  # one table per name list: the collector caches by it
    assert P.decode(V1.encode_done(5, 2, 7)) == P.Done(5, 2, 7)


BAD = {
    "bad_msgpack": b"\xc1\xc1garbage",
    "bad_envelope": raw([1, 2, 3]),
    "bad_version": raw({"v": 99, "t": "done", "p": 1, "q": 0, "s": 1}),
    "unknown type": raw({"v": 1, "t": "nope", "p": 1, "q": 0}),
    "negative step": raw({"v": 1, "t": "done", "p": 1, "q": 0, "s": -1}),
    "float producer": raw({"v": 1, "t": "done", "p": 1.5, "q": 0, "s": 1}),
    "rank >= world size": raw(
        {
            "v": 1,
            "t": "hello",
            "p": 1,
            "q": 0,
            "run": "r",
            "role": "a",
            "rank": 2,
            "ws": 2,
            "host": "h",
            "pid": 1,
        }
    ),
    "empty run": raw(
        {
            "v": 1,
            "t": "hello",
            "p": 1,
            "q": 0,
            "run": "",
            "role": "a",
            "rank": 0,
            "ws": 1,
            "host": "h",
            "pid": 1,
        }
    ),
    "no entries": raw({"v": 1, "t": "metrics", "p": 1, "q": 0, "e": []}),
    "short values": V1.encode_metrics(1, 0, [entry(values=(1, 1, 1))]),
    "kind code": V1.encode_metrics(1, 0, [entry(kinds=bytes([1, 99]))]),
    "duplicate name": V1.encode_metrics(1, 0, [entry(names=("a", "a"))]),
    "NaN sum": V1.encode_metrics(1, 0, [entry(values=(math.nan, 1, 1, 1, 2, 1, 2, 2))]),
    "Inf weight": V1.encode_metrics(1, 0, [entry(values=(1, math.inf, 1, 1, 2, 1, 2, 2))]),
    "negative weight": V1.encode_metrics(1, 0, [entry(values=(1, -1, 1, 1, 2, 1, 2, 2))]),
    "Inf max": V1.encode_metrics(1, 0, [entry(values=(1, 1, 1, math.inf, 2, 1, 2, 2))]),
    "min > max": V1.encode_metrics(1, 0, [entry(values=(1, 1, 5, 1, 2, 1, 2, 2))]),
    "ext type": raw({"v": 1, "t": "done", "p": 1, "q": 0, "s": msgpack.ExtType(5, b"x")}),
    "timestamp ext": msgpack.packb(
        {
            "v": 1,
            "t": "done",
            "p": 1,
            "q": 0,
            "s": __import__("datetime").datetime.now(__import__("datetime").timezone.utc),
        },
        datetime=True,
    ),
    "stats not a map": raw({"v": 1, "t": "heartbeat", "p": 1, "q": 0, "st": [1]}),
    "bad roles": raw(
        {
            "v": 1,
            "t": "hello",
            "p": 1,
            "q": 0,
            "run": "r",
            "role": "a",
            "rank": 0,
            "ws": 1,
            "host": "h",
            "pid": 1,
            "roles": {"a": 0},
        }
    ),
    "name too long": V1.encode_metrics(1, 0, [entry(names=("a" * 300, "b"))]),
    "v2 unknown tag": raw([99, 1, 0]),
    "v2 negative step": P.encode_metrics(1, 0, [(-1, 1.5, 0, VALUES, {})]),
    "v2 NaN time": P.encode_metrics(1, 0, [(1, math.nan, 0, VALUES, {})]),
    "v2 infinite time": P.encode_metrics(1, 0, [(1, math.inf, 0, VALUES, {})]),
    "v2 no entries": P.encode_metrics(1, 0, []),
    "v2 string table": raw([22, 1, 0, [[1, 1.5, "t", VALUES, {}]], -1]),
    "v2 producer too big": raw([23, 2**64 - 1, 0, 1]),
    "v2 done below -1": raw([22, 1, 0, [[1, 1.5, 0, VALUES, {}]], -2]),
    "v2 rank >= world size": hello2(rank=1),
    "v2 empty role": hello2(role=""),
    "v2 table declared twice": hello2(tables=[TableDecl(0, ["a"], b"\x01")] * 2),
    # A hello's bad table (a name too long, kinds short, a bad kind code) is left out, not
    # the hello: tests/schemas/test_protocol_limits.py.
    "v2 stats not counts": raw([24, 1, 0, {"logged": -1}]),
}


def test_version_2_entries_reach_the_collector_unchecked_only_for_their_rows() -> None:
    """Rows are checked by the collector against the producer's table, in bulk: the decoder
    cannot know the table's size (see tests/collector for the rejects)."""
    msg = P.decode(P.encode_metrics(1, 0, [(1, 1.5, 7, b"\x00" * 3, {})]))
    assert msg.entries[0][3] == b"\x00" * 3


@pytest.mark.parametrize("case", sorted(BAD))
def test_malformed_messages_are_rejected_with_a_reason(case: str) -> None:
    with pytest.raises(SchemaError) as info:
        P.decode(BAD[case])
    assert info.value.reason and info.value.detail


def test_oversized_is_its_own_reason() -> None:
    with pytest.raises(SchemaError) as info:
        P.decode(b"\x00" * 100, P.Limits(max_bytes=50))
    assert info.value.reason == "oversized"


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_random_bytes_raise_only_schema_errors(data: bytes) -> None:
    with contextlib.suppress(SchemaError):
        P.decode(data)


json_like = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats()
    | st.text(max_size=5)
    | st.binary(max_size=8),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=3), children, max_size=4)
    ),
    max_leaves=12,
)


@settings(max_examples=300, deadline=None)
@given(
    st.fixed_dictionaries(
        {
            "v": st.just(1),
            "t": st.sampled_from(["hello", "metrics", "done", "heartbeat", "bye"]),
            "p": st.integers(0, 5),
            "q": st.integers(0, 5),
        },
        optional={"e": json_like, "s": json_like, "st": json_like, "run": json_like},
    )
)
def test_wrong_shapes_raise_only_schema_errors(obj: dict) -> None:
    with contextlib.suppress(SchemaError):
        P.decode(raw(obj))


@settings(max_examples=300, deadline=None)
@given(st.integers(20, 27), st.lists(json_like, max_size=6))
def test_wrong_version_2_shapes_raise_only_schema_errors(tag: int, rest: list) -> None:
    with contextlib.suppress(SchemaError):
        P.decode(raw([tag, *rest]))


def test_peek_producer_reads_a_data_messages_producer_off_its_first_bytes() -> None:
    """Issue 38 item 7: the collector screens large messages by producer before decoding."""
    from rlpulse.schemas import protocol, protocol_v1

    big = 2**62 + 5
    assert protocol.peek_producer(protocol.encode_done(big, 1, 3)) == big
    assert protocol.peek_producer(protocol.encode_metrics(300, 1, [])) == 300
    assert protocol.peek_producer(protocol.encode_bye(70_000, 1, {})) == 70_000
    assert protocol.peek_producer(protocol_v1.encode_metrics(9, 1, [])) == 9
    assert protocol.peek_producer(protocol_v1.encode_done(2**40, 1, 0)) == 2**40
    hello = protocol.encode_hello(3, 0, run="r", role="actor_train", rank=0, world_size=1)
    for other in (
        hello,
        protocol_v1.encode_hello(3, 0, run="r", role="actor_train", rank=0, world_size=1),
        protocol.encode_heartbeat(3, 0, {}),
        b"",
        b"\x93",
        b"\x93\x16",  # cut after the tag
        b"\x93\x16\xcf\x00",  # cut inside the producer
        b"garbage",
    ):
        assert protocol.peek_producer(other) is None, other


def test_an_ack_to_a_relay_carries_its_members_late_counts() -> None:
    """Issue 38, item 4: ``m`` tells a relay which of its producers lost entries as late."""
    ack = P.decode(P.encode_ack(9, 4, members=[(11, 3), (12, 1)]))
    assert ack.members == ((11, 3), (12, 1)) and ack.late == 0
    assert P.decode(P.encode_ack(9, 4)).members == ()
    bad = V1._pack({"v": 1, "t": "ack", "p": 9, "q": 4, "m": [[1, -2]]})
    with pytest.raises(SchemaError):
        P.decode(bad)


def test_incomplete_steps_ride_last_and_an_older_decoder_ignores_them() -> None:
    """Issue 46, item 1: steps a producer sent without some of their values, told in the
    optional last element of metrics, done and bye (and a relay's delta). A decoder of an
    earlier release, whose structs end before it, reads the messages as before; this one reads
    a message without it as none."""
    import msgspec

    metrics = P.encode_metrics(5, 1, [P.pack_entry(3, 1.5, 0, VALUES)], -1, [1, 2])
    assert P.decode(metrics).incomplete == [1, 2]  # type: ignore[union-attr]
    assert P.decode(P.encode_done(5, 2, 7, [7])) == P.Done(5, 2, 7, [7])
    assert P.decode(P.encode_bye(5, 3, {}, [9])).incomplete == [9]  # type: ignore[union-attr]
    assert P.decode(P.encode_metrics(5, 1, [P.pack_entry(3, 1.5, 0, VALUES)])).incomplete == []  # type: ignore[union-attr]
    delta = P.Delta(1, 1, "r", [], [], incomplete=[(7, 3)])
    assert P.decode(P.encode(delta)).incomplete == [(7, 3)]  # type: ignore[union-attr]

    class OldMetrics(msgspec.Struct, array_like=True, tag=22):
        producer: int
        seq: int
        entries: list[tuple[int, float, int, bytes, dict[str, int]]]
        done: int = -1
        sketches: list = []
        samples: list = []

    class OldDone(msgspec.Struct, array_like=True, tag=23):
        producer: int
        seq: int
        step: int

    class OldBye(msgspec.Struct, array_like=True, tag=25):
        producer: int
        seq: int
        stats: dict[str, int]

    old = msgspec.msgpack.Decoder(OldMetrics | OldDone | OldBye)
    assert old.decode(metrics).entries == [(3, 1.5, 0, VALUES, {})]  # type: ignore[union-attr]
    assert old.decode(P.encode_done(5, 2, 7, [7])) == OldDone(5, 2, 7)
    assert old.decode(P.encode_bye(5, 3, {"logged": 1}, [9])) == OldBye(5, 3, {"logged": 1})


def test_more_incomplete_steps_than_entries_a_message_may_hold_is_a_bad_field() -> None:
    too_many = list(range(P.DEFAULT_LIMITS.max_entries + 1))
    for buf in (P.encode_done(5, 2, 7, too_many), P.encode_bye(5, 3, {}, too_many)):
        with pytest.raises(SchemaError) as err:
            P.decode(buf)
        assert err.value.reason == "bad_field"


def test_a_hello_says_what_went_out_last_and_an_older_decoder_ignores_it() -> None:
    """``Hello.went_out`` (seq, step): optional and last. A decoder of an earlier release reads
    the hello as before; this one reads a hello without it as nothing gone out, and refuses a
    step below -1."""
    import msgspec

    said = P.encode_hello(5, 4, run="r", role="a", rank=0, world_size=1, went_out=(9, 12))
    assert P.decode(said).went_out == (9, 12)  # type: ignore[union-attr]
    plain = P.encode_hello(5, 1, run="r", role="a", rank=0, world_size=1)
    assert P.decode(plain).went_out == (0, -1)  # type: ignore[union-attr]

    class OldHello(msgspec.Struct, array_like=True, tag=21):
        producer: int
        seq: int
        run: str
        role: str
        rank: int
        world_size: int
        host: str
        pid: int
        expected: dict[str, int] = {}
        tables: list = []
        metrics_url: str = ""
        logs: bool = True
        resume: bool = False

    old = msgspec.msgpack.Decoder(OldHello).decode(said)
    assert (old.producer, old.seq, old.run, old.resume) == (5, 4, "r", False)
    older = msgspec.msgpack.encode(OldHello(5, 4, "r", "a", 0, 1, "h", 1))
    assert P.decode(older).went_out == (0, -1)  # type: ignore[union-attr]
    with pytest.raises(SchemaError):
        P.decode(P.encode_hello(5, 4, run="r", role="a", rank=0, world_size=1, went_out=(1, -2)))
