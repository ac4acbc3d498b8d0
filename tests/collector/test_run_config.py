"""A run's config in the collector (``rlpulse.collector.runs.runconfig``): from a hello onto the
run's next step once, again only when it changes, kept through a restart from the checkpoint,
forwarded by relays, forgotten with the run; a bad one counted while the hello stands."""

from __future__ import annotations

import json

import msgspec

from rlpulse.schemas import protocol as P, runconfig
from rlpulse.schemas.record import RunForgotten, StepRecord
from tests.collector.helpers import Harness, hello, metrics, table, through_a_restart
from tests.collector.tiers import Tiers

LOSS = "actor/pg_loss"
CONFIG = {"actor": {"lr": 1e-6, "clip": [0.2, 0.28]}, "seed": 7}


def configs(records: list) -> list[tuple[int, dict]]:
    return [(r.step, dict(r.config)) for r in records if isinstance(r, StepRecord) and r.config]


def test_the_next_step_emitted_carries_the_config_once_and_a_change_the_next_after_it() -> None:
    h = Harness()
    h.send(hello(1, role="driver", config=runconfig.encode(CONFIG)))
    h.send(metrics(1, 0, {LOSS: 1.0}), metrics(1, 1, {LOSS: 1.0}))
    h.send(hello(1, role="driver", config=runconfig.encode(CONFIG)))  # every hello repeats it
    h.send(metrics(1, 2, {LOSS: 1.0}))
    changed = {**CONFIG, "seed": 8}
    h.send(hello(1, role="driver", config=runconfig.encode(changed)))
    h.send(metrics(1, 3, {LOSS: 1.0}), metrics(1, 4, {LOSS: 1.0}))
    # step 2 was still open (a rank finishes a step by logging a later one): it goes out next
    assert configs(h.records) == [(0, CONFIG), (2, changed)]
    line = json.loads(h.records[0].encode())
    assert line["config"] == CONFIG and "config" not in json.loads(h.records[1].encode())


def test_two_producers_sending_different_configs_do_not_take_turns() -> None:
    h = Harness()
    a, b = runconfig.encode({"x": 1}), runconfig.encode({"x": 2})
    h.send(hello(1, rank=0, ws=2, config=a), hello(2, rank=1, ws=2, config=b))
    for step in range(4):  # their hellos repeat, unchanged, between the steps
        h.send(hello(1, rank=0, ws=2, config=a), hello(2, rank=1, ws=2, config=b))
        h.send(metrics(1, step, {LOSS: 1.0}), metrics(2, step, {LOSS: 1.0}))
    assert configs(h.records) == [(0, {"x": 2})]  # the last one that changed


def test_a_bad_config_is_counted_and_the_hello_stands() -> None:
    h = Harness()
    bad = msgspec.msgpack.encode({"a": b"bytes are no config"})
    h.send(hello(1, config=bad), metrics(1, 0, {LOSS: 2.0}), P.Bye(1, 9, {}))
    h.send(hello(1, config=bad))  # the same bytes again: judged once
    assert h.agg.health.malformed["bad_config"] == 1
    assert [r.metrics[LOSS] for r in h.records] == [2.0] and configs(h.records) == []


def test_a_restart_from_the_checkpoint_neither_loses_nor_repeats_it() -> None:
    said = [table([LOSS])]  # replayed as logged: each hello declares the table
    order: list[P.Message] = [hello(1, role="driver", tables=said, config=runconfig.encode(CONFIG))]
    order += [metrics(1, step, {LOSS: float(step)}) for step in range(6)]
    order.insert(4, hello(1, role="driver", tables=said, config=runconfig.encode({"seed": 9})))
    for checkpoint_at, crash_at in ((0.0, 0.1), (0.2, 0.5), (0.5, 0.9), (0.9, 1.0)):
        got, whole = through_a_restart(order, checkpoint_at, crash_at)
        assert configs(got) == configs(whole) == [(0, CONFIG), (2, {"seed": 9})], (
            checkpoint_at,
            crash_at,
        )


def test_a_relay_forwards_its_producers_config_to_the_root() -> None:
    t = Tiers()
    t.send("A", hello(1, run="r", role="driver", config=runconfig.encode(CONFIG)))
    t.send("A", metrics(1, 0, {LOSS: 1.0}), P.Bye(1, 9, {}))
    t.tick(1.0)
    assert configs(t.out) == configs(t.ref_out) == [(0, CONFIG)]
    member = t.relays["A"].members[1]
    assert runconfig.decode(member.config) == CONFIG


def test_the_config_is_forgotten_with_the_run() -> None:
    h = Harness(run_retention_s=30.0)
    h.send(hello(1, config=runconfig.encode(CONFIG)), metrics(1, 0, {LOSS: 1.0}), P.Bye(1, 9, {}))
    assert "configs" in h.agg.snapshot()
    for _ in range(70):
        h.tick(0.5)
    assert h.records[-1] == RunForgotten("r")
    assert h.agg.configs.by_run == {} and "configs" not in h.agg.snapshot()
    # resumed after that, its first step carries the config again
    h.send(hello(2, resume=True, config=runconfig.encode(CONFIG)), metrics(2, 1, {LOSS: 1.0}))
    h.send(P.Bye(2, 9, {}))
    assert configs(h.records) == [(0, CONFIG), (1, CONFIG)]


def test_a_relays_announcement_keeps_the_config_in_its_outbox() -> None:
    """What a relay keeps in its ``state_dir`` to announce after a restart holds the config."""
    from rlpulse.collector.durability.statefiles import decode_record
    from rlpulse.collector.tiers.relay import RelayRecord

    t = Tiers()
    t.send("A", hello(1, run="r", role="driver", config=runconfig.encode(CONFIG)))
    (announce,) = [r for r in t.relays["A"].sent if r.kind == "announce"]
    _, _, back = decode_record(announce.encode(seq=1, emitted_at=0.0))
    assert isinstance(back, RelayRecord)
    assert runconfig.decode(back.members[0].config) == CONFIG
