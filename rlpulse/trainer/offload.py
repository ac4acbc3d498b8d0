"""Onload and offload of model and optimizer state between phases.

With a GPU, a worker keeps its weights and Adam moments in CPU memory between phases and moves
them to the device only while it works, so roles can share a device (ROLL's
state_offload_manager). On a CPU-only machine the device *is* the CPU and the moves are
no-ops; the producer still times them (``time/.../onload|offload``).

>>> import torch
>>> m = torch.nn.Linear(2, 2)
>>> s = StateMover(m, None, torch.device("cpu"), enabled=True)
>>> s.onload(); s.offload(); next(m.parameters()).device.type
'cpu'
"""

from __future__ import annotations

import torch
from torch import nn


def resolve_device(name: str) -> torch.device:
    """``auto``: the first CUDA device when there is one, else the CPU."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("cluster.device is cuda but torch.cuda.is_available() is False")
    return torch.device(name)


def move_optimizer_state(optimizer: torch.optim.Optimizer, device: torch.device) -> None:
    for state in optimizer.state.values():
        for key, value in state.items():
            if isinstance(value, torch.Tensor) and key != "step":
                state[key] = value.to(device, non_blocking=True)


class StateMover:
    """Moves one model (and its optimizer's state) to ``device`` and back to the CPU.

    ``enabled=False`` loads once and keeps everything on the device (no offload)."""

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer | None,
        device: torch.device,
        enabled: bool,
    ) -> None:
        self.model, self.optimizer, self.device, self.enabled = model, optimizer, device, enabled
        if not enabled:
            self._move(device)

    def _move(self, device: torch.device) -> None:
        self.model.to(device)
        if self.optimizer is not None:
            move_optimizer_state(self.optimizer, device)

    def onload(self) -> None:
        if self.enabled:
            self._move(self.device)

    def offload(self) -> None:
        if not self.enabled:
            return
        self._move(torch.device("cpu"))
        if self.device.type == "cuda":
            # Release the cached blocks so the next role's phase can use them.
            torch.cuda.synchronize(self.device)
            torch.cuda.empty_cache()
