"""What a producer does with a call the wire cannot carry as it is (issue 22, items 4 to 6),
over an in-memory transport: the test plays the collector. The same faults against a real
collector are in ``tests/integration/test_producer_faults.py``."""

from __future__ import annotations

import logging
import time

import msgspec
import pytest

from rlpulse.producer import Producer, ProducerConfig
from rlpulse.producer.encode import Encoder
from rlpulse.producer.stats import Counters
from rlpulse.schemas import protocol
from rlpulse.schemas.messages import DEFAULT_LIMITS, MAX_STEP
from rlpulse.schemas.metrics import CATALOG
from rlpulse.wire.transport import MemoryTransport
from tests.support.waiting import until

QUIET = ProducerConfig(gpu_sample_s=0, heartbeat_s=60.0)


def sent(t: MemoryTransport) -> list[protocol.Message]:
    return [protocol.decode(b) for b in list(t.sent)]  # the collector's default limits


def logged_steps(t: MemoryTransport) -> list[int]:
    return [e[0] for m in sent(t) if isinstance(m, protocol.Metrics) for e in m.entries]


class Warnings:
    """``warn_once`` as the producer does it, keeping what was said."""

    def __init__(self) -> None:
        self.said: dict[str, str] = {}

    def __call__(self, key: str, message: str) -> None:
        self.said.setdefault(key, message)


def encoder(warnings: Warnings | None = None) -> Encoder:
    return Encoder(CATALOG, {}, Counters(), warnings or Warnings())


# ---------------------------------------------------------------------------- sizes


def test_packed_bytes_bounds_what_an_entry_takes_in_a_message() -> None:
    for entry in (
        protocol.pack_entry(0, 0.0, 0, b""),
        protocol.pack_entry(2**63 - 1, 1e300, 2**40, b"\x01" * 70_000, {"é" * 200: 2**62}),
        protocol.pack_entry(5, time.time(), 3, b"\x00" * 32, {f"n{i}": i for i in range(300)}),
    ):
        alone = len(protocol.encode_metrics(1, 1, [entry])) - len(protocol.encode_metrics(1, 1, []))
        assert alone <= protocol.packed_bytes(entry)
    names = ["é" * 256] * 3
    decl = protocol.TableDecl(2**62, names, bytes([1, 1, 1]))
    assert len(msgspec.msgpack.encode(decl)) <= protocol.declared_bytes(names, decl.kinds)


def test_a_burst_of_wide_calls_leaves_in_messages_the_collector_accepts() -> None:
    t = MemoryTransport()
    names = [f"wide/m{i:05d}" for i in range(10_000)]
    payloads = [dict.fromkeys(names, float(step)) for step in range(40)]
    p = Producer("mem://", run="r", role="a", transport=t, config=QUIET)
    for step, payload in enumerate(payloads):  # queued before the sender has a connection
        p.log(payload, step=step)
    t.connect()
    assert until(lambda: len(logged_steps(t)) == 40)
    sizes = [len(b) for b in t.sent]
    assert max(sizes) <= DEFAULT_LIMITS.max_bytes and len(sizes) >= 3  # a hello, 2+ messages
    assert logged_steps(t) == list(range(40)) and p.stats()["dropped_oversized"] == 0
    p.close(timeout=0.2)


# ---------------------------------------------------------------------------- the thread


def test_a_call_that_cannot_be_encoded_is_dropped_and_the_sender_goes_on() -> None:
    """Whatever slips past log()'s checks (here: an encoder bug making a step msgpack cannot
    hold) costs that message, counted, never the thread."""
    t = MemoryTransport()
    p = Producer("mem://", run="r", role="a", transport=t, config=QUIET)
    t.connect()
    real = p._sender.encoder.entry
    p._sender.encoder.entry = lambda step, t_, payload: real(2**64, t_, payload)
    p.log({"x": 1.0}, step=0)
    assert until(lambda: p.stats()["errors"] == 1)
    p._sender.encoder.entry = real
    p.log({"x": 2.0}, step=1)
    assert until(lambda: logged_steps(t) == [1])
    assert p._sender.is_alive() and p.stats()["logged"] == 2
    p.close(timeout=0.2)


