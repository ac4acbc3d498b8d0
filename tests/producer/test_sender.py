"""The sender thread over an in-memory transport: no socket, the test plays the collector and
the network (connects, refuses sends mid-handshake, drops the connection, answers)."""

from __future__ import annotations

import time

from rlpulse.producer import Producer, ProducerConfig
from rlpulse.producer.handoff import Call, Done
from rlpulse.schemas import protocol
from rlpulse.wire.transport import MemoryTransport
from tests.support.waiting import until

QUIET = ProducerConfig(gpu_sample_s=0, heartbeat_s=60.0)


def sent(t: MemoryTransport) -> list[protocol.Message]:
    return [protocol.decode(b) for b in list(t.sent)]


def kinds(t: MemoryTransport) -> list[str]:
    return [type(m).__name__ for m in sent(t)]


def test_nothing_goes_out_before_the_hello_and_a_refused_hello_is_sent_again() -> None:
    t = MemoryTransport()
    t.accepting = False  # connected, but ZeroMQ still handshaking: sends are refused
    p = Producer("mem://", run="r", role="a", transport=t, config=QUIET)
    p.log({"x": 1.0}, step=0)
    t.connect()
    time.sleep(0.3)
    assert t.sent == []
    t.accepting = True
    assert until(lambda: "Metrics" in kinds(t))
    assert kinds(t)[0] == "Hello"
    assert until(lambda: kinds(t).count("Hello") >= 2)  # unanswered: said again
    metrics = next(m for m in sent(t) if isinstance(m, protocol.Metrics))
    t.reply(protocol.encode_ack(metrics.producer, metrics.seq))
    assert until(lambda: p.stats()["unacked"] == 0)
    hellos = kinds(t).count("Hello")
    time.sleep(0.5)  # answered (any ack): no more hellos
    assert kinds(t).count("Hello") == hellos
    p.close(timeout=0.2)


def test_a_new_connection_gets_a_hello_and_everything_unacknowledged_again() -> None:
    t = MemoryTransport()
    p = Producer("mem://", run="r", role="a", transport=t, config=QUIET)
    t.connect()
    for step in range(3):
        p.log({"x": float(step)}, step=step)
    assert until(lambda: sum(isinstance(m, protocol.Metrics) for m in sent(t)) >= 1)
    t.sent.clear()
    t.disconnect()
    t.connect()
    assert until(lambda: "Hello" in kinds(t))
    time.sleep(0.2)
    assert "Metrics" not in kinds(t)  # until the collector says what it has
    again = sent(t)
    assert isinstance(again[0], protocol.Hello) and again[0].seq == 1  # nothing acked yet
    t.reply(protocol.encode_ack(again[0].producer, 0, asks=True))
    assert until(lambda: "Metrics" in kinds(t))
    again = sent(t)
    steps = [e[0] for m in again if isinstance(m, protocol.Metrics) for e in m.entries]
    assert steps == [0, 1, 2] and p.stats()["resent_messages"] >= 1
    p.close(timeout=0.2)


def test_a_hello_says_what_went_out_before_it() -> None:
    """A hello tells a collector that keeps no state what of this producer's data went out
    so far (``Hello.went_out``: the highest number and step), so that one started again knows
    which steps an earlier instance of it may have written (``collector.runs.earlier``)."""
    t = MemoryTransport()
    p = Producer("mem://", run="r", role="a", transport=t, config=QUIET)
    t.connect()
    assert until(lambda: "Hello" in kinds(t))
    assert sent(t)[0].went_out == (0, -1)  # type: ignore[union-attr]
    p.log({"x": 0.0}, step=0)
    assert until(lambda: any(isinstance(m, protocol.Metrics) for m in sent(t)))
    first = next(m for m in sent(t) if isinstance(m, protocol.Metrics))
    t.reply(protocol.encode_ack(first.producer, first.seq, asks=True))
    assert until(lambda: p.stats()["unacked"] == 0)
    p.log({"x": 1.0}, step=1)
    p.log({"x": 2.0}, step=2)
    out = lambda: [m for m in sent(t) if isinstance(m, protocol.Metrics)]  # noqa: E731
    assert until(lambda: any(e[0] == 2 for m in out() for e in m.entries))
    last = out()[-1].seq
    t.sent.clear()
    t.disconnect()
    t.connect()
    assert until(lambda: "Hello" in kinds(t))
    again = sent(t)[0]
    assert isinstance(again, protocol.Hello)
    assert again.seq == first.seq + 1  # acknowledged so far
    assert again.went_out == (last, 2)  # sent so far: up to step 2, not acknowledged
    p.close(timeout=0.2)


