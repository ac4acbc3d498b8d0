"""Ranks whose clocks are 1.5 s ahead or behind give the same step ledger as ranks on one
clock (issue 49): real producer processes run their phases at set moments of real time, each
reading a clock moved by its skew (``time.time`` patched in the process, as
test_clock_skew.py does), against a real collector; and the same behind a relay whose own
clock is 1.5 s ahead of the root's. No phantom straggler wait, no gap that is not there."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rlpulse.schemas import ledger as L
from rlpulse.schemas.spans import Span
from tests.integration.collectors import live_collector, root, wait_for_steps
from tests.support.net import free_port

pytestmark = pytest.mark.timeout(300)

STEPS, PERIOD, LEAD_S = 5, 0.8, 1.5
RANKS = (("rollout", 0), ("actor_train", 0), ("actor_train", 1))
SCHEDULE = {  # (phase, from, to) within a step, in seconds of real time
    ("rollout", 0): ("generate", 0.0, 0.3),
    ("actor_train", 0): ("train_step", 0.4, 0.6),
    ("actor_train", 1): ("train_step", 0.4, 0.7),
}
"""A step: rollout 0.3 s, a 0.1 s gap, both ranks training 0.2 s, then rank 1 alone 0.1 s (a
straggler): the clocks' skews are ten times the step's parts."""
TOLERANCE_S = 0.02

RANK = """
import json, sys, time
from rlpulse.producer import Producer
from rlpulse.producer.config import ProducerConfig

address, run, role, rank, skew, phase, start, end, steps, period = sys.argv[1:11]
rank, skew, start, end = int(rank), float(skew), float(start), float(end)
steps, period = int(steps), float(period)
real = time.time
time.time = lambda: real() + skew  # this process's clock, as log() and the stamps read it


def until(t: float) -> None:
    while real() < t:
        time.sleep(min(0.002, max(0.0, t - real())))


roles = {"rollout": 1, "actor_train": 2}
with Producer(address, run=run, role=role, rank=rank, world_size=roles[role],
              expected_roles=roles,
              config=ProducerConfig(heartbeat_s=0.2, close_timeout_s=20)) as p:
    print("ready", flush=True)
    t0 = float(sys.stdin.readline())  # the same moment of real time for every rank
    ran = []
    for step in range(steps):
        base = t0 + step * period
        until(base + start)
        began = real()
        with p.phase(f"{role}/{phase}", step=step):
            until(base + end)
        ran.append((step, began, real()))  # when it really ran, on the true clock
        p.step_done(step)
print(json.dumps(ran), flush=True)
"""


def run_ranks(address: str, run: str, skews: dict[tuple[str, int], float]) -> dict[int, list[Span]]:
    """The ranks' processes, started, then given one moment of real time to start from;
    per step, the spans of when each rank's phase really ran (a loaded machine runs them
    late now and then: the truth is what happened, not the schedule)."""
    procs = []
    for role, rank in RANKS:
        phase, start, end = SCHEDULE[(role, rank)]
        args = [address, run, role, rank, skews.get((role, rank), 0.0), phase, start, end]
        procs.append(
            subprocess.Popen(
                [sys.executable, "-c", RANK, *map(str, [*args, STEPS, PERIOD])],
                cwd=Path(__file__).parents[2],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
        )
    for proc in procs:
        assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
    t0 = time.time() + LEAD_S  # heartbeats measure the clocks before the first step
    for proc in procs:
        assert proc.stdin is not None
        proc.stdin.write(f"{t0!r}\n")
        proc.stdin.flush()
    truth: dict[int, list[Span]] = {}
    for (role, rank), proc in zip(RANKS, procs, strict=True):
        assert proc.wait(120) == 0
        assert proc.stdout is not None
        phase = SCHEDULE[(role, rank)][0]
        for step, began, ended in json.loads(proc.stdout.read()):
            span = Span(role, rank, "h", role, phase, began, ended)
            truth.setdefault(step, []).append(span)
    return truth


def ledgers(path: Path, run: str) -> list[dict]:
    records = [json.loads(line) for line in path.read_text().splitlines()]
    mine = sorted((r for r in records if r["run"] == run), key=lambda r: r["step"])
    assert [r["step"] for r in mine] == list(range(STEPS))
    return mine


def check(records: list[dict], truth: dict[int, list[Span]]) -> None:
    """Each step's ledger is the one of when its phases really ran, to the clock offsets'
    error (the messages' least delay) and what the phases' own bookkeeping adds."""
    for r in records:
        m = r["metrics"]
        bucket = {b: m[L.LEDGER_BUCKET.format(bucket=b)] for b in L.BUCKETS}
        assert sum(bucket.values()) == pytest.approx(m[L.LEDGER_WALL.name], rel=0.01)
        want = L.compute(truth[r["step"]])
        assert want is not None
        assert m[L.LEDGER_WALL.name] == pytest.approx(want.wall, abs=TOLERANCE_S), r["step"]
        for name in (L.WORK, L.STRAGGLER, L.GAPS):
            got = bucket[name] + (bucket[L.UNACCOUNTED] if name == L.WORK else 0.0)
            assert got == pytest.approx(want.buckets[name], abs=TOLERANCE_S), (r["step"], name)
        assert r["ledger"]["start"] == pytest.approx(want.record.start, abs=TOLERANCE_S)


SKEWED = {("rollout", 0): 1.5, ("actor_train", 0): -1.5, ("actor_train", 1): 1.5}


def test_ranks_off_by_a_second_and_a_half_give_the_ledger_of_one_clock(tmp_path: Path) -> None:
    with live_collector(tmp_path, grace_s=30) as live:
        truth = run_ranks(live.collector.address, "one-clock", {})
        skewed_truth = run_ranks(live.collector.address, "skewed", SKEWED)
        assert live.collector.stop() == 0
    check(ledgers(live.out, "one-clock"), truth)
    check(ledgers(live.out, "skewed"), skewed_truth)
    assert "ahead of this collector's clock" not in live.log.read_text(), "nothing bounded"


RELAY = """
import sys, time
real = time.time
time.time = lambda: real() + float(sys.argv[1])  # the relay's host clock
from rlpulse.collector.__main__ import main
sys.exit(main(["--config", sys.argv[2], "--bind", sys.argv[3]]))
"""


def test_behind_a_relay_whose_clock_is_ahead_the_root_has_the_same_ledger(
    tmp_path: Path,
) -> None:
    import yaml

    top, out = root(tmp_path)
    bind = f"tcp://127.0.0.1:{free_port()}"
    config = tmp_path / "relay.yaml"
    config.write_text(
        yaml.safe_dump({"upstream": top.address, "settle_s": 0, "grace_s": 60, "liveness_s": 60})
    )
    with (tmp_path / "relay.log").open("w") as log:
        skewed_relay = subprocess.Popen(
            [sys.executable, "-c", RELAY, "1.5", str(config), bind], stderr=log
        )
    try:
        time.sleep(3)  # the relay binds and says hello
        assert skewed_relay.poll() is None, (tmp_path / "relay.log").read_text()
        truth = run_ranks(bind, "relayed", {("rollout", 0): -1.5, ("actor_train", 1): 1.5})
        wait_for_steps(out, "relayed", STEPS)
    finally:
        skewed_relay.terminate()
        skewed_relay.wait(60)
        assert top.stop() == 0
    check(ledgers(out, "relayed"), truth)
