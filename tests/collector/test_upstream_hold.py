"""A relay the root holds back (issue 46, item 2): its upstream sink, on a real socket, waits
for as long as the root answers (no time-out), heartbeats meanwhile asking for an answer,
offers its record again now and then, and goes on at the root's ``go``; a root that stops
answering still times out."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import zmq

from rlpulse.collector.config import CollectorConfig
from rlpulse.collector.tiers.relay import HEARTBEAT_S, RelayRecord
from rlpulse.collector.tiers.upstream import UpstreamSink
from rlpulse.schemas import protocol

RELAY = 7


class Root:
    """The root's end: a ROUTER socket on loopback that the test answers by hand."""

    def __init__(self) -> None:
        self.ctx = zmq.Context()
        self.socket = self.ctx.socket(zmq.ROUTER)
        self.socket.setsockopt(zmq.LINGER, 0)
        port = self.socket.bind_to_random_port("tcp://127.0.0.1")
        self.address = f"tcp://127.0.0.1:{port}"
        self.identity = b""

    def receive(self, timeout_s: float) -> list[protocol.Message]:
        """What the relay sent within ``timeout_s``."""
        out: list[protocol.Message] = []
        deadline = time.monotonic() + timeout_s
        while (left := deadline - time.monotonic()) > 0:
            if self.socket.poll(int(left * 1000)):
                self.identity, payload = self.socket.recv_multipart()
                out.append(protocol.decode(payload))
        return out

    def ack(self, seq: int, **flags: bool) -> None:
        self.socket.send_multipart([self.identity, protocol.encode_ack(RELAY, seq, **flags)])

    def close(self) -> None:
        self.socket.close()
        self.ctx.term()


@contextmanager
def writing(timeout_s: float) -> Iterator[tuple[Root, UpstreamSink, list[BaseException]]]:
    """A root, and a relay's upstream sink writing one delta to it on a thread."""
    root = Root()
    config = CollectorConfig(upstream=root.address, trackers={})  # type: ignore[arg-type]
    sink = UpstreamSink(config, RELAY, timeout_s=timeout_s)
    delta = protocol.Delta(RELAY, 1, "r", [], [(5, 0)], [], [], [])
    record = RelayRecord("delta", seq=1, run="r", step=0, message=protocol.encode(delta))
    errors: list[BaseException] = []

    def write() -> None:
        try:
            sink.write(record)
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=write, daemon=True)
    thread.start()
    try:
        yield root, sink, errors
    finally:
        thread.join(10)
        sink.close()
        root.close()
    assert not thread.is_alive()


def held(root: Root) -> None:
    """The relay's hello and delta arrive (again until answered); the root holds it back."""
    first = root.receive(1.0)
    assert protocol.RelayHello in map(type, first) and protocol.Delta in map(type, first)
    root.ack(0, hold=True, asks=True)
    root.receive(0.2)  # what was on its way before the answer


def test_a_held_relay_waits_past_its_timeout_while_the_root_answers_and_goes_on_at_go() -> None:
    with writing(timeout_s=1.0) as (root, sink, errors):
        held(root)
        seen: list[protocol.Message] = []
        deadline = time.monotonic() + 2 * HEARTBEAT_S + 1.0  # well past timeout_s
        while time.monotonic() < deadline:
            got = root.receive(0.2)
            seen += got
            if any(isinstance(m, protocol.Heartbeat) for m in got):
                root.ack(0, asks=True)  # still held: an answer, no go
        assert sink.held and not errors
        beats = [m for m in seen if isinstance(m, protocol.Heartbeat)]
        assert len(beats) >= 2 and all(b.flush for b in beats), "alive, asking for an answer"
        offers = [m for m in seen if isinstance(m, protocol.Delta)]
        assert 1 <= len(offers) <= len(beats), "offered again with each heartbeat, no more"
        root.ack(1, go=True, asks=True)  # room: the parked delta was applied
    assert not errors and not sink.held


def test_a_held_relay_whose_root_stops_answering_times_out() -> None:
    with writing(timeout_s=1.0) as (root, _sink, errors):
        held(root)
        root.receive(HEARTBEAT_S + 2.0)  # heartbeats and offers go unanswered
    assert len(errors) == 1 and isinstance(errors[0], TimeoutError)


@pytest.mark.parametrize("flag", ["resend", "go"])
def test_a_relay_let_go_sends_its_record_again_at_once_when_asked(flag: str) -> None:
    with writing(timeout_s=1.0) as (root, sink, errors):
        held(root)
        root.ack(0, asks=True, **{flag: True})  # let go, the delta not applied
        again = root.receive(0.5)
        assert [type(m) for m in again] == [protocol.Delta], "at once, not a heartbeat later"
        assert not sink.held
        root.ack(1, asks=True)
    assert not errors


def test_a_relay_frozen_while_it_waits_for_an_answer_leaves_its_freeze_out() -> None:
    """The relay itself stopped for 30 s mid-send (SIGSTOP): that is no silence of the root,
    so it tries for a whole ``timeout_s`` of its own running after it, instead of giving up
    (and logging a failed write) the moment it runs again."""
    now = [0.0]

    def clock() -> float:
        now[0] += 0.01
        return now[0]

    config = CollectorConfig(upstream="tcp://127.0.0.1:1", trackers={})  # type: ignore[arg-type]
    sink = UpstreamSink(config, RELAY, timeout_s=1.0, clock=clock)
    sent: list[float] = []
    sink._transport = type("Link", (), {"send": lambda self, payload: sent.append(now[0])})()
    sink._connected = sink._answered = True

    def pump(wait_s: float) -> None:  # the root never answers; the relay freezes once
        if 0.5 <= now[0] < 0.6:
            now[0] += 30.0

    sink._pump = pump  # type: ignore[method-assign]
    delta = protocol.Delta(RELAY, 1, "r", [], [(5, 0)], [], [], [])
    record = RelayRecord("delta", seq=1, run="r", step=0, message=protocol.encode(delta))
    with pytest.raises(TimeoutError):
        sink.write(record)
    assert now[0] >= 31.0, "a whole timeout_s after the freeze"
    assert any(t > 30.5 for t in sent), "and it sent again meanwhile"
