"""The encoder's fast path for the common call (the same names as before, finite numbers
only) gives the very bytes of the general path, and anything else takes the general path."""

from __future__ import annotations

import math

from rlpulse.producer.encode import INVALID, Encoder
from rlpulse.producer.stats import Counters
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
