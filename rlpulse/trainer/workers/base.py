"""What every worker shares: its producer, its torch settings, phases and step bookkeeping."""

from __future__ import annotations

import zlib
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

import torch

from rlpulse.trainer.config import TrainerConfig
from rlpulse.trainer.offload import StateMover, resolve_device
from rlpulse.trainer.tokenizer import build_tokenizer


@dataclass(frozen=True)
class WorkerSpec:
    """Who a worker is and where it reports: its rank in its role and the collector address
    (None: the producer's default, e.g. its node's relay under ``cluster.collectors: per_node``)."""

    cfg: TrainerConfig
    collector_address: str | None
    rank: int = 0
    world_size: int = 1


class Worker:
    """Base of the role workers. ``role`` is the cluster name in metric names."""

    role = "worker"

    def __init__(self, spec: WorkerSpec) -> None:
        self.spec = spec
        self.cfg = spec.cfg
        # Two CPU cores are shared by every worker: one thread each keeps them from thrashing.
        torch.set_num_threads(self.cfg.cluster.torch_threads)
        # A stable per-role, per-rank seed (str hashes are salted per process; crc32 is not).
        torch.manual_seed(self.cfg.seed + 1000 * spec.rank + zlib.crc32(self.role.encode()) % 997)
        self.device = resolve_device(self.cfg.cluster.device)
        self.tokenizer = build_tokenizer()
        self.producer = self.cfg.producer(
            spec.collector_address, self.role, spec.rank, spec.world_size
        )

    def phase(
        self, name: str, step: int, mover: StateMover | None = None
    ) -> AbstractContextManager[Any]:
        """Run a unit of work as ``{role}/{name}``, loading state before and unloading after."""
        onload = mover.onload if mover is not None and mover.enabled else None
        offload = mover.offload if mover is not None and mover.enabled else None
        return self.producer.phase(f"{self.role}/{name}", step=step, onload=onload, offload=offload)

    def ready(self) -> bool:
        """Returns once the constructor has run (the driver waits on it)."""
        return True

    def step_done(self, step: int) -> None:
        self.producer.step_done(step)

    def producer_stats(self) -> dict[str, int]:
        return self.producer.stats()

    def close(self) -> dict[str, int]:
        """Flush and close the producer; returns its final counters."""
        self.producer.flush(timeout=10.0)
        stats = self.producer.stats()
        self.producer.close()
        return stats

    def node_ip(self) -> str:
        import ray.util

        return str(ray.util.get_node_ip_address())