def test_after_a_stopping_collectors_last_ack_the_hello_leaves_out_what_it_did_not_apply() -> None:
    """A collector that stops acknowledges, last, everything it applied, saying it stops
    (``Ack.stopping``): what went out after that was not applied, so the next hello does not
    say it went out (a collector without ``state_dir`` started again flags only what may
    really be in two records). What goes out on the new connection counts again."""
    t = MemoryTransport()
    p = Producer("mem://", run="r", role="a", transport=t, config=QUIET)
    t.connect()
    metrics = lambda: [m for m in sent(t) if isinstance(m, protocol.Metrics)]  # noqa: E731
    p.log({"x": 0.0}, step=0)
    assert until(lambda: len(metrics()) == 1)
    p.log({"x": 1.0}, step=1)  # goes out, never applied
    assert until(lambda: len(metrics()) == 2)
    first, second = metrics()
    t.reply(protocol.encode_ack(first.producer, first.seq, asks=True, stopping=True))
    assert until(lambda: p.stats()["unacked"] == 1)
    p.log({"x": 2.0}, step=2)  # still to the stopped one: applied by none
    assert until(lambda: len(metrics()) == 3)
    t.sent.clear()
    t.disconnect()
    t.connect()
    assert until(lambda: "Hello" in kinds(t))
    hello = sent(t)[0]
    assert isinstance(hello, protocol.Hello)
    assert hello.seq == second.seq and hello.went_out == (first.seq, 0)
    t.reply(protocol.encode_ack(first.producer, first.seq, asks=True))  # the new one: resend
    assert until(lambda: len(metrics()) >= 2)
    t.sent.clear()
    t.disconnect()
    t.connect()
    assert until(lambda: "Hello" in kinds(t))
    assert sent(t)[0].went_out == (second.seq + 1, 2)  # type: ignore[union-attr]
    p.close(timeout=0.2)


def test_close_waits_its_timeout_then_counts_what_is_unacknowledged() -> None:
    t = MemoryTransport()
    p = Producer("mem://", run="r", role="a", transport=t, config=QUIET)
    t.connect()
    p.log({"x": 1.0}, step=0)
    p.log({"x": 2.0}, step=1)
    started = time.monotonic()
    p.close(timeout=0.4)
    assert 0.3 < time.monotonic() - started < 2.0
    stats = p.stats()
    # sent, never acknowledged: the collector may hold them, so they are not counted lost
    assert stats["unconfirmed"] == 2 and stats["dropped_send"] == 0 and stats["unacked"] > 0
    assert "Bye" in kinds(t) and t.closed


def test_dropped_send_counts_only_calls_that_never_went_out() -> None:
    """Issue 38, item 12: calls the collector had merged were counted as dropped because
    their acknowledgement had not come back by close(). Only what never left is lost for
    certain; what left unacknowledged is ``unconfirmed``."""
    t = MemoryTransport()
    p = Producer("mem://", run="r", role="a", transport=t, config=QUIET)
    t.connect()
    p.log({"x": 1.0}, step=0)
    p.log({"x": 2.0}, step=1)
    assert until(lambda: sum(isinstance(m, protocol.Metrics) for m in sent(t)) >= 1)
    assert until(
        lambda: sum(len(m.entries) for m in sent(t) if isinstance(m, protocol.Metrics)) == 2
    )
    t.accepting = False  # from now on nothing leaves (a connection gone quiet)
    for step in range(2, 5):
        p.log({"x": float(step)}, step=step)
    p.close(timeout=0.3)
    stats = p.stats()
    assert stats["dropped_send"] == 3 and stats["unconfirmed"] == 2, stats


def test_the_caller_queues_named_items_in_order() -> None:
    t = MemoryTransport()  # never connected: the stopped sender ends at once
    p = Producer("mem://", run="r", role="a", transport=t, config=QUIET)
    p._sender.stop(0.0)
    p._sender.join(5)
    p.log({"x": 1.0}, step=3)
    p.step_done(3)
    call, done = p._queue
    assert type(call) is Call and (call.step, call.waits, call.phase_end) == (3, (), False)
    assert call.payload is not None and set(call.payload) == {"x"}
    assert done == Done(3)
    p.close(timeout=0.1)


def test_caller_first_waits_for_log_to_end_and_no_longer_than_it_may() -> None:
    """The sender's wait for a ``log()`` in progress: over at once when none is, ends when
    the call leaves, and ends at its bound when the call never does."""
    import threading

    from rlpulse.producer.handoff import CallerFirst

    gate = CallerFirst()
    t0 = time.monotonic()
    gate.wait(t0 + 5.0)
    assert time.monotonic() - t0 < 0.5  # nobody inside log()
    gate.enter()
    ended: list[float] = []
    waiter = threading.Thread(target=lambda: (gate.wait(time.monotonic() + 5.0), ended.append(1)))
    waiter.start()
    time.sleep(0.1)
    assert not ended  # still inside log(): the sender waits
    left = time.monotonic()
    gate.leave()
    waiter.join(2.0)
    assert ended and time.monotonic() - left < 1.0
    gate.enter()  # a call that never ends (a tight loop of calls, seen as one)
    t0 = time.monotonic()
    gate.wait(t0 + 0.05)
    assert 0.05 <= time.monotonic() - t0 < 1.0


