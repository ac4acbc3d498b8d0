"""Run identity against one long-lived collector, the way users run jobs: every rank process
seeds the generators trainers seed, several runs go in a row, a run name is reused, a run is
resumed. Producer ids never collide, a reused name is a new attempt, a resumed run goes on,
and what the collector leaves out is in the producers' own ``stats()``."""

from __future__ import annotations

import json
import os
import random
import subprocess
from pathlib import Path

import numpy as np

from rlpulse.collector.launch import start_collector
from tests.integration.collectors import SPAWN, assert_matches, read_jsonl
from tests.integration.workload import expected, run_rank
from tests.support.net import free_port

WORLD = 4


def seeded_rank(address: str, run: str, rank: int, steps: int, stats: str, resume: bool) -> None:
    """A rank as trainers start one: every generator seeded alike on every rank (TRL's and
    transformers' ``set_seed`` and verl seed ``random`` and numpy the same way)."""
    random.seed(42)
    np.random.seed(42)
    if resume:
        os.environ["RLPULSE_RESUME"] = "1"
    run_rank(address, run, "actor_train", rank, WORLD, steps, stats_path=stats)


def run_job(address: str, tmp: Path, run: str, steps: int, resume: bool = False) -> list[dict]:
    """One job: ``WORLD`` rank processes started together; their stats once closed."""
    paths = [tmp / f"{run}-{r}-{os.urandom(4).hex()}.json" for r in range(WORLD)]
    procs = [
        SPAWN.Process(target=seeded_rank, args=(address, run, r, steps, str(p), resume))
        for r, p in enumerate(paths)
    ]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(120)
        assert proc.exitcode == 0
    return [json.loads(p.read_text()) for p in paths]


def test_seeded_runs_in_a_row_against_one_collector_lose_nothing(tmp_path) -> None:
    out = tmp_path / "out.jsonl"
    config = {
        "track_with": ["jsonl"],
        "tracker_kwargs": {"jsonl": {"path": str(out)}},
        "settle_s": 0,
        "liveness_s": 30,
    }
    log = tmp_path / "collector.log"
    bind = f"tcp://127.0.0.1:{free_port()}"
    collector = start_collector(config, bind=bind, stderr=log.open("w"), stdout=subprocess.DEVNULL)
    try:
        stats = run_job(bind, tmp_path, "run-a", 3)
        stats += run_job(bind, tmp_path, "run-b", 3)
        stats += run_job(bind, tmp_path, "run-a", 2)  # the same program again: a new attempt
        assert all(s["dropped_late"] == s["dropped_conflict"] == 0 for s in stats)
        assert all(s["unacked"] == 0 and s["dropped_send"] == 0 for s in stats)
        # Resumed: the job restarts from step 1 under its name; step 1 was emitted already,
        # so its entries are left out and each producer counts them.
        resumed = run_job(bind, tmp_path, "run-b", 5, resume=True)
    finally:
        assert collector.stop() == 0
    records = read_jsonl(out)
    ranks = [("actor_train", r) for r in range(WORLD)]
    by_run: dict[str, list[int]] = {}
    for record in records:
        by_run.setdefault(record["run"], []).append(record["step"])
        want = expected(ranks, record["step"])
        assert not record["partial"], (record["run"], record["step"], record["missing"])
        assert record["ranks"] == WORLD, (record["run"], record["step"])
        assert_matches(record, want)
    assert by_run == {"run-a": [0, 1, 2], "run-b": [0, 1, 2, 3, 4], "run-a-2": [0, 1]}
    # Steps 0-2 of the resumed job came after those steps were emitted: 2 calls per step.
    assert [s["dropped_late"] for s in resumed] == [6] * WORLD
    text = log.read_text()
    assert "recorded as 'run-a-2'" in text and " 0 duplicates," in text.splitlines()[-1]


def test_a_rank_killed_mid_step_and_restarted_is_counted_once(tmp_path) -> None:
    """Rank 1 is SIGKILLed halfway through step 2 and a new process for rank 1 starts right
    away and logs step 2 again (a Ray actor restart, an elastic torchrun restart): every step
    is exact and complete, with 2 ranks, never the killed process's half on top."""
    out = tmp_path / "out.jsonl"
    config = {
        "track_with": ["jsonl"],
        "tracker_kwargs": {"jsonl": {"path": str(out)}},
        "settle_s": 0,
        "liveness_s": 30,
        "grace_s": 60,
    }
    bind = f"tcp://127.0.0.1:{free_port()}"
    log = tmp_path / "collector.log"
    collector = start_collector(config, bind=bind, stderr=log.open("w"), stdout=subprocess.DEVNULL)
    try:
        steady = SPAWN.Process(
            target=run_rank, args=(bind, "restart", "actor_train", 0, 2, 5), kwargs={"pause": 0.5}
        )
        doomed = SPAWN.Process(
            target=run_rank, args=(bind, "restart", "actor_train", 1, 2, 5), kwargs={"die_mid": 2}
        )
        steady.start()
        doomed.start()
        doomed.join(60)
        assert doomed.exitcode == -9
        again = SPAWN.Process(
            target=run_rank,
            args=(bind, "restart", "actor_train", 1, 2, 5),
            kwargs={"first_step": 2},
        )
        again.start()
        for proc in (steady, again):
            proc.join(60)
            assert proc.exitcode == 0
    finally:
        assert collector.stop() == 0
    records = read_jsonl(out)
    assert [r["step"] for r in records] == [0, 1, 2, 3, 4]
    for record in records:
        assert not record["partial"] and record["ranks"] == 2, record["step"]
        assert_matches(record, expected([("actor_train", 0), ("actor_train", 1)], record["step"]))
    assert "registered from a new process" in log.read_text()
