"""The producer's side of flow control: held, it sends nothing; told ``go`` it sends only
what it had not sent; told ``resend`` it sends everything unacknowledged again."""

from __future__ import annotations

from rlpulse.producer.outbox import HOLD_LIMIT, Outbox


def sent_through(box: Outbox, now: float) -> list[int]:
    out = []
    while (item := box.next_unsent(now)) is not None:
        out.append(item.seq)
        box.sent()
    return out


def filled(n: int) -> Outbox:
    box = Outbox(max_messages=100, max_bytes=10_000, resend_s=2.0)
    for _ in range(n):
        assert box.add(lambda seq: b"x%d" % seq, 1)
    return box


def test_held_then_go_sends_only_what_was_not_sent() -> None:
    box = filled(3)
    assert sent_through(box, 0.0) == [1, 2, 3]
    box.ack(1, 0.1)
    box.hold(0.1)  # the collector applied 1 and keeps 2 and 3
    box.add(lambda seq: b"x", 1)
    assert sent_through(box, 0.2) == []
    box.ack(3, 0.3)
    box.go_on(0.3)
    assert sent_through(box, 0.3) == [4]


def test_resend_sends_everything_unacknowledged_again() -> None:
    box = filled(3)
    sent_through(box, 0.0)
    box.hold(0.1)
    assert box.resend_all(0.2) == 3
    assert sent_through(box, 0.2) == [1, 2, 3]


def test_a_lost_wake_up_does_not_stop_a_held_producer_for_good() -> None:
    box = filled(2)
    sent_through(box, 0.0)
    box.hold(0.0)
    assert sent_through(box, HOLD_LIMIT * 2.0 - 0.1) == []
    assert sent_through(box, HOLD_LIMIT * 2.0 + 0.1) == [1, 2]


def test_stalled_acknowledgements_back_off() -> None:
    """Issue 38, item 9: a frozen collector got the whole buffer again every ``resend_s``.
    Stalls now come after 2, 4, 8... ``resend_s`` (up to ``MAX_BACKOFF``); progress resets."""
    box = Outbox(max_messages=10, max_bytes=10_000, resend_s=1.0)
    box.add(lambda seq: b"m%d" % seq, entries=1)
    box.next_unsent(0.0)
    box.sent()
    fired = [t / 10 for t in range(0, 400) if box.stalled(t / 10)]
    assert fired == [1.1, 3.2, 7.3, 15.4, 31.5]  # 1, 2, 4, 8, 16 s after the one before
    box.add(lambda seq: b"m%d" % seq, entries=1)
    box.ack(1, 40.0)
    box.next_unsent(40.0)
    box.sent()
    assert not box.stalled(40.9) and box.stalled(41.1)  # back to resend_s
