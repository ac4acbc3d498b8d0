"""The decoder accepts what producers send and rejects anything else with a reason."""

from __future__ import annotations

import array
import contextlib
import math

import msgpack
import pytest
from hypothesis import given, settings, strategies as st

from schemas import SchemaError, protocol as P


def entry(
    names=("a", "b"), kinds=bytes([1, 4]), values=(1, 1, 1, 1, 2, 1, 2, 2), step=3, nonfinite=None
):
    return P.pack_entry(
        step, 1.5, list(names), kinds, array.array("d", values).tobytes(), nonfinite
    )


def raw(obj) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)


def test_round_trip_of_every_message_type() -> None:
    hello = P.decode(
        P.encode_hello(5, 0, run="r", role="critic", rank=0, world_size=1, host="h", pid=9)
    )
    assert hello == P.Hello(5, 0, "r", "critic", 0, 1, "h", 9)
    declared = P.decode(
        P.encode_hello(
            5,
            0,
            run="r",
            role="critic",
            rank=0,
            world_size=1,
            host="h",
            pid=9,
            expected={"critic": 1, "actor_train": 4},
        )
    )
    assert declared.expected == {"critic": 1, "actor_train": 4}
    metrics = P.decode(P.encode_metrics(5, 1, [entry(nonfinite={"a": 2})]))
    assert isinstance(metrics, P.Metrics) and metrics.seq == 1
    (e,) = metrics.entries
    assert (e.step, e.names, e.kinds, dict(e.nonfinite)) == (3, ("a", "b"), bytes([1, 4]), {"a": 2})
    assert e.values.tolist() == [[1, 1, 1, 1], [2, 1, 2, 2]]
    assert P.decode(P.encode_done(5, 2, 7)) == P.Done(5, 2, 7)
    stats = dict.fromkeys(P.STAT_KEYS, 0) | {"dropped_send": 4}
    assert P.decode(P.encode_heartbeat(5, 3, stats)).stats == stats
    assert P.decode(P.encode_bye(5, 4, stats)).stats == stats


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
    "short values": P.encode_metrics(1, 0, [entry(values=(1, 1, 1))]),
    "kind code": P.encode_metrics(1, 0, [entry(kinds=bytes([1, 99]))]),
    "duplicate name": P.encode_metrics(1, 0, [entry(names=("a", "a"))]),
    "NaN sum": P.encode_metrics(1, 0, [entry(values=(math.nan, 1, 1, 1, 2, 1, 2, 2))]),
    "Inf weight": P.encode_metrics(1, 0, [entry(values=(1, math.inf, 1, 1, 2, 1, 2, 2))]),
    "negative weight": P.encode_metrics(1, 0, [entry(values=(1, -1, 1, 1, 2, 1, 2, 2))]),
    "Inf max": P.encode_metrics(1, 0, [entry(values=(1, 1, 1, math.inf, 2, 1, 2, 2))]),
    "min > max": P.encode_metrics(1, 0, [entry(values=(1, 1, 5, 1, 2, 1, 2, 2))]),
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
    "name too long": P.encode_metrics(1, 0, [entry(names=("a" * 300, "b"))]),
}


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
