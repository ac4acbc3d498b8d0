"""Issue 41's proof through real producers and a real collector process: the random rows a
step keeps are uniform over every rank's rows, whatever each rank holds; a step's record in
the jsonl carries the samples in the issue's shape; bad rows are dropped and counted, long
texts cut and marked."""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path

from rlpulse import Samples
from rlpulse.producer import Producer
from rlpulse.producer.config import ProducerConfig
from rlpulse.schemas import metrics as M
from rlpulse.schemas.samples import CUT_MARK
from tests.integration.collectors import live_collector, read_jsonl

NAME = M.ROLLOUT_SAMPLES.name
ROWS = (1, 9, 90)
"""Rows per step of ranks 0, 1 and 2: very different, 100 in all."""
K, STEPS = 5, 300
CHI2_RANKS = 18.42
"""The chi-square statistic over the 3 ranks (2 degrees of freedom) is above this with
probability 1e-4 if the rows are uniform: -2 ln(1e-4)."""
CHI2_ROWS = 160.0
"""The same over the 100 rows (99 degrees of freedom), 1e-4 (Wilson-Hilferty's estimate)."""


def wait_lines(path: Path, n: int, timeout: float = 60.0) -> list[dict]:
    deadline = time.monotonic() + timeout
    while True:
        lines = read_jsonl(path) if path.exists() else []
        if len(lines) >= n or time.monotonic() > deadline:
            return lines
        time.sleep(0.05)


def test_the_random_rows_are_uniform_over_ranks_holding_very_different_numbers(
    tmp_path: Path,
) -> None:
    """3 ranks log 1, 9 and 90 rows per step, k = 5 random rows kept of the 100, over 300
    steps (1500 draws, without replacement within a step). If every row is equally likely,
    each rank's share of the draws is its share of rows (1%, 9%, 90%), and each row is drawn
    15 times on average. Thresholds: chi-square at p = 1e-4 over ranks (18.42, 2 degrees of
    freedom) and over rows (160, 99 degrees of freedom); drawing without replacement only
    narrows the spread, so the test is conservative. A merge that took each rank's k and then
    chose among ranks evenly would give rank 0 about a third of the draws, not 1%."""
    with live_collector(tmp_path) as live:
        producers = [
            Producer(
                live.collector.address,
                run="u",
                role="actor_train",
                rank=rank,
                world_size=3,
                config=ProducerConfig(samples_k=K, close_timeout_s=30),
            )
            for rank in range(3)
        ]
        for step in range(STEPS):
            for rank, p in enumerate(producers):
                rows = [{"reward": 0.0, "id": f"{rank}:{i}"} for i in range(ROWS[rank])]
                p.log({NAME: Samples(rows, key="reward")}, step=step)
        for p in producers:
            p.close()
        lines = wait_lines(live.out, STEPS)
    assert len(lines) == STEPS
    per_rank: Counter[int] = Counter()
    per_row: Counter[str] = Counter()
    for line in lines:
        assert line["metrics"][NAME] == sum(ROWS)
        drawn = line["samples"][NAME]["random"]
        assert len(drawn) == K and len({r["id"] for r in drawn}) == K
        for row in drawn:
            per_rank[row["rank"]] += 1
            per_row[row["id"]] += 1
    draws = K * STEPS
    total = sum(ROWS)
    chi_ranks = sum(
        (per_rank[r] - draws * n / total) ** 2 / (draws * n / total) for r, n in enumerate(ROWS)
    )
    each = draws / total
    ids = [f"{r}:{i}" for r, n in enumerate(ROWS) for i in range(n)]
    chi_rows = sum((per_row[i] - each) ** 2 / each for i in ids)
    assert chi_ranks < CHI2_RANKS, (per_rank, chi_ranks)
    assert chi_rows < CHI2_ROWS, chi_rows


