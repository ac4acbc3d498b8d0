"""Memory probes for phase boundaries: the worker process (psutil) and its CUDA devices.

Values are GiB (bytes / 1024**3), the catalog's unit. torch is never imported here: the GPU
probe runs only when the process has already imported torch and started CUDA, so a CPU-only
worker pays nothing, and a worker that never touches the GPU gets no CUDA context from it.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

import psutil

GIB = float(1 << 30)


@dataclass(frozen=True, slots=True)
class DeviceMemory:
    """torch.cuda statistics of one worker-local device, in GiB; ``total`` is its capacity."""

    allocated: float
    reserved: float
    max_allocated: float
    max_reserved: float
    total: float


class MemoryProbe:
    """Reads process and device memory. ``torch`` is injectable for tests."""

    def __init__(self, torch: Any | None = None) -> None:
        self._process = psutil.Process()
        self._torch = torch

    def _cuda(self) -> Any | None:
        """``torch.cuda`` once this process has started CUDA; None before (and without it).
        A probe must not be what starts it: ``get_device_properties`` would create a CUDA
        context (hundreds of MiB of GPU memory) in a worker that never uses the GPU, and
        ``reset_peak_memory_stats`` raises 'Invalid device argument' before the allocator
        exists (six such errors in a trainer run on an H100, one per worker)."""
        torch = self._torch if self._torch is not None else sys.modules.get("torch")
        if torch is None or not torch.cuda.is_initialized():
            return None
        return torch.cuda

    def cpu(self) -> tuple[float, float]:
        """(rss, vms) of this process."""
        info = self._process.memory_info()
        return info.rss / GIB, info.vms / GIB

    def reset_peaks(self) -> None:
        """Start the max_* statistics afresh, so they cover one phase."""
        cuda = self._cuda()
        if cuda is None:
            return
        for device in range(cuda.device_count()):
            cuda.reset_peak_memory_stats(device)

    def devices(self) -> dict[int, DeviceMemory]:
        """Statistics per local device index; empty without CUDA."""
        cuda = self._cuda()
        if cuda is None:
            return {}
        out = {}
        for device in range(cuda.device_count()):
            out[device] = DeviceMemory(
                allocated=cuda.memory_allocated(device) / GIB,
                reserved=cuda.memory_reserved(device) / GIB,
                max_allocated=cuda.max_memory_allocated(device) / GIB,
                max_reserved=cuda.max_memory_reserved(device) / GIB,
                total=cuda.get_device_properties(device).total_memory / GIB,
            )
        return out
