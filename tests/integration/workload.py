"""A deterministic multi-rank workload, run in separate processes by the integration tests.

``rank_values`` is what one rank logs at one step; ``expected`` pools it with numpy, which is
what the collector must reproduce.
"""

from __future__ import annotations

import json
import os
import signal
import time
import zlib
from pathlib import Path

import numpy as np

from rlpulse.producer import Fraction, Masked, Producer, Weighted
from rlpulse.producer.config import ProducerConfig
from rlpulse.schemas import metrics as M

ADV, LOSS, CLIP, T_TOTAL = (
    M.CRITIC_ADVANTAGES.name,
    M.ACTOR_PG_LOSS.name,
    M.ACTOR_CLIPFRAC.name,
    M.TIME_PHASE.format(cluster="actor_train", phase="train_step", part="total"),
)


def rank_values(role: str, rank: int, step: int) -> dict[str, np.ndarray | float]:
    rng = np.random.default_rng([zlib.crc32(role.encode()), rank, step])
    n = 7 if rank == 0 else int(rng.integers(100, 3000))
    values = rng.normal(rank, 1.0 + step % 3, n)
    mask = rng.random(n) < 0.8
    return {
        "values": values,
        "mask": mask,
        "loss": float(rng.normal()),
        "clipped": float(rng.integers(0, n)),
        "time": float(rng.random()),
    }


def run_rank(
    address: str,
    run: str,
    role: str,
    rank: int,
    world_size: int,
    steps: int,
    die_after: int | None = None,
    pause: float = 0.0,
    close_timeout_s: float = 2.0,
    max_unacked: int = 10_000,
    stats_path: str | None = None,
    first_step: int = 0,
    die_mid: int | None = None,
) -> str:
    """Log steps ``first_step`` to ``steps - 1`` of ``rank_values``; returns the address the
    producer used (``address`` None: the producer's default). ``die_after``: SIGKILL itself
    once that step is delivered; ``die_mid``: once the first half of that step is."""
    p = Producer(
        address,
        run=run,
        role=role,
        rank=rank,
        world_size=world_size,
        config=ProducerConfig(close_timeout_s=close_timeout_s, max_unacked=max_unacked),
    )
    worst = 0.0
    with p:
        for step in range(first_step, steps):
            d = rank_values(role, rank, step)
            n = int(d["mask"].sum())
            started = time.perf_counter()
            p.log({ADV: Masked(d["values"], d["mask"]), LOSS: Weighted(d["loss"], n)}, step=step)
            worst = max(worst, time.perf_counter() - started)
            if die_mid is not None and step == die_mid:
                p.flush(5)
                os.kill(os.getpid(), signal.SIGKILL)
            p.log({CLIP: Fraction(min(d["clipped"], n), n), T_TOTAL: d["time"]}, step=step)
            if die_after is not None and step == die_after:
                p.flush(5)
                time.sleep(0.2)
                os.kill(os.getpid(), signal.SIGKILL)
            if pause:
                time.sleep(pause)
    if stats_path:
        Path(stats_path).write_text(json.dumps({**p.stats(), "worst_log_s": worst}))
    return p.address


def expected(ranks: list[tuple[str, int]], step: int) -> dict[str, float]:
    data = [rank_values(role, rank, step) for role, rank in ranks]
    adv = np.concatenate([d["values"][d["mask"]] for d in data])
    n = np.array([d["mask"].sum() for d in data], dtype=float)
    loss = np.array([d["loss"] for d in data])
    clipped = np.array([min(d["clipped"], k) for d, k in zip(data, n, strict=True)])
    return {
        "critic/advantages/mean": adv.mean(),
        "critic/advantages/max": adv.max(),
        "critic/advantages/min": adv.min(),
        LOSS: (loss * n).sum() / n.sum(),
        CLIP: clipped.sum() / n.sum(),
        T_TOTAL: max(d["time"] for d in data),
    }