def test_queued_calls_wait_while_log_runs_and_go_when_it_ends(monkeypatch) -> None:
    """While a ``log()`` is in progress the sender encodes nothing (within its bound, here
    raised to 5 s); once the call ends, what is queued goes out. With the default bound a
    call that never ends cannot hold the sender back."""
    import rlpulse.producer.sender as sender

    t = MemoryTransport()
    p = Producer("mem://", run="r", role="a", transport=t, config=QUIET)
    t.connect()
    assert until(lambda: "Hello" in kinds(t))
    monkeypatch.setattr(sender, "YIELD_S", 5.0)
    p._caller.enter()  # as log() does, around its work
    p._log({"x": 1.0}, step=0)
    time.sleep(0.3)
    assert "Metrics" not in kinds(t)
    p._caller.leave()
    assert until(lambda: "Metrics" in kinds(t), timeout_s=2.0)
    monkeypatch.setattr(sender, "YIELD_S", 0.002)
    p._caller.enter()
    p._log({"x": 2.0}, step=1)
    assert until(lambda: kinds(t).count("Metrics") == 2, timeout_s=2.0)
    p._caller.leave()
    p.close(timeout=0.2)


def test_a_producer_no_collector_answers_warns_once_naming_its_address(monkeypatch, caplog) -> None:
    """A wrong address used to be silent until close() dropped everything logged."""
    monkeypatch.setattr("rlpulse.producer.link.SILENT_WARN_S", 0.3)
    t = MemoryTransport()
    p = Producer("tcp://10.9.8.7:5999", run="r", role="a", transport=t, config=QUIET)
    p.log({"x": 1.0}, step=0)
    with caplog.at_level("WARNING", logger="rlpulse.producer"):
        assert until(lambda: "no collector has answered" in caplog.text, 3.0)
        time.sleep(0.5)
    warned = [r for r in caplog.records if "no collector has answered" in r.getMessage()]
    assert len(warned) == 1 and "tcp://10.9.8.7:5999" in warned[0].getMessage()
    p.close(timeout=0.1)


def test_a_producer_answered_in_time_does_not_warn(monkeypatch, caplog) -> None:
    monkeypatch.setattr("rlpulse.producer.link.SILENT_WARN_S", 0.3)
    t = MemoryTransport()
    p = Producer("mem://", run="r", role="a", transport=t, config=QUIET)
    t.connect()
    with caplog.at_level("WARNING", logger="rlpulse.producer"):
        assert until(lambda: "Hello" in kinds(t))
        hello = sent(t)[0]
        t.reply(protocol.encode_ack(hello.producer, 0))
        time.sleep(0.6)
    assert "no collector has answered" not in caplog.text
    p.close(timeout=0.1)


def test_a_held_back_producer_sends_everything_at_close_and_says_why_it_gave_up(caplog) -> None:
    """Issue 38, item 11: held back by flow control, a closing producer still sends what it
    holds and its goodbye (the collector takes a closing producer's data); if the close
    still gives up, the warning says the collector held it back (not "no collector
    answered"), and a last heartbeat tells the collector the final counts."""
    t = MemoryTransport()
    p = Producer("mem://", run="r", role="a", transport=t, config=QUIET)
    t.connect()
    p.log({"x": 0.0}, step=0)
    assert until(lambda: any(isinstance(m, protocol.Metrics) for m in sent(t)))
    pid = sent(t)[0].producer
    t.reply(protocol.encode_ack(pid, 0, hold=True))
    time.sleep(0.1)
    for step in range(1, 4):
        p.log({"x": float(step)}, step=step)
    time.sleep(0.2)
    held = [e[0] for m in sent(t) if isinstance(m, protocol.Metrics) for e in m.entries]
    assert held == [0]  # held: nothing more goes out
    with caplog.at_level("WARNING", logger="rlpulse.producer"):
        p.close(timeout=0.3)
    steps = [e[0] for m in sent(t) if isinstance(m, protocol.Metrics) for e in m.entries]
    assert steps == [0, 1, 2, 3] and "Bye" in kinds(t)
    stats = p.stats()
    assert stats["unconfirmed"] == 4 and stats["dropped_send"] == 0
    assert "holds this producer back" in caplog.text
    last = sent(t)[-1]
    assert isinstance(last, protocol.Heartbeat) and last.stats["unconfirmed"] == 4
