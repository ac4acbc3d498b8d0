"""The producer's counters are the protocol's ``STAT_KEYS``, spelled once."""

from __future__ import annotations

from rlpulse.producer.stats import _COUNTED, Counters, combine
from rlpulse.schemas.protocol import STAT_KEYS


def test_the_typed_counters_are_the_protocols_keys() -> None:
    assert tuple(Counters.__annotations__) == _COUNTED
    assert set(_COUNTED) == set(STAT_KEYS) - {"unacked"}
    caller, sender = Counters(), Counters()
    caller.invalid += 2
    sender.invalid += 1
    assert combine(caller, sender, unacked=4) == dict.fromkeys(STAT_KEYS, 0) | {
        "invalid": 3,
        "unacked": 4,
    }
