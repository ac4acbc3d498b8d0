"""Relays in process: two relay aggregators under a root, and a reference collector fed the
same messages. The records a relay emits go to the root as its upstream sink would send them.
``Tiers.same_as_reference`` checks that the root wrote what one collector of every rank
would. With ``gated``, what the relays send goes through the root's
:class:`~rlpulse.collector.intake.delivery.Delivery` with its flow control, as in the daemon
(a relay ahead is held back, and released after the root's polls).
"""

from __future__ import annotations

import pytest

from rlpulse.collector.config import CollectorConfig
from rlpulse.collector.intake.delivery import Delivery
from rlpulse.collector.runs.aggregator import Aggregator
from rlpulse.collector.tiers.relay import Relay as RelayOutput, RelayRecord
from rlpulse.schemas import protocol as P
from rlpulse.schemas.messages import Member, TableDecl
from rlpulse.schemas.record import StepRecord
from tests.collector.helpers import TIMING, Declaring


class Relay:
    """A relay aggregator and what its upstream sink would have sent so far. A relay may be
    frozen (:meth:`freeze`, as by SIGSTOP): it then receives, polls and sends nothing, what
    its ranks send waits, and once thawed its clock leaves the freeze out, as the daemon's
    does (``rlpulse.collector.loopclock``)."""

    def __init__(
        self,
        relay_id: int,
        root: Aggregator,
        clock: list[float],
        delivery: Delivery | None = None,
    ) -> None:
        config = CollectorConfig(upstream="tcp://127.0.0.1:1", trackers={}, **TIMING)  # type: ignore[arg-type]
        self.relay = RelayOutput(relay_id)
        self.agg = Aggregator(self._forward, config, output=self.relay)
        self.feed = Declaring(self.agg)
        self.root, self.clock, self.delivery = root, clock, delivery
        self.tables: dict[int, TableDecl] = {}
        self.members: dict[int, Member] = {}
        self.sent: list[RelayRecord] = []
        self.frozen_at: float | None = None
        self.paused_s = 0.0
        self.waiting: list[P.Message] = []
        """What its ranks sent while it was frozen."""

    def now(self) -> float:
        """The relay's own clock: the shared one less its freezes."""
        return self.clock[0] - self.paused_s

    def handle(self, msg: P.Message) -> None:
        if self.frozen_at is not None:
            self.waiting.append(msg)
        else:
            self.feed.handle(msg, self.now())

    def poll(self) -> None:
        if self.frozen_at is None:
            self.agg.poll(self.now())

    def freeze(self) -> None:
        self.frozen_at = self.clock[0]

    def thaw(self) -> None:
        """Runs again: the freeze is its own pause; what its ranks sent meanwhile comes in."""
        assert self.frozen_at is not None
        self.paused_s += self.clock[0] - self.frozen_at
        self.frozen_at = None
        waiting, self.waiting = self.waiting, []
        for msg in waiting:
            self.handle(msg)

    def _forward(self, record: RelayRecord) -> None:
        self.sent.append(record)
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
            self._deliver(msg)
        elif record.kind == "delta":
            self._deliver(P.decode(record.message))
        elif record.kind == "heartbeat":
            self._deliver(P.Heartbeat(self.relay.relay_id, 0, {}))

    def _deliver(self, msg: P.Message) -> None:
        now = self.clock[0]
        if self.delivery is None:
            self.root.handle(msg, now)
            return
        for accepted, _ in self.delivery.accept(msg, b"relay", b"", self.root.admits):
            self.root.handle(accepted, now)


class Tiers:
    """Relays A and B under a root, and a reference collector fed the same messages."""

    def __init__(self, *, gated: bool = False, **root_config: object) -> None:
        """``root_config``: the root's settings beyond ``TIMING`` (``max_open_steps``...)."""
        self.clock = [0.0]
        self.out: list[StepRecord] = []
        self.ref_out: list[StepRecord] = []
        config = CollectorConfig(**{**TIMING, **root_config})  # type: ignore[arg-type]
        self.root = Aggregator(self.out.append, config)
        self.ref = Aggregator(self.ref_out.append, CollectorConfig(**TIMING))
        self.delivery = Delivery(self.root.health) if gated else None
        self.relays = {
            "A": Relay(0xA, self.root, self.clock, self.delivery),
            "B": Relay(0xB, self.root, self.clock, self.delivery),
        }
        self.ref_feed = Declaring(self.ref)

    def send(self, via: str, *msgs: P.Message) -> None:
        """``msgs`` to relay ``via`` and to the reference, each after the hello that declares
        its tables (``Declaring``: one for each relay, one for the reference)."""
        for m in msgs:
            self.relays[via].handle(m)
            self.ref_feed.handle(m, self.clock[0])
        self.poll()

    def poll(self) -> None:
        now = self.clock[0]
        for relay in self.relays.values():
            relay.poll()
        self.root.poll(now)
        if self.delivery is not None:  # what the root held back, once it has room (daemon)
            for accepted, _ in self.delivery.release(self.root.has_room, self.root.admits):
                self.root.handle(accepted, now)
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
