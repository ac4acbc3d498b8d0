"""Producers' clock offsets (rlpulse.collector.intake.clock): measured from the stamps of
hellos and heartbeats, applied to every log() time, through a relay too, kept across a
restart; and the wire fields that carry the stamps, read by older and newer decoders alike.

The proof: ranks whose clocks are 1.5 s ahead or behind give the same step ledger as ranks
on one clock (no phantom wait, no negative gap)."""

from __future__ import annotations

import msgspec
import pytest

from rlpulse.collector.config import CollectorConfig
from rlpulse.collector.health import Health
from rlpulse.collector.intake.clock import APPLY_OFFSET_S, OFFSET_SAMPLES, ClockBound
from rlpulse.collector.runs.aggregator import Aggregator
from rlpulse.collector.runs.members import ProducerInfo
from rlpulse.collector.tiers.relay import Relay as RelayOutput, RelayRecord
from rlpulse.schemas import ledger as L, metrics as M, protocol as P
from rlpulse.schemas.errors import SchemaError
from rlpulse.schemas.record import StepRecord
from tests.collector.helpers import TIMING, Declaring, hello, metrics

# --------------------------------------------------------------------------- the estimate


PROD = ProducerInfo(7, "r", "actor_train", 0, 1, "host", 0.0)


def test_the_offset_is_the_least_delay_over_the_last_stamps() -> None:
    now = [1000.0]
    clock = ClockBound(lambda: now[0], Health())
    for delay in (0.040, 0.002, 0.030):  # a clock 1.5 s ahead; the messages took this long
        now[0] += 1.0
        clock.sample(PROD, sent=now[0] + 1.5 - delay)
    assert clock.offsets[7] == pytest.approx(-1.5 + 0.002)
    clock.sample(PROD, sent=0.0)  # not stamped: nothing learnt
    assert clock.offsets[7] == pytest.approx(-1.498)
    # a clock that jumps ahead (an hour) is followed at once
    now[0] += 1.0
    clock.sample(PROD, sent=now[0] + 3600.0 - 0.001)
    assert clock.offsets[7] == pytest.approx(-3599.999)
    # one that jumps back, once the older stamps have aged out
    for i in range(OFFSET_SAMPLES):
        now[0] += 1.0
        clock.sample(PROD, sent=now[0] - 0.2 - 0.001)
        assert clock.offsets[7] == pytest.approx(-3599.999 if i < OFFSET_SAMPLES - 1 else 0.201)


def test_a_synchronised_clock_is_left_alone() -> None:
    now = [50.0]
    clock = ClockBound(lambda: now[0], Health())
    clock.sample(PROD, sent=now[0] - APPLY_OFFSET_S / 2)
    assert PROD.pid not in clock.offsets
    prod_entries = [(0, 49.0, 1, b"", {})]
    assert clock.entries(PROD, prod_entries, replay=False) is prod_entries, "no copy"


def test_offsets_survive_a_restart_and_forgetting_drops_them() -> None:
    now = [10.0]
    clock = ClockBound(lambda: now[0], Health())
    clock.sample(PROD, sent=8.0)
    again = ClockBound(lambda: now[0], Health())
    again.restore(msgspec.json.decode(msgspec.json.encode(clock.snapshot())))
    assert again.offsets == {7: 2.0}
    now[0] = 20.0
    again.sample(PROD, sent=17.5)  # a backlog after the restart: slower than what was known
    assert again.offsets == {7: 2.0}
    again.forget([7])
    assert again.offsets == {}


# --------------------------------------------------------------------------- the wire


def test_stamps_are_optional_last_fields_older_and_newer_decoders_agree() -> None:
    class OldHeartbeat(msgspec.Struct, array_like=True, tag=24):
        producer: int
        seq: int
        stats: dict[str, int]
        flush: bool = False

    new = P.encode_heartbeat(5, 3, {"logged": 2}, sent=1234.5)
    assert msgspec.msgpack.Decoder(OldHeartbeat).decode(new).stats == {"logged": 2}
    old = msgspec.msgpack.encode(OldHeartbeat(5, 3, {"logged": 2}))
    decoded = P.decode(old)
    assert isinstance(decoded, P.Heartbeat) and decoded.sent == 0.0
    assert P.decode(new).sent == 1234.5  # type: ignore[union-attr]
    stamped = hello(9, sent=99.25)
    assert stamped.sent == 99.25
    # a hello without its last field, as a producer that predates it sends it
    shorter = msgspec.msgpack.encode(msgspec.msgpack.decode(msgspec.msgpack.encode(stamped))[:-1])
    assert P.decode(shorter) == msgspec.structs.replace(stamped, sent=0.0)
    with pytest.raises(SchemaError) as bad:
        P.decode(P.encode_heartbeat(5, 3, {}, sent=float("nan")))
    assert bad.value.reason == "bad_field"


# --------------------------------------------------------------------------- the ledger

AT0, AT1, RO = 11, 12, 13
RANKS = {AT0: ("actor_train", 0), AT1: ("actor_train", 1), RO: ("rollout", 0)}
SCHEDULE = [  # (producer, phase, true start, true end) of step 0
    (AT0, "model_update", 1000.0, 1000.2),
    (RO, "generate", 1000.3, 1001.3),
    (AT0, "train_step", 1001.4, 1002.4),
    (AT1, "train_step", 1001.4, 1002.9),
]