def test_the_jsonl_record_carries_the_samples_bad_rows_counted_long_texts_cut(
    tmp_path: Path,
) -> None:
    """Two ranks, two ``log()`` calls of the same name at one step on rank 0 (they merge),
    a name outside the catalog too; bad rows dropped and counted in ``stats()``, a long text
    cut and marked."""
    config = ProducerConfig(samples_k=2, samples_field_bytes=64)
    with live_collector(tmp_path) as live:
        p0, p1 = (
            Producer(
                live.collector.address, run="j", role="rollout", rank=r, world_size=2, config=config
            )
            for r in range(2)
        )
        p0.log({NAME: Samples([{"prompt": "a", "reward": 1.0}], key="reward")}, step=0)
        p0.log(
            {
                NAME: Samples(
                    [
                        {"prompt": "b", "response": "x" * 1000, "reward": 5.0},
                        {"prompt": "bad", "reward": "high"},  # a key that is no number
                        {"prompt": "bad", "reward": 1.0, "extra": object()},
                        "not a row",
                    ],
                    key="reward",
                ),
                "my/generations": Samples([{"text": "t", "score": 2}], key="score", k=1),
            },
            step=0,
        )
        p1.log({NAME: Samples([{"prompt": "c", "reward": -2.0}], key="reward")}, step=0)
        for p in (p0, p1):
            p.close()
        (line,) = wait_lines(live.out, 1)
        s0 = p0.stats()
    assert s0["samples_dropped"] == 3 and s0["samples_cut"] == 1
    assert line["metrics"][NAME] == 3
    got = line["samples"][NAME]
    assert got["key"] == "reward"
    assert [r["prompt"] for r in got["top"]] == ["b", "a"]
    assert [r["prompt"] for r in got["bottom"]] == ["c", "a"]
    assert len(got["random"]) == 2
    assert got["bottom"][0] == {"prompt": "c", "reward": -2.0, "role": "rollout", "rank": 1}
    assert (got["rows"], got["dropped"], got["cut"]) == (3, 3, 1)
    response = got["top"][0]["response"]
    assert len(response.encode()) <= 64 and response.startswith("x")
    assert response.endswith(CUT_MARK.format(1000 - response.index("…")))
    mine = line["samples"]["my/generations"]
    assert line["metrics"]["my/generations"] == 1
    assert mine["top"] == [{"text": "t", "score": 2, "role": "rollout", "rank": 0}]


def test_a_collector_killed_and_restarted_from_its_state_dir_keeps_the_samples(
    tmp_path: Path,
) -> None:
    """Two ranks log rows at 90 steps; the collector (with a ``state_dir``) is killed with
    SIGKILL twice mid-run and restarted. Every step comes out once, its rows counted once
    (no entry merged twice by the write-ahead log's replay and the producers' resends), its
    top and bottom the union's (rewards are distinct, so they are known), its random rows
    distinct rows of the union."""
    import subprocess

    from rlpulse.collector.launch import start_collector
    from tests.support.net import free_port

    out = tmp_path / "out.jsonl"
    config = {
        "track_with": ["jsonl"],
        "tracker_kwargs": {"jsonl": {"path": str(out)}},
        "state_dir": str(tmp_path / "state"),
        "grace_s": 120,
        "liveness_s": 60,
        "checkpoint_s": 0.3,
        "max_open_steps": 1000,
        "settle_s": 0,
    }
    bind = f"tcp://127.0.0.1:{free_port()}"
    log = (tmp_path / "collector.log").open("a")

    def launch():  # type: ignore[no-untyped-def]
        return start_collector(config, bind=bind, stderr=log, stdout=subprocess.DEVNULL)

    steps, n = 90, (3, 11)
    collector = launch()
    producers = [
        Producer(
            bind,
            run="kill",
            role="actor_train",
            rank=r,
            world_size=2,
            config=ProducerConfig(samples_k=4, close_timeout_s=60),
        )
        for r in range(2)
    ]
    for step in range(steps):
        if step in (30, 60):
            time.sleep(0.3)  # some of it checkpointed, some only in the log
            collector.proc.kill()
            collector.proc.wait()
            collector = launch()
        for r, p in enumerate(producers):
            rows = [
                {"reward": float(step * 100 + r * 50 + i), "id": f"{r}:{i}"} for i in range(n[r])
            ]
            p.log({NAME: Samples(rows, key="reward")}, step=step)
        time.sleep(0.01)
    for p in producers:
        p.close()
    lines = wait_lines(out, steps)
    assert collector.stop() == 0
    assert [line["step"] for line in lines] == list(range(steps))
    assert "recovered from" in (tmp_path / "collector.log").read_text()
    for line in lines:
        step = line["step"]
        rewards = sorted(step * 100 + r * 50 + i for r in range(2) for i in range(n[r]))
        got = line["samples"][NAME]
        assert line["metrics"][NAME] == sum(n) and got["rows"] == sum(n), step
        assert [r["reward"] for r in got["top"]] == rewards[::-1][:4]
        assert [r["reward"] for r in got["bottom"]] == rewards[:4]
        drawn = [r["reward"] for r in got["random"]]
        assert len(set(drawn)) == 4 and set(drawn) <= set(rewards)
