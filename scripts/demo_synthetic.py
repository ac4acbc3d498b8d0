"""A synthetic workload: a collector plus producer processes shaped like a PPO job.

Two ``actor_train`` ranks with very different token counts, a ``critic`` rank and a driver log
per-token tensors, per-rank means with their weights, clip fractions and phase timings, all
at the same pace (:data:`STEP_S`); the collector prints each step pooled across ranks and
appends it to ``runs/demo-synthetic.jsonl``.
The real workload is the trainer (``python -m rlpulse.trainer``).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import time
from pathlib import Path

import numpy as np

from rlpulse.collector.launch import start_collector
from rlpulse.producer import Fraction, Masked, Producer, Weighted
from rlpulse.schemas import metrics as M

TOPOLOGY = {"actor_train": 2, "critic": 1, "driver": 1}
"""The run's roles and world sizes, declared so the collector waits for late starters."""
ROLES = [("actor_train", 0, 2), ("actor_train", 1, 2), ("critic", 0, 1), ("driver", 0, 1)]
"""The producer processes: (role, rank, world size)."""
START_S = 2.0
"""Seconds from launching the processes to step 0: time for them to start and register."""


STEP_S = 0.2
"""Seconds per step, the same for every role: step k of every process starts at
``epoch + k * STEP_S`` (a shared wall-clock schedule). Roles that each slept their own time
per step drifted apart (the driver ran ahead of the slowest actor_train rank by a step in
five), and the collector's ``max_open_steps`` emitted the oldest steps partial."""


def worker(
    address: str,
    run: str,
    role: str,
    rank: int,
    world_size: int,
    steps: int,
    seed: int,
    epoch: float,
) -> None:
    """One producer process: registers at once, starts step 0 at ``epoch`` (``time.time()``),
    then keeps to the shared schedule, as ranks of a synchronous RL step do."""
    rng = np.random.default_rng(seed)
    with Producer(
        address, run=run, role=role, rank=rank, world_size=world_size, expected_roles=TOPOLOGY
    ) as p:
        for step in range(steps):
            time.sleep(max(0.0, epoch + step * STEP_S - time.time()))
            tokens = int(rng.integers(8, 64)) if rank == 0 else int(rng.integers(800, 1600))
            mask = rng.random(tokens) < 0.9
            if role == "actor_train":
                with p.phase(f"{role}/train_step", step=step):
                    time.sleep(0.02 + 0.01 * rank)
                ratio = np.exp(rng.normal(0, 0.05 + 0.01 * step, tokens))
                clipped = (ratio > 1.2) | (ratio < 0.8)
                p.log(
                    {
                        M.ACTOR_PG_LOSS.name: Weighted(
                            float(rng.normal(-0.02, 0.01)), int(mask.sum())
                        ),
                        M.ACTOR_RATIO.name: Masked(ratio, mask),
                        M.ACTOR_PPO_RATIO_CLIPFRAC.name: Fraction(
                            int((clipped & mask).sum()), int(mask.sum())
                        ),
                        M.ACTOR_LR.name: 1e-6,
                        M.SYSTEM_STEP_TOKENS.name: tokens,
                        M.SYSTEM_STEP_SAMPLES.name: 4,
                    },
                    step=step,
                )
            elif role == "critic":
                with p.phase(f"{role}/compute_values", step=step):
                    time.sleep(0.01)
                p.log({M.CRITIC_VALUES.name: Masked(rng.normal(0.3, 0.2, tokens), mask)}, step=step)
            else:
                scores = (rng.random(16) < min(0.9, 0.2 + 0.04 * step)).astype(float)
                p.log(
                    {M.CRITIC_SCORE.name: scores, M.TIME_ROLLOUT.name: 0.05 + rng.random() * 0.01},
                    step=step,
                )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--out", default="runs/demo-synthetic.jsonl")
    args = parser.parse_args()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    config = {
        "track_with": ["stdout", "jsonl"],
        "tracker_kwargs": {"jsonl": {"path": args.out}},
        "grace_s": 5,
    }
    with start_collector(config) as collector:
        print(f"collector listening on {collector.address}; {args.steps} steps follow")
        ctx = mp.get_context("spawn")
        epoch = time.time() + START_S
        procs = [
            ctx.Process(
                target=worker,
                args=(collector.address, "demo-synthetic", role, rank, ws, args.steps, i, epoch),
            )
            for i, (role, rank, ws) in enumerate(ROLES)
        ]
        for proc in procs:
            proc.start()
        for proc in procs:
            proc.join()
    print(f"done: every step is in {args.out}")


if __name__ == "__main__":
    main()
