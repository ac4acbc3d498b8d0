"""One rank's clock (issue 38, item 6): real producer processes, one of whose clocks steps an
hour ahead part-way through the run, and a real collector writing jsonl and serving /metrics.

A step's time is the latest ``log()`` time of any rank. Taken as the producers give it, the
skewed rank put every record after the step an hour in the future and ``system/tps`` of that
step at a few tokens a second. The collector measures each producer's clock offset from the
stamps of its heartbeats and places its times on its own timeline (issue 49); a time logged
after the jump and before the next stamp is still ahead: it is bounded by when the collector
received it, counted on /metrics, and the rank named once in its log.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from rlpulse.schemas import metrics as M
from tests.integration.collectors import live_collector
from tests.support.prom import scrape

STEPS = 20
JUMP_AT = 10
TOKENS = 10_000.0
RANK = f"""
import sys, time
from rlpulse.producer import Producer
from rlpulse.producer.config import ProducerConfig

address, rank, jump_at = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
real, ahead = time.time, [0.0]
time.time = lambda: real() + ahead[0]  # this process's clock, as its log() calls read it
with Producer(address, run="skew", role="actor_train", rank=rank, world_size=2,
              config=ProducerConfig(close_timeout_s=10)) as p:
    for step in range({STEPS}):
        if step == jump_at:
            ahead[0] = 3600.0  # the clock steps an hour ahead (a bad NTP sync)
        p.log({{"{M.SYSTEM_STEP_TOKENS.name}": {TOKENS / 2}}}, step=step)
        time.sleep(0.05)
"""


def test_a_rank_whose_clock_steps_an_hour_ahead_is_bounded_counted_and_named(tmp_path) -> None:
    started = time.time()
    with live_collector(tmp_path, grace_s=30) as live:
        collector, port, out, log = live.collector, live.port, live.out, live.log
        ranks = [
            subprocess.Popen(
                [sys.executable, "-c", RANK, collector.address, str(rank), str(jump)],
                cwd=Path(__file__).parents[2],
            )
            for rank, jump in ((0, STEPS + 1), (1, JUMP_AT))
        ]
        for proc in ranks:
            assert proc.wait(60) == 0
        skewed = scrape(port).get("rlpulse_collector_clock_skew_entries_total")
        assert collector.stop() == 0
    finished = time.time()

    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["step"] for r in records] == list(range(STEPS))
    assert all(not r["partial"] and r["ranks"] == 2 for r in records)
    for r in records:  # no record in the future, the steps after the jump included
        assert started <= r["time"] <= finished, (r["step"], r["time"] - finished)
    tps = {r["step"]: r["metrics"].get(M.SYSTEM_TPS.name) for r in records}
    # 10,000 tokens a step, a step every ~50 ms: some 10^5 tokens/s on a loaded machine too
    # (the skewed step was about 3 tokens/s before the times were bounded)
    assert all(v is not None and v > 1_000 for s, v in tps.items() if s >= 1), tps
    # one log() call a step of the skewed rank: those before the next heartbeat's stamp are
    # bounded and counted, those after it placed by the measured offset
    assert skewed is not None and skewed <= STEPS - JUMP_AT
    text = log.read_text()
    assert text.count("ahead of this collector's clock") == (1 if skewed else 0), text
    assert "actor_train/1 of run 'skew' (host" in text
    assert "s ahead of this collector's: its times are placed" in text, "the offset, noted"
