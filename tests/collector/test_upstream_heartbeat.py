"""A relay's upstream sink heartbeats from its own thread with the relay's disk state
(issue 38, item 3): also while the relay emits nothing, and at once when the state changes."""

from __future__ import annotations

from rlpulse.collector.config import CollectorConfig
from rlpulse.collector.tiers.upstream import UpstreamSink
from rlpulse.schemas import protocol


class _Link:
    def __init__(self) -> None:
        self.sent: list[protocol.Message] = []

    def send(self, payload: bytes) -> None:
        self.sent.append(protocol.decode(payload))


def connected_sink() -> tuple[UpstreamSink, _Link]:
    sink = UpstreamSink(CollectorConfig(upstream="tcp://127.0.0.1:1", trackers={}), 7)
    link = _Link()
    sink._transport = link
    sink._connected = sink._answered = True
    sink._pump = lambda wait_s: None  # type: ignore[method-assign]
    return sink, link


def test_an_idle_upstream_sink_heartbeats_with_the_relays_disk_state() -> None:
    sink, link = connected_sink()
    sink.report({"disk_errors": 3, "state_unwritable": 1})
    sink.idle()
    sink.idle()  # not due again, nothing changed
    assert len(link.sent) == 1
    beat = link.sent[0]
    assert isinstance(beat, protocol.Heartbeat) and beat.producer == 7
    assert beat.stats["disk_errors"] == 3 and beat.stats["state_unwritable"] == 1
    sink.report({"disk_errors": 3, "state_unwritable": 0})  # writable again: told at once
    sink.idle()
    assert len(link.sent) == 2 and link.sent[1].stats["state_unwritable"] == 0


def test_a_producers_heartbeat_carries_no_relay_counters() -> None:
    beat = protocol.decode(protocol.encode_heartbeat(5, 0, {"logged": 2}))
    assert isinstance(beat, protocol.Heartbeat)
    assert "disk_errors" not in beat.stats and beat.stats["logged"] == 2
