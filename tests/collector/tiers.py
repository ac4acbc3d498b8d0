"""Relays in process: two relay aggregators under a root, and a reference collector fed the
same messages. The records a relay emits go to the root as its upstream sink would send them.
``Tiers.same_as_reference`` checks that the root wrote what one collector of every rank
would.
"""

from __future__ import annotations

import pytest

from rlpulse.collector.config import CollectorConfig
from rlpulse.collector.runs.aggregator import Aggregator
from rlpulse.collector.tiers.relay import Relay as RelayOutput, RelayRecord
from rlpulse.schemas import protocol as P
from rlpulse.schemas.messages import Member, TableDecl
from rlpulse.schemas.record import StepRecord
from tests.collector.helpers import TIMING, Declaring


class Relay:
    """A relay aggregator and what its upstream sink would have sent so far."""

    def __init__(self, relay_id: int, root: Aggregator, clock: list[float]) -> None:
        config = CollectorConfig(upstream="tcp://127.0.0.1:1", trackers={}, **TIMING)  # type: ignore[arg-type]
        self.relay = RelayOutput(relay_id)
        self.agg = Aggregator(self._forward, config, output=self.relay)
        self.feed = Declaring(self.agg)
        self.root, self.clock = root, clock
        self.tables: dict[int, TableDecl] = {}
        self.members: dict[int, Member] = {}
        self.sent: list[RelayRecord] = []

    def _forward(self, record: RelayRecord) -> None:
        self.sent.append(record)
        now = self.clock[0]
        if record.kind == "announce":
            self.tables.update((t.id, t) for t in record.tables)
            self.members.update((m.producer, m) for m in record.members)
            msg = P.RelayHello(
                self.relay.relay_id,
                1,
                "h",
                1,
                list(self.tables.values()),
                list(self.members.values()),
            )
            self.root.handle(msg, now)
        elif record.kind == "delta":
            self.root.handle(P.decode(record.message), now)
        elif record.kind == "heartbeat":
            self.root.handle(P.Heartbeat(self.relay.relay_id, 0, {}), now)


class Tiers:
    """Relays A and B under a root, and a reference collector fed the same messages."""

    def __init__(self) -> None:
        self.clock = [0.0]
        self.out: list[StepRecord] = []
        self.ref_out: list[StepRecord] = []
        self.root = Aggregator(self.out.append, CollectorConfig(**TIMING))
        self.ref = Aggregator(self.ref_out.append, CollectorConfig(**TIMING))
        self.relays = {
            "A": Relay(0xA, self.root, self.clock),
            "B": Relay(0xB, self.root, self.clock),
        }
        self.ref_feed = Declaring(self.ref)

    def send(self, via: str, *msgs: P.Message) -> None:
        """``msgs`` to relay ``via`` and to the reference, each after the hello that declares
        its tables (``Declaring``: one for each relay, one for the reference)."""
        for m in msgs:
            self.relays[via].feed.handle(m, self.clock[0])
            self.ref_feed.handle(m, self.clock[0])
        self.poll()

    def poll(self) -> None:
        now = self.clock[0]
        for relay in self.relays.values():
            relay.agg.poll(now)
        self.root.poll(now)
        self.ref.poll(now)

    def tick(self, seconds: float) -> None:
        self.clock[0] += seconds
        self.poll()

    def same_as_reference(self) -> None:
        assert [r.step for r in self.out] == [r.step for r in self.ref_out]
        for got, want in zip(self.out, self.ref_out, strict=True):
            assert (got.partial, got.ranks, got.missing) == (want.partial, want.ranks, want.missing)
            assert got.metrics.keys() == want.metrics.keys()
            for name, value in want.metrics.items():
                assert got.metrics[name] == pytest.approx(value, rel=1e-12, abs=1e-12), name
            assert got.roles == want.roles