def phase_end(pid: int, phase: str, seconds: float, t: float) -> P.Metrics:
    role, _ = RANKS[pid]
    values = {
        M.TIME_PHASE.format(cluster=role, phase=phase, part=part): seconds
        for part in ("total", "execute")
    }
    return metrics(pid, 0, values, t=t)


def one_step(skew: dict[int, float], stamped: bool = True) -> StepRecord:
    """Step 0 of :data:`SCHEDULE` through one collector; producer ``p``'s clock reads the
    true time plus ``skew[p]``; each message arrives 1 to 3 ms after it was sent."""
    true = [999.0]
    out: list[StepRecord] = []
    agg = Aggregator(out.append, CollectorConfig(**TIMING), wall_clock=lambda: true[0])
    feed = Declaring(agg)
    for i, (pid, (role, rank)) in enumerate(RANKS.items()):
        sent = true[0] + skew.get(pid, 0.0) if stamped else 0.0
        true[0] += 0.001 * (i + 1)
        feed.handle(
            hello(pid, role=role, rank=rank, ws=2 if role == "actor_train" else 1, sent=sent), 0.0
        )
    for pid, phase, start, end in SCHEDULE:
        true[0] = end + 0.002
        feed.handle(phase_end(pid, phase, end - start, end + skew.get(pid, 0.0)), 0.0)
    true[0] = 1003.0
    for pid in RANKS:
        agg.handle(P.Done(pid, 2, 0), 0.0)
    agg.poll(0.0)
    (record,) = out
    return record


def ledger_numbers(record: StepRecord) -> dict[str, float]:
    return {k: v for k, v in record.metrics.items() if k.startswith("ledger/")}


@pytest.mark.parametrize("skew", [{AT0: 1.5, AT1: -1.5}, {AT0: -1.5, RO: 1.5}])
def test_clocks_off_by_a_second_and_a_half_give_the_same_ledger(skew: dict[int, float]) -> None:
    truth = one_step({})
    got = one_step(skew)
    want = ledger_numbers(truth)
    assert want[L.LEDGER_BUCKET.format(bucket=L.STRAGGLER)] == pytest.approx(0.5, abs=0.01)
    assert want[L.LEDGER_BUCKET.format(bucket=L.GAPS)] == pytest.approx(0.2, abs=0.01)
    assert ledger_numbers(got).keys() == want.keys()
    for name, value in want.items():
        assert ledger_numbers(got)[name] == pytest.approx(value, abs=0.005), name
    assert got.ledger is not None and truth.ledger is not None
    # the same path, but for slivers of the estimate's own error (the messages' delays)
    assert [(s.role, s.rank, s.phase) for s in got.ledger.path if s.seconds > 0.01] == [
        (s.role, s.rank, s.phase) for s in truth.ledger.path
    ]


def test_without_stamps_the_offset_clocks_make_phantom_waits() -> None:
    """What the stamps prevent: the same skew from producers that do not stamp (or a
    collector that ignored them) moves rank 1's training 1.5 s before the rollout ended."""
    got = ledger_numbers(one_step({AT0: 1.5, AT1: -1.5}, stamped=False))
    want = ledger_numbers(one_step({}))
    assert max(abs(got.get(k, 0.0) - v) for k, v in want.items()) > 0.3


def test_a_relay_places_its_ranks_and_the_root_places_the_relay() -> None:
    """Ranks behind a relay whose own clock is 1.5 s ahead of the root's, one rank 1.5 s
    behind its relay: the root's ledger is the one of a single collector on one clock."""
    true = [999.0]
    relay_ahead, skew = 1.5, {AT0: -1.5, AT1: 0.0, RO: 0.7}
    out: list[StepRecord] = []
    root = Aggregator(out.append, CollectorConfig(**TIMING), wall_clock=lambda: true[0])
    relay_id = 0xA

    def forward(record: RelayRecord) -> None:
        if record.kind == "announce":
            msg = P.RelayHello(relay_id, 1, "h", 1, list(record.tables), list(record.members))
            root.handle(msg, 0.0)
            beat = P.Heartbeat(relay_id, 0, {}, False, true[0] + relay_ahead - 0.001)
            root.handle(beat, 0.0)
        elif record.kind == "delta":
            root.handle(P.decode(record.message), 0.0)

    config = CollectorConfig(upstream="tcp://127.0.0.1:1", trackers={}, **TIMING)  # type: ignore[arg-type]
    relay = Aggregator(
        forward, config, output=RelayOutput(relay_id), wall_clock=lambda: true[0] + relay_ahead
    )
    feed = Declaring(relay)
    for pid, (role, rank) in RANKS.items():
        feed.handle(
            hello(
                pid,
                role=role,
                rank=rank,
                ws=2 if role == "actor_train" else 1,
                sent=true[0] + skew[pid],
            ),
            0.0,
        )
        relay.poll(0.0)
    for pid, phase, start, end in SCHEDULE:
        true[0] = end + 0.002
        feed.handle(phase_end(pid, phase, end - start, end + skew[pid]), 0.0)
    true[0] = 1003.0
    for pid in RANKS:
        relay.handle(P.Done(pid, 2, 0), 0.0)
    relay.poll(0.0)
    root.poll(0.0)
    relay.flush()
    root.flush()
    (record,) = out
    want = ledger_numbers(one_step({}))
    for name, value in want.items():
        assert ledger_numbers(record)[name] == pytest.approx(value, abs=0.005), name
    assert record.ledger is not None
    assert record.ledger.start == pytest.approx(1000.0, abs=0.005)
