"""CUDA for ``rlpulse.producer.device``: pooled events as markers, one side stream per device, pinned
host copies. (``rlpulse.producer.memory`` reads the allocator's statistics; nothing else here touches
``torch.cuda``.)
"""

from __future__ import annotations

import sys
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

from rlpulse.producer.deferred import Marker
from rlpulse.producer.device import DeviceContext
from rlpulse.producer.reduce import writable


class _CudaMarker:
    __slots__ = ("_event", "_pool")

    def __init__(self, event: Any, pool: deque) -> None:
        self._event = event
        self._pool = pool

    def query(self) -> bool:
        return bool(self._event.query())

    def seconds_until(self, later: Marker) -> float:
        return float(self._event.elapsed_time(later._event)) / 1000.0  # type: ignore[attr-defined]

    def release(self) -> None:
        self._pool.append(self._event)


class CudaOps:
    """:class:`DeviceOps` for CUDA. Events are pooled (creating one costs a driver call);
    side streams are created lazily in the sender thread, one per device."""

    def __init__(self, torch: Any) -> None:
        self.torch = torch
        self._events: dict[bool, deque] = {False: deque(), True: deque()}
        self._side: dict[int, Any] = {}

    def owns(self, tensor: Any) -> bool:
        return tensor.device.type == "cuda"

    def current_device(self) -> Any | None:
        cuda = self.torch.cuda
        return cuda.current_device() if cuda.is_initialized() else None

    def marker(self, device: Any, timing: bool = False) -> Marker:
        cuda = self.torch.cuda
        pool = self._events[timing]
        try:
            event = pool.pop()
        except IndexError:
            event = cuda.Event(enable_timing=timing)
        event.record(cuda.current_stream(device))
        return _CudaMarker(event, pool)

    def _stream(self, device: Any) -> Any:
        index = self.torch.device(device).index
        stream = self._side.get(index)
        if stream is None:
            stream = self._side[index] = self.torch.cuda.Stream(device)
        return stream

    @contextmanager
    def after(self, device: Any, marker: Marker) -> Iterator[object]:
        cuda = self.torch.cuda
        stream = self._stream(device)
        stream.wait_event(marker._event)  # type: ignore[attr-defined]
        with cuda.device(device), cuda.stream(stream):
            yield stream

    def keep(self, tensor: Any, device: Any) -> None:
        tensor.record_stream(self._stream(device))

    def to_host(self, tensor: Any) -> Any:
        host = self.torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
        host.copy_(tensor, non_blocking=True)
        return host

    def upload(self, array: np.ndarray, device: Any) -> Any:
        pinned = self.torch.from_numpy(writable(np.ascontiguousarray(array))).pin_memory()
        return pinned.to(device, non_blocking=True)


def cuda_context(snapshot_limit_bytes: int) -> DeviceContext | None:
    """The CUDA device context, when this process has imported torch with CUDA; else None."""
    torch = sys.modules.get("torch")
    if torch is None or not hasattr(torch, "cuda") or not torch.cuda.is_available():
        return None
    return DeviceContext(CudaOps(torch), snapshot_limit_bytes)
