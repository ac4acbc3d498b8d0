"""Each producer's data messages are applied once, in order; acks follow what was applied."""

from __future__ import annotations

from rlpulse.collector.intake.delivery import Delivery
from rlpulse.schemas import protocol as P
from tests.collector.helpers import hello, metrics


def seqs(out) -> list[int]:
    return [m.seq for m, _ in out]


def done(pid: int, seq: int, step: int = 0) -> P.Done:
    return P.Done(pid, seq, step)


def test_in_order_once_duplicates_reacked_gaps_dropped() -> None:
    d = Delivery()
    assert seqs(d.accept(P.Hello(7, 1, "r", "a", 0, 1, "h", 1), b"id")) == [1]
    assert seqs(d.accept(done(7, 1), b"id")) == [1]
    assert seqs(d.accept(done(7, 3), b"id")) == []  # gap: 2 is missing, wait for the resend
    assert seqs(d.accept(done(7, 1), b"id")) == []  # duplicate
    assert seqs(d.accept(done(7, 2), b"id")) + seqs(d.accept(done(7, 3), b"id")) == [2, 3]
    assert d.health.duplicates == 1 and d.health.out_of_order == 1
    (ack,) = d.acks()
    assert ack[0] == b"id" and P.decode(ack[1]) == P.Ack(7, 3, asks=True)
    assert d.acks() == []


def test_hello_sets_where_numbering_starts_for_a_fresh_collector() -> None:
    d = Delivery()
    assert seqs(d.accept(P.Hello(7, 50, "r", "a", 0, 1, "h", 1), b"id")) == [50]
    assert seqs(d.accept(done(7, 50), b"id")) == [50]
    assert seqs(d.accept(done(7, 49), b"id")) == []


def test_messages_before_hello_are_held_and_replayed_in_order() -> None:
    d = Delivery(max_held=2)
    m1, m2 = metrics(9, 0, {"x": 1.0}), done(9, 2)
    assert d.accept(m1, b"id", b"raw1") == [] and d.accept(done(9, 2), b"id", b"raw2") == []
    assert (
        d.accept(done(9, 3), b"id", b"raw3") == []
    )  # over the bound: dropped, the producer resends
    assert d.health.unknown_producer == 1
    out = d.accept(hello(9), b"id", b"rawh")  # numbering starts at 1
    assert [type(m).__name__ for m, _ in out] == ["Hello", "Metrics", "Done"]
    assert [r for _, r in out] == [b"rawh", b"raw1", b"raw2"]
    assert m2.seq == 2


def test_replay_and_snapshot_restore_the_sequence_state() -> None:
    d = Delivery()
    d.note_replayed(P.Hello(3, 10, "r", "a", 0, 1, "h", 1))
    d.note_replayed(done(3, 10))
    d.note_replayed(done(3, 11))
    e = Delivery()
    e.restore(d.snapshot())
    assert seqs(e.accept(done(3, 11), b"id")) == [] and seqs(e.accept(done(3, 12), b"id")) == [12]


def test_every_hello_is_acknowledged_so_the_producer_stops_repeating_it() -> None:
    d = Delivery()
    d.accept(P.Hello(5, 4, "r", "a", 0, 1, "h", 1), b"id")
    assert [P.decode(a) for _, a in d.acks()] == [
        P.Ack(5, 3, asks=True)
    ]  # registered; nothing applied
    d.accept(done(5, 4), b"id")
    d.acks()
    d.accept(P.Hello(5, 5, "r", "a", 0, 1, "h", 1), b"id2")  # a re-registration, new connection
    assert d.acks() == [(b"id2", P.encode_ack(5, 4, asks=True))]


def test_the_last_acks_go_to_every_producer_and_say_the_collector_is_stopping() -> None:
    """At its stop the collector tells every producer it knows, owed an acknowledgement or
    not, where it stopped applying (``Ack.stopping``): what they sent after it was not applied
    (``Hello.went_out`` leaves it out)."""
    d = Delivery()
    d.accept(P.Hello(5, 1, "r", "a", 0, 2, "h", 1), b"five")
    d.accept(P.Hello(6, 1, "r", "a", 1, 2, "h", 1), b"six")
    d.accept(done(5, 1), b"five")
    d.acks(everything=True)  # all acknowledged: nobody is owed one
    d.accept(done(6, 1), b"six")
    last = sorted(d.acks(everything=True, stopping=True))
    assert last == [
        (b"five", P.encode_ack(5, 1, asks=True, stopping=True)),
        (b"six", P.encode_ack(6, 1, asks=True, stopping=True)),
    ]
    assert P.decode(last[0][1]).stopping  # type: ignore[union-attr]
    assert not P.decode(P.encode_ack(5, 1)).stopping  # type: ignore[union-attr]


def test_entries_of_a_producer_that_never_registered_are_counted_as_unapplied() -> None:
    d = Delivery()
    two = P.Metrics(9, 1, metrics(9, 1, {"x": 1.0}).entries * 2)
    d.accept(two, b"id")
    d.accept(done(9, 2), b"id")
    assert d.unapplied() == 2 and d.acks() == []
    d.accept(hello(9), b"id")
    assert d.unapplied() == 0