@pytest.mark.parametrize("step", [-1, MAX_STEP + 1, 2**63 - 1, 2**63, 2**64, 10**30])
def test_log_refuses_a_step_outside_the_wire_range(step: int, caplog) -> None:
    t = MemoryTransport()
    p = Producer("mem://", run="r", role="a", transport=t, config=QUIET)
    t.connect()
    p.log({"x": 1.0}, step=step)
    p.step_done(step)
    p.log({"x": 1.0}, step=3)
    assert until(lambda: logged_steps(t) == [3])
    # the call and the step_done(), each counted (step_done() was ignored without a word)
    assert p.stats()["invalid"] == 2 and p.stats()["logged"] == 1
    assert f"from 0 to {MAX_STEP}" in caplog.text
    p.close(timeout=0.2)


def test_an_unencodable_name_neither_stops_the_sender_nor_its_hello() -> None:
    t = MemoryTransport()
    p = Producer("mem://", run="r", role="a", transport=t, config=QUIET)
    t.connect()
    p.log({"ok": 1.0, "bad\ud800": 2.0}, step=0)  # a lone surrogate: no UTF-8 for it
    p.log({"ok": 3.0}, step=1)
    assert until(lambda: logged_steps(t) == [0, 1])
    assert p._sender.is_alive() and p.stats()["invalid"] == 1
    p.close(timeout=0.2)


# ---------------------------------------------------------------------------- names


def test_the_encoder_drops_names_the_collector_would_refuse_and_warns_once() -> None:
    warnings = Warnings()
    enc = encoder(warnings)
    longest = "n" * DEFAULT_LIMITS.max_name_length
    too_long = "m" * (DEFAULT_LIMITS.max_name_length + 1)
    entry = enc.entry(0, 0.0, {longest: 1.0, too_long: 2.0, "b": float("nan")})
    again = enc.entry(1, 0.0, {too_long + "x": 1.0, "a": 1.0})
    assert enc.counters.invalid == 2 and enc.counters.nonfinite == 1
    assert [d.names for d in enc.tables] == [[longest], ["a"]]
    assert entry is not None and entry[4] == {"b": 1} and again is not None
    assert (
        list(warnings.said) == ["name-limit"] and repr(too_long)[:40] in warnings.said["name-limit"]
    )


def test_the_encoder_keeps_at_most_max_names_per_call() -> None:
    warnings = Warnings()
    enc = encoder(warnings)
    names = [f"m{i}" for i in range(DEFAULT_LIMITS.max_names + 2)]
    enc.entry(0, 0.0, dict.fromkeys(names, 1.0))
    assert enc.tables[0].names == names[: DEFAULT_LIMITS.max_names]
    assert enc.counters.invalid == 2
    assert repr(names[-2]) in warnings.said["names-per-call"]


def test_a_table_that_would_make_the_hello_too_large_is_refused() -> None:
    enc = encoder()
    for n in range(4):  # 10k names of 240 characters: 2.5 MB of hello each
        payload = {f"t{n}/{i:0236d}": 1.0 for i in range(DEFAULT_LIMITS.max_names)}
        assert (enc.entry(n, 0.0, payload) is None) == (n == 3)
    assert len(enc.tables) == 3 and enc.counters.dropped_oversized == 1
    hello = protocol.encode_hello(
        1, 1, run="r" * 128, role="a" * 128, rank=0, world_size=1, tables=enc.tables
    )
    assert len(hello) <= DEFAULT_LIMITS.max_bytes
    assert protocol.decode(hello).tables == enc.tables


# ---------------------------------------------------------------------------- rejections


def test_calls_the_collector_rejected_are_counted_from_its_acks(caplog) -> None:
    t = MemoryTransport()
    p = Producer("mem://", run="r", role="a", transport=t, config=QUIET)
    t.connect()
    p.log({"x": 1.0}, step=0)
    assert until(lambda: logged_steps(t) == [0])
    pid = sent(t)[0].producer
    with caplog.at_level(logging.WARNING, logger="rlpulse.producer"):
        for seq, total in ((1, 3), (1, 3), (2, 5), (2, 1)):  # a repeat; then a restart: 1 is new
            t.reply(protocol.encode_ack(pid, seq, rejected=total))
            p.flush(0.5)
    assert p.stats()["dropped_rejected"] == 6 and p.stats()["unacked"] == 0
    assert "rejected" in caplog.text
    p.close(timeout=0.2)
