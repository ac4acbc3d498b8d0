"""The encoder's fast path for the common call (the same names as before, finite numbers
only) gives the very bytes of the general path, and anything else takes the general path."""

from __future__ import annotations

import math

from hypothesis import given, settings, strategies as st

from rlpulse.producer.encode import INVALID, Encoder
from rlpulse.producer.stats import _COUNTED, Counters
from rlpulse.schemas import metrics as M
from rlpulse.schemas.metrics import CATALOG


def encoder() -> Encoder:
    return Encoder(CATALOG, {}, Counters(), lambda *_: None)


def test_a_repeated_plain_call_encodes_as_the_general_path_does() -> None:
    payload = {"a/x": 1.5, M.ACTOR_LR.name: 3e-4, "a/n": 7, M.ACTOR_PG_LOSS.name: -0.25}
    fast, general = encoder(), encoder()
    fast.entry(0, 0.0, payload)  # the first call declares the table and the fast path
    assert fast._plain and not general._plain
    assert fast.entry(5, 9.0, payload) == general.entry(5, 9.0, payload)  # fast vs general


def test_what_is_not_plain_takes_the_general_path_and_is_counted() -> None:
    e = encoder()
    names = {"a/x": 1.0, "a/y": 2.0}
    e.entry(0, 0.0, names)
    e.entry(1, 0.0, {"a/x": math.nan, "a/y": 2.0})
    e.entry(2, 0.0, {"a/x": INVALID, "a/y": 2.0})
    entry = e.entry(3, 0.0, {"a/x": 10**400, "a/y": 2.0})  # beyond float64: counted, dropped
    assert entry is not None  # a/y still goes
    assert e.counters.nonfinite == 1 and e.counters.invalid == 1


def test_a_distribution_name_never_takes_the_fast_path() -> None:
    e = encoder()
    payload = {M.CRITIC_ADVANTAGES.name: 0.5}
    first = e.entry(0, 0.0, payload)
    assert not e._plain and first is not None
    assert e.entry(1, 0.0, payload)[-1]  # its sketch rides along every time


def test_edge_numbers_encode_as_the_general_path_does() -> None:
    """Signed zeros, ints beyond 2**53, subnormals and finite values whose sum overflows
    (the fast path then gives the call to the general path) come out byte for byte alike."""
    for values in (
        [-0.0, 0.0, 2**60 + 1, -(2**53) - 1],
        [5e-324, -5e-324, 1.7976931348623157e308],
        [1e308, 1e308, -1.0],
    ):
        payload = {f"a/v{i}": v for i, v in enumerate(values)}
        fast, general = encoder(), encoder()
        fast.entry(0, 0.0, payload)
        assert fast.entry(1, 2.0, payload) == general.entry(1, 2.0, payload), values
        assert fast.counters.invalid == fast.counters.nonfinite == 0


NUMBERS = st.one_of(
    st.floats(allow_nan=False, allow_infinity=False),
    st.integers(-(2**70), 2**70),
    st.integers(-(2**1030), 2**1030),  # beyond float64 too
    st.sampled_from([0.0, -0.0, 5e-324, -5e-324, 1.7976931348623157e308, 2**53 + 1]),
    st.sampled_from([math.nan, math.inf, -math.inf]),
)


@given(
    st.lists(
        st.tuples(
            st.sampled_from(
                [("a/x", "a/y"), ("a/y", "a/x"), ("a/x", M.ACTOR_LR.name, "a/z"), ("a/z",)]
            ),
            st.lists(NUMBERS, min_size=3, max_size=3),
        ),
        min_size=1,
        max_size=12,
    )
)
@settings(max_examples=300, deadline=None)
def test_any_sequence_of_calls_encodes_as_the_general_path_does(calls) -> None:
    """Calls of a few key lists, repeated in any order, with any mix of floats (signed
    zeros, subnormals, non-finite) and ints (beyond 2**53, beyond float64; ``log()`` passes
    these two types through as they are, and reduces anything else first): the
    encoder with its fast path gives, call after call, the bytes and the counts of one
    that always takes the general path."""
    fast, general = encoder(), encoder()
    for step, (keys, values) in enumerate(calls):
        payload = dict(zip(keys, values, strict=False))
        general._plain.clear()
        assert fast.entry(step, 1.0, payload) == general.entry(step, 1.0, payload), payload
    counted = [(n, getattr(fast.counters, n), getattr(general.counters, n)) for n in _COUNTED]
    assert all(a == b for _, a, b in counted), counted
    assert fast.tables == general.tables
