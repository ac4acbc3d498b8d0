"""A collector frozen longer than ``liveness_s`` (SIGSTOP: a VM pause, a swap storm, a
debugger) must not, on waking, presume its healthy producers dead, flag their steps partial
and refuse what they sent meanwhile as late (issue 38, item 2). A real collector process kept
busy by eight producer processes logging wide calls throughout, frozen three times with a real
SIGSTOP and SIGCONT: a freeze that lands while it is busy is the one that did the harm."""

from __future__ import annotations

import json
import os
import signal
import time
import urllib.request
from pathlib import Path

import pytest

from rlpulse.producer import Producer
from rlpulse.producer.config import ProducerConfig
from tests.integration.collectors import SPAWN, Setup
from tests.support.net import free_port

RANKS, LIVENESS_S, FROZEN_S, FREEZES, PACE_S = 8, 2.0, 4.0, 3, 0.01
NAMES = [f"frozen/m{i:03d}" for i in range(200)]
"""Wide calls at up to 100 steps a second a rank: the collector is busy most of the time (so a
freeze lands mid-pass) without falling far behind (a backlog held back for minutes would
test flow control, not freezes)."""


def value(step: int, rank: int, i: int) -> float:
    return 10.0 * (step % 1000) + rank + i


def rank(bind: str, rank: int, go: str, stop: str, stats: str) -> None:
    Path(f"{stats}.ready").touch()
    while not Path(go).exists():  # every rank registers at once: none is late by liveness_s
        time.sleep(0.01)
    p = Producer(
        bind,
        run="frozen",
        role="actor_train",
        rank=rank,
        world_size=RANKS,
        config=ProducerConfig(close_timeout_s=60, gpu_sample_s=0),
    )
    step = 0
    while not Path(stop).exists():
        p.log({name: value(step, rank, i) for i, name in enumerate(NAMES)}, step=step)
        step += 1
        time.sleep(PACE_S)
    flushed = p.flush(60)
    Path(stats).write_text(json.dumps({**p.stats(), "flushed": flushed}))
    p.close()


@pytest.mark.timeout(600)
def test_a_collector_frozen_past_liveness_flags_nothing_and_drops_nothing(tmp_path) -> None:
    prom = free_port()
    out = tmp_path / "out.jsonl"
    setup = Setup(
        tmp_path,
        liveness_s=LIVENESS_S,
        grace_s=120,  # a slow rank is waited for: only liveness can flag a step here
        track_with=["jsonl", "prometheus"],
        tracker_kwargs={"jsonl": {"path": str(out)}, "prometheus": {"port": prom}},
    )
    collector = setup.started()
    try:
        frozen(setup, collector.proc.pid, tmp_path)
        with urllib.request.urlopen(f"http://127.0.0.1:{prom}/metrics", timeout=10) as r:
            metrics = r.read().decode()
    finally:
        os.kill(collector.proc.pid, signal.SIGCONT)  # never left frozen
        code = collector.stop()
    assert code == 0

    stats = [json.loads((tmp_path / f"rank{r}").read_text()) for r in range(RANKS)]
    partial, steps = 0, 0
    with out.open() as f:
        for line in f:
            record = json.loads(line)
            assert record["step"] == steps
            partial += record["partial"]
            if record["ranks"] == RANKS:  # past a rank's last step, the others' only
                got = record["metrics"]["frozen/m007"]
                assert got == pytest.approx(value(steps, 0, 7) + (RANKS - 1) / 2), steps
            steps += 1
    late = [s["dropped_late"] for s in stats]
    assert (partial, late) == (0, [0] * RANKS), f"{partial} of {steps} steps partial; late {late}"
    assert all(s["flushed"] for s in stats)
    paused = next(
        float(row.split()[-1])
        for row in metrics.splitlines()
        if row.startswith("rlpulse_collector_paused_seconds_total ")
    )
    assert paused >= FREEZES * (FROZEN_S - 1.5), paused


def frozen(setup: Setup, pid: int, tmp_path: Path) -> None:
    """Eight ranks logging throughout; the collector frozen ``FREEZES`` times meanwhile."""
    go, stop = tmp_path / "go", tmp_path / "stop"
    procs = [
        SPAWN.Process(
            target=rank, args=(setup.bind, r, str(go), str(stop), str(tmp_path / f"rank{r}"))
        )
        for r in range(RANKS)
    ]
    for p in procs:
        p.start()
    deadline = time.monotonic() + 120
    while not all((tmp_path / f"rank{r}.ready").exists() for r in range(RANKS)):
        assert time.monotonic() < deadline, "the rank processes did not start"
        time.sleep(0.05)
    go.touch()
    setup.wait_lines(50, timeout=120)  # every rank is up and logging
    for _ in range(FREEZES):
        os.kill(pid, signal.SIGSTOP)
        time.sleep(FROZEN_S)
        os.kill(pid, signal.SIGCONT)
        time.sleep(1.5)
    stop.touch()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
