"""Helpers for the tests on a real GPU: strict mode (any synchronizing CUDA call raises) and
queued GPU work of a given length."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

from benchmarks.common import spin_cycles_per_ms


@contextmanager
def strict() -> Iterator[None]:
    """Any synchronizing CUDA call raises (in the caller and in the sender thread alike)."""
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode("default")


def gpu_busy_ms(ms: float) -> torch.cuda.Event:
    """Queue about ``ms`` of GPU work on the current stream; return an event recorded after
    it. The first call calibrates the spin kernel (``spin_cycles_per_ms``)."""
    global _CYCLES_PER_MS
    if _CYCLES_PER_MS is None:
        _CYCLES_PER_MS = spin_cycles_per_ms(torch)
    torch.cuda._sleep(int(ms * _CYCLES_PER_MS))
    done = torch.cuda.Event()
    done.record()
    return done


_CYCLES_PER_MS: float | None = None
