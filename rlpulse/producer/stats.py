"""A producer's counters, named by the wire protocol's ``STAT_KEYS`` (their one spelling).

Two threads count, each into its own :class:`Counters` (no shared writes): the caller
(``log()``) and the sender thread. :func:`combine` adds them up for ``Producer.stats()``, the
heartbeats and the goodbye.

>>> caller, sender = Counters(), Counters()
>>> caller.logged += 2; sender.sent_messages += 1
>>> combine(caller, sender, unacked=0)["logged"]
2
"""

from __future__ import annotations

from rlpulse.schemas.protocol import STAT_KEYS

_COUNTED = tuple(key for key in STAT_KEYS if key != "unacked")  # unacked is a gauge


class Counters:
    """Every counter of ``STAT_KEYS`` (but the ``unacked`` gauge), written by one thread. The
    annotations spell the same names for type checkers (tests/producer/test_stats.py checks
    they match ``STAT_KEYS``); the slots are made from ``STAT_KEYS`` itself."""

    __slots__ = _COUNTED
    logged: int
    sent_messages: int
    resent_messages: int
    dropped_queue_full: int
    dropped_buffer_full: int
    dropped_send: int
    dropped_late: int
    dropped_conflict: int
    invalid: int
    nonfinite: int
    errors: int
    dropped_oversized: int
    dropped_rejected: int
    unconfirmed: int
    dropped_names: int
    samples_dropped: int
    samples_cut: int
    dropped_unreduced: int

    def __init__(self) -> None:
        for key in _COUNTED:
            setattr(self, key, 0)


def combine(caller: Counters, sender: Counters, *, unacked: int) -> dict[str, int]:
    """The producer's counters as the protocol names them."""
    return {
        key: unacked if key == "unacked" else getattr(caller, key) + getattr(sender, key)
        for key in STAT_KEYS
    }
