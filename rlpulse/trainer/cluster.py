"""Ray: starting or attaching, and creating one Ray actor per worker rank.

Locally the trainer starts Ray itself on the loopback address. On a cluster, start Ray on every
machine first (``ray start --head`` / ``ray start --address=HEAD:6379``) and set
``cluster.ray_address: auto``; workers then land wherever Ray has room and reach the collector
by the address they are given (see trainer/README.md).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any

import ray
import torch

from rlpulse.trainer.config import TrainerConfig
from rlpulse.trainer.workers.actor_train import ActorTrainWorker
from rlpulse.trainer.workers.base import WorkerSpec
from rlpulse.trainer.workers.critic import CriticWorker
from rlpulse.trainer.workers.reference import ReferenceWorker
from rlpulse.trainer.workers.reward import RewardWorker
from rlpulse.trainer.workers.rollout import RolloutWorker

Handle = Any  # a Ray actor handle


def init_ray(cfg: TrainerConfig) -> bool:
    """Start (or attach to) Ray; returns True when this process started it."""
    if ray.is_initialized():
        return False
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    env = {"env_vars": {"RAY_USAGE_STATS_ENABLED": "0", "TOKENIZERS_PARALLELISM": "false"}}
    if cfg.cluster.ray_address:
        ray.init(address=cfg.cluster.ray_address, runtime_env=env, log_to_driver=True)
    else:
        ray.init(
            _node_ip_address="127.0.0.1",
            include_dashboard=False,
            num_cpus=cfg.cluster.num_cpus,
            runtime_env=env,
            log_to_driver=True,
        )
    return True


@dataclass
class Workers:
    """Handles of every worker, by role."""

    actor_train: list[Handle]
    reference: Handle
    rollout: Handle
    reward: Handle
    critic: Handle | None

    def all(self) -> list[Handle]:
        extra = [self.critic] if self.critic is not None else []
        return [*self.actor_train, self.reference, self.rollout, self.reward, *extra]


def _gpus_per_worker(cfg: TrainerConfig, n_model_workers: int) -> float:
    """Share the cluster's GPUs between the workers that hold a model (0 on CPU)."""
    if cfg.cluster.device == "cpu":
        return 0.0
    gpus = float(ray.cluster_resources().get("GPU", 0.0))
    if gpus <= 0:
        if cfg.cluster.device == "cuda":
            raise RuntimeError("cluster.device is cuda but the Ray cluster has no GPU")
        return 0.0
    if gpus >= n_model_workers:
        return 1.0
    # Fractions pack within one GPU: k workers per GPU at 1/k each.
    return 1.0 / math.ceil(n_model_workers / gpus)


def create_workers(
    cfg: TrainerConfig, collector_address: str | None, weights: dict[str, torch.Tensor]
) -> Workers:
    """Create every worker from the same initial weights and join the data-parallel group."""
    has_critic = cfg.ppo.algorithm == "ppo"
    n_ranks = cfg.cluster.actor_train_ranks
    gpu = _gpus_per_worker(cfg, n_ranks + 2 + int(has_critic))
    # num_cpus=0: the workers take turns (the driver waits on each stage), so they need not
    # reserve cores; a 2-core machine still fits all of them.
    opts = {"num_cpus": 0, "num_gpus": gpu}
    weights_ref = ray.put(weights)

    def spec(rank: int = 0, world: int = 1) -> WorkerSpec:
        return WorkerSpec(cfg, collector_address, rank, world)

    actor_cls = ray.remote(ActorTrainWorker).options(**opts)
    actors: list[Handle] = [actor_cls.remote(spec(r, n_ranks), weights_ref) for r in range(n_ranks)]
    workers = Workers(
        actor_train=actors,
        reference=ray.remote(ReferenceWorker).options(**opts).remote(spec(), weights_ref),
        rollout=ray.remote(RolloutWorker).options(**opts).remote(spec(), weights_ref),
        reward=ray.remote(RewardWorker).options(num_cpus=0).remote(spec()),
        critic=(
            ray.remote(CriticWorker).options(**opts).remote(spec(), weights_ref)
            if has_critic
            else None
        ),
    )
    ray.get([w.ready.remote() for w in workers.all()])
    if n_ranks > 1:
        # Rank 0 hosts the rendezvous; every rank must join at once, or init blocks.
        host = ray.get(actors[0].node_ip.remote())
        port = ray.get(actors[0].rendezvous_port.remote())
        # NCCL refuses two ranks on one GPU; ranks that share GPUs all-reduce through gloo,
        # which takes CUDA tensors too.
        backend = "nccl" if gpu >= 1.0 else "gloo"
        ray.get([a.init_comm.remote(f"tcp://{host}:{port}", backend) for a in actors])
    return workers


def close_workers(workers: Workers) -> list[dict[str, int]]:
    """Flush and close every worker's producer, then end the actors."""
    stats = []
    for ref in [w.close.remote() for w in workers.all()]:
        try:
            stats.append(ray.get(ref))
        except ray.exceptions.RayActorError:  # a dead worker has nothing left to flush
            continue
    for w in workers.all():
        ray.kill(w)
    return stats
