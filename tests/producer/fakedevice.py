"""A stand-in for CUDA that runs ``rlpulse.producer.device``'s pipeline on CPU tensors.

Every CPU tensor counts as "on the device". A held device passes no marker until the test
releases it (``FakeOps.release``), as a GPU busy with queued work would; markers carry a fake
device clock. So the tests can hold the "GPU" back and watch what the producer does meanwhile.
:class:`Recorder` lists the ops the caller's thread dispatches, to check against
:data:`SNAPSHOT_OPS` and :data:`SYNCING_OPS`.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from rlpulse.producer.device import DeviceContext


class FakeMarker:
    def __init__(self, ops: FakeOps, at: float) -> None:
        self.ops = ops
        self.at = at
        self.released = False

    def query(self) -> bool:
        if self.ops.fail_query:
            raise RuntimeError("CUDA error: an illegal memory access was encountered (fake)")
        return not self.ops.held

    def seconds_until(self, later: FakeMarker) -> float:  # type: ignore[override]
        return later.at - self.at

    def release(self) -> None:
        self.released = True


class FakeOps:
    """:class:`rlpulse.producer.device.DeviceOps` over CPU tensors."""

    torch = torch

    def __init__(self, *, held: bool = False, initialized: bool = True) -> None:
        self.recorded = 0
        self.held = held
        self.clock = 0.0
        self.markers: list[FakeMarker] = []
        self.side_runs = 0
        self.kept: list[torch.Tensor] = []
        self.fail_launch = False
        self.fail_query = False
        self.initialized = initialized

    def owns(self, tensor: Any) -> bool:
        return tensor.device.type == "cpu"

    def current_device(self) -> Any:
        return torch.device("cpu") if self.initialized else None

    def marker(self, device: Any, timing: bool = False) -> FakeMarker:
        marker = FakeMarker(self, self.clock)
        self.recorded += 1
        self.markers.append(marker)
        return marker

    @contextmanager
    def after(self, device: Any, marker: Any) -> Iterator[object]:
        if self.fail_launch:
            raise RuntimeError("CUDA error: out of memory (fake)")
        self.side_runs += 1
        yield None

    def keep(self, tensor: Any, device: Any) -> None:
        self.kept.append(tensor)

    def to_host(self, tensor: Any) -> Any:
        return tensor.clone()

    def upload(self, array: np.ndarray, device: Any) -> Any:
        return torch.from_numpy(np.array(array))

    def release(self) -> None:
        """The device runs: every marker, recorded or to come, passes."""
        self.held = False


def fake_context(**kwargs: Any) -> tuple[DeviceContext, FakeOps]:
    limit = kwargs.pop("snapshot_limit_bytes", 1 << 30)
    ops = FakeOps(**kwargs)
    return DeviceContext(ops, snapshot_limit_bytes=limit), ops


class Recorder(TorchDispatchMode):
    """Every aten op the caller's thread dispatches (thread-local, so the sender's own
    reductions are not seen). A copy that names a device without ``non_blocking`` is
    recorded as ``blocking_transfer``: on a GPU it would wait."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = func.__name__.split(".")[0]
        if name == "copy_":
            blocking = not kwargs.get("non_blocking", len(args) > 2 and args[2])
        else:
            blocking = name == "_to_copy" and "device" in kwargs and not kwargs.get("non_blocking")
        if blocking:
            name = "blocking_transfer"
        self.ops.append(name)
        return func(*args, **kwargs)


# What a snapshot is made of: copies on the device (clone, stack), views, and the fake's
# upload of a host mask (lift_fresh; on CUDA a pinned, non-blocking copy). Anything that reads
# a value back (_local_scalar_dense), transfers with waiting, reduces (sum, amin), or sizes its
# output by the data (nonzero, masked_select) would synchronize or cost more on a GPU.
SNAPSHOT_OPS = {"clone", "stack", "detach", "view", "alias", "lift_fresh"}
SYNCING_OPS = {"_local_scalar_dense", "blocking_transfer", "nonzero", "masked_select", "item"}
