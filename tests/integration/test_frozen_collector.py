"""A collector frozen longer than ``liveness_s`` (SIGSTOP: a VM pause, a swap storm, a
debugger) must not, on waking, presume its healthy producers dead, flag their steps partial
and refuse what they sent meanwhile as late (issue 38, item 2). A real collector process, real
producers in this process logging throughout, a real SIGSTOP and SIGCONT."""

from __future__ import annotations

import json
import os
import signal
import time
import urllib.request

from rlpulse.producer import Producer
from rlpulse.producer.config import ProducerConfig
from tests.integration.test_state_faults import Setup, free_port

RANKS, LIVENESS_S, FROZEN_S, PACE_S, BURST = 8, 2.0, 6.0, 0.01, 150
NAMES = [f"frozen/m{i:03d}" for i in range(200)]
"""Wide calls: what the producers send during the freeze is more than the sockets' buffers
hold, so on waking it takes the collector a while to read it all."""


def values(step: int, rank: int) -> dict[str, float]:
    return {name: 10.0 * step + rank + i for i, name in enumerate(NAMES)}


def test_a_collector_frozen_past_liveness_flags_nothing_and_drops_nothing(tmp_path) -> None:
    prom = free_port()
    setup = Setup(
        tmp_path,
        liveness_s=LIVENESS_S,
        grace_s=LIVENESS_S,
        track_with=["jsonl", "prometheus"],
        tracker_kwargs={
            "jsonl": {"path": str(tmp_path / "out.jsonl")},
            "prometheus": {"port": prom},
        },
    )
    collector = setup.started()
    producers = [
        Producer(
            setup.bind,
            run="frozen",
            role="actor_train",
            rank=rank,
            world_size=RANKS,
            config=ProducerConfig(close_timeout_s=30, gpu_sample_s=0),
        )
        for rank in range(RANKS)
    ]
    step, frozen_at = 0, None
    while True:
        for rank, p in enumerate(producers):
            p.log(values(step, rank), step=step)
        step += 1
        if step == BURST:  # frozen while busy with the burst, as a loaded collector is
            os.kill(collector.proc.pid, signal.SIGSTOP)
            frozen_at = time.monotonic()
        if step > BURST:
            time.sleep(PACE_S)
        if frozen_at is not None and time.monotonic() - frozen_at >= FROZEN_S:
            break
    os.kill(collector.proc.pid, signal.SIGCONT)
    for _ in range(20):  # and on, after the wake-up
        for rank, p in enumerate(producers):
            p.log(values(step, rank), step=step)
        step += 1
        time.sleep(PACE_S)
    for p in producers:
        assert p.flush(30)
    stats = [p.stats() for p in producers]
    for p in producers:
        p.close()
    setup.wait_lines(step)
    with urllib.request.urlopen(f"http://127.0.0.1:{prom}/metrics", timeout=10) as r:
        metrics = r.read().decode()
    assert collector.stop() == 0

    lines = setup.lines()
    partial = [line["step"] for line in lines if line["partial"]]
    assert [line["step"] for line in lines] == list(range(step))
    assert partial == [], f"{len(partial)} of {step} steps flagged partial"
    assert [s["dropped_late"] for s in stats] == [0] * RANKS
    for line in lines:
        assert line["metrics"]["frozen/m007"] == 10.0 * line["step"] + 3.5 + 7
    paused = next(
        float(row.split()[-1])
        for row in metrics.splitlines()
        if row.startswith("rlpulse_collector_paused_seconds_total ")
    )
    assert paused >= FROZEN_S - 1.0, metrics
    assert json.loads(json.dumps(stats))  # the producers' counters, for the failure message