def test_a_held_back_producer_is_parked_then_released_in_order_without_a_resend() -> None:
    """Flow control: the refused message and those after it are kept, applied in order once
    the run has room, and the producer is told to go on; dropped, it had to send its whole
    backlog again for every window's room."""
    d = Delivery()
    room = {"open": False}
    admit = lambda m: room["open"] or m.seq < 3  # noqa: E731
    d.accept(hello(4), b"id")
    out = [d.accept(done(4, seq), b"id", b"r%d" % seq, admit) for seq in range(1, 7)]
    assert [seqs(o) for o in out] == [[1], [2], [], [], [], []]
    d.accept(done(4, 4), b"id", b"r4", admit)  # a repeat of a parked one: kept once
    assert d.health.held_back == 1 and d.health.out_of_order == 0
    assert [P.decode(a) for _, a in d.acks()] == [P.Ack(4, 2, hold=True, asks=True)]
    assert list(d.release(lambda pid: False, admit)) == []  # no room: stays parked
    room["open"] = True
    released = list(d.release(lambda pid: True, admit))
    assert seqs(released) == [3, 4, 5, 6] and [r for _, r in released] == [
        b"r3",
        b"r4",
        b"r5",
        b"r6",
    ]
    assert [P.decode(a) for _, a in d.acks()] == [P.Ack(4, 6, go=True, asks=True)]  # nothing twice
    assert (
        list(d.release(lambda pid: True, admit)) == [] and d._held_count == 0 and d._held_bytes == 0
    )


def test_release_stops_where_the_run_is_full_again_and_past_a_gap_the_producer_resends() -> None:
    d = Delivery(max_held=3)
    limit = {"seq": 2}
    admit = lambda m: m.seq <= limit["seq"]  # noqa: E731
    d.accept(hello(4), b"id")
    for seq in range(1, 8):  # 3, 4, 5 parked; 6 and 7 over the bound: dropped, counted
        d.accept(done(4, seq), b"id", b"r", admit)
    assert d.health.out_of_order == 2
    d.acks()
    limit["seq"] = 4
    assert seqs(d.release(lambda pid: True, admit)) == [3, 4]
    assert d.acks() == []  # still held: nothing to tell yet
    limit["seq"] = 99
    assert seqs(d.release(lambda pid: True, admit)) == [5]
    assert [P.decode(a) for _, a in d.acks()] == [
        P.Ack(4, 5, resend=True, asks=True)
    ]  # 6 and 7 again
    assert seqs(d.accept(done(4, 6), b"id", b"r", admit)) == [6]


def test_data_is_acknowledged_once_its_delay_is_over_oldest_first_and_urgent_at_once() -> None:
    """Acknowledgements of data wait ``ack_delay_s`` (one per producer per interval); a
    goodbye or a repeat is acknowledged at the next call, and not again when the delay
    ends. The dues are kept in time order, and stay so when the clock goes back."""
    now = [100.0]
    d = Delivery(clock=lambda: now[0], ack_delay_s=0.5)
    for pid in (1, 2, 3):
        d.accept(P.Hello(pid, 1, "r", "a", pid - 1, 3, "h", 1), f"id{pid}".encode())
    d.acks()  # the hellos
    d.accept(done(1, 1), b"id1")  # due at 100.5
    now[0] = 100.2
    d.accept(done(2, 1), b"id2")  # due at 100.7
    d.accept(done(1, 2), b"id1")  # owed already, by 100.5
    now[0] = 100.3
    d.accept(done(3, 1), b"id3")  # due at 100.8
    d.accept(done(3, 1), b"id3")  # a repeat: at once, and not again at 100.8
    assert [P.decode(a) for _, a in d.acks()] == [P.Ack(3, 1, asks=True)]
    now[0] = 100.49
    assert d.acks() == []
    now[0] = 100.5
    assert [P.decode(a) for _, a in d.acks()] == [P.Ack(1, 2, asks=True)]
    now[0] = 100.9
    assert [P.decode(a) for _, a in d.acks()] == [P.Ack(2, 1, asks=True)]
    assert d.acks() == []
    d.accept(done(1, 3), b"id1")  # due at 101.4
    now[0] = 50.0  # the clock went back: a later due never comes before an earlier one
    d.accept(done(2, 2), b"id2")  # due at 101.4, not 50.5
    now[0] = 101.4
    assert sorted(P.decode(a).producer for _, a in d.acks()) == [1, 2]
    d.accept(done(1, 4), b"id1")
    assert [P.decode(a) for _, a in d.acks(everything=True)] == [P.Ack(1, 4, asks=True)]


def test_screen_lets_go_what_would_not_be_held_before_it_is_decoded() -> None:
    """Issue 38 item 7: the receiver asks before decoding a large message. A registered
    producer's is always decoded; an unregistered one's only while there is room to hold it,
    else it is counted as dropped as ``_hold`` would."""
    d = Delivery(max_held_bytes=1000)
    d.accept(P.Hello(7, 1, "r", "a", 0, 1, "h", 1), b"id")
    assert d.screen(7, 10_000)  # registered: whatever its size
    assert d.screen(8, 1000) and not d.screen(8, 1001)
    assert d.health.unknown_producer == 1


def test_a_held_back_producer_that_says_goodbye_is_released_as_closing() -> None:
    """Issue 38, item 11: a rank far ahead closes while held back. Once its goodbye is parked
    behind its held data, what is parked is released without waiting for room, each message
    admitted as ``closing`` (the run's hard bound), so its close is acknowledged."""
    d = Delivery()
    asked: list[tuple[int, bool]] = []

    def admit(m: P.Message, closing: bool = False) -> bool:
        asked.append((m.seq, closing))
        return closing or m.seq < 3

    d.accept(hello(4), b"id")
    for seq in range(1, 5):
        d.accept(done(4, seq), b"id", b"r%d" % seq, admit)
    assert list(d.release(lambda pid: False, admit)) == []  # no room, not closing: parked
    d.accept(P.Bye(4, 5, {}), b"id", b"bye", admit)
    released = list(d.release(lambda pid: False, admit))
    assert seqs(released) == [3, 4, 5] and (3, True) in asked
    assert [P.decode(a) for _, a in d.acks()] == [P.Ack(4, 5, go=True, asks=True)]
    assert d._held_count == 0 and d._held_bytes == 0
