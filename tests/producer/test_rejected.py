"""A collector that answers but refuses the handshake (issue 45, item 5): the producer says so,
and why, instead of "not connected"; ZeroMQ's monitor events name the refusal
(``tests/integration/test_curve.py`` runs it against a real Curve collector)."""

from __future__ import annotations

import logging
import re
import time

import zmq

from rlpulse.producer import Producer
from rlpulse.producer.config import ProducerConfig
from rlpulse.wire.transport import MemoryTransport, Rejected, refusal

QUIET = ProducerConfig(gpu_sample_s=0, heartbeat_s=0.05)


def test_a_rejected_handshake_is_warned_once_with_its_reason_and_close_does_not_wait(
    caplog,
) -> None:
    caplog.set_level(logging.WARNING, "rlpulse.producer")
    t = MemoryTransport()
    p = Producer("mem://", run="r1", role="a", transport=t, config=QUIET)
    t.connect()  # TCP is up: ZeroMQ says "connected" before the handshake
    t.reject("it requires CurveZMQ and this producer has no keys")
    t.disconnect()
    p.log({"x": 1.0}, step=0)
    time.sleep(0.3)
    started = time.monotonic()
    p.close(timeout=5.0)
    assert time.monotonic() - started < 2.0
    assert p.stats()["dropped_send"] == 1
    warned = [
        r.getMessage() for r in caplog.records if "refused this producer (run" in r.getMessage()
    ]
    assert len(warned) == 1
    assert (
        "a collector at mem:// answered but refused this producer (run 'r1'): it requires "
        "CurveZMQ and this producer has no keys. ZeroMQ does not try such a connection again"
    ) in warned[0]
    closing = [r.getMessage() for r in caplog.records if "closed after" in r.getMessage()]
    assert len(closing) == 1 and "refused this producer (it requires CurveZMQ" in closing[0]


def test_monitor_events_become_reasons() -> None:
    mismatch = zmq.PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH
    plain = refusal(zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL, mismatch, curve=False)
    assert plain is not None and plain.final and "requires CurveZMQ" in plain.why
    keyed = refusal(zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL, mismatch, curve=True)
    assert keyed is not None and "does not use CurveZMQ and this producer does" in keyed.why
    denied = refusal(zmq.EVENT_HANDSHAKE_FAILED_AUTH, 400, curve=True)
    assert denied is not None and "not among the collector's allowed clients" in denied.why
    assert "ZAP status 417" in refusal(zmq.EVENT_HANDSHAKE_FAILED_AUTH, 417, True).why  # type: ignore[union-attr]
    other = refusal(
        zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL, zmq.PROTOCOL_ERROR_ZMTP_INVALID_SEQUENCE, False
    )
    assert other is not None and "PROTOCOL_ERROR_ZMTP_INVALID_SEQUENCE" in other.why
    wrong_key = refusal(zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL, 32, curve=True)
    assert wrong_key == Rejected(wrong_key.why, final=False)  # type: ignore[union-attr]
    assert "server key" in wrong_key.why  # type: ignore[union-attr]
    # Without Curve a handshake with no detail is no refusal to speak of (a collector stopping).
    assert refusal(zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL, 32, curve=False) is None
    assert refusal(zmq.EVENT_CONNECTED, 0, curve=True) is None


def test_the_close_warning_says_how_long_the_close_took_not_its_timeout(caplog) -> None:
    """The warning of a close that gave up said "closed after 5.0s" (the timeout) for a close
    that ended at once (a refused collector: no use waiting). It says the time it took, and
    the timeout beside it."""
    caplog.set_level(logging.WARNING, "rlpulse.producer")
    t = MemoryTransport()
    p = Producer("mem://", run="r1", role="a", transport=t, config=QUIET)
    t.connect()
    t.reject("it requires CurveZMQ and this producer has no keys")
    t.disconnect()
    p.log({"x": 1.0}, step=0)
    time.sleep(0.3)
    started = time.monotonic()
    p.close(timeout=5.0)
    took = time.monotonic() - started
    assert took < 2.0
    closing = [r.getMessage() for r in caplog.records if "closed after" in r.getMessage()]
    assert len(closing) == 1, closing
    said = re.search(r"closed after (\d+\.\d)s \(timeout 5\.0s\)", closing[0])
    assert said is not None, closing[0]
    assert float(said.group(1)) <= round(took, 1) + 0.05, (closing[0], took)
