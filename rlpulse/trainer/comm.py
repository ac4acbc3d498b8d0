"""Data-parallel communication: summing gradients and counts across the ranks of one role.

:class:`LocalComm` is the one-rank case (every call is a no-op); :class:`TorchDistComm` joins a
``torch.distributed`` process group (gloo on CPU, NCCL on GPU) whose rank 0 listens at
``init_method``. Each role (actor_train, critic) is its own group, in its own processes.

>>> import torch
>>> t = torch.ones(2)
>>> LocalComm().all_reduce_sum(t); t
tensor([1., 1.])
"""

from __future__ import annotations

import socket
from collections.abc import Iterable
from datetime import timedelta
from typing import Protocol

import torch
import torch.distributed as dist
from torch import Tensor


class Comm(Protocol):
    """What the trainers need from the other ranks of their role."""

    rank: int
    world_size: int

    def all_reduce_sum(self, tensor: Tensor) -> None:
        """Replace ``tensor`` (in place) with its sum over ranks."""

    def close(self) -> None: ...


class LocalComm:
    """A single rank: sums over one rank are the values themselves."""

    rank = 0
    world_size = 1

    def all_reduce_sum(self, tensor: Tensor) -> None:
        return None

    def close(self) -> None:
        return None


class TorchDistComm:
    """A ``torch.distributed`` process group. Construct it on every rank with the same
    ``init_method`` (``tcp://HOST:PORT`` of rank 0) and world size."""

    def __init__(
        self,
        init_method: str,
        rank: int,
        world_size: int,
        backend: str = "gloo",
        timeout_s: float = 120.0,
    ) -> None:
        dist.init_process_group(
            backend,
            init_method=init_method,
            rank=rank,
            world_size=world_size,
            timeout=timedelta(seconds=timeout_s),
        )
        self.rank, self.world_size, self.backend = rank, world_size, backend

    def all_reduce_sum(self, tensor: Tensor) -> None:
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)

    def close(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on right now (for rank 0's rendezvous)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def all_reduce_gradients(params: Iterable[torch.nn.Parameter], comm: Comm) -> None:
    """Sum gradients over ranks in one flat buffer (one collective, not one per tensor).
    Each rank's loss is already divided by the *global* token count, so the sum is the
    gradient of the global mean."""
    if comm.world_size == 1:
        return
    grads = []
    for p in params:
        if p.requires_grad:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            grads.append(p.grad)
    flat = torch.cat([g.reshape(-1) for g in grads])
    comm.all_reduce_sum(flat)
    offset = 0
    for g in grads:
        n = g.numel()
        g.copy_(flat[offset : offset + n].view_as(g))
        offset += n


def global_count(value: float, comm: Comm, device: torch.device | str = "cpu") -> float:
    """The sum of ``value`` over ranks."""
    t = torch.tensor([float(value)], dtype=torch.float64, device=device)
    comm.all_reduce_sum(t)
    return float(t.item())
