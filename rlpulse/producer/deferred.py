"""What the producer's two threads agree on about GPU work: markers in a stream, the device
runtime behind them, values whose state is known only once the device has caught up, and the
work a queued ``log()`` call waits for. ``rlpulse.producer.device`` implements the pipeline;
``rlpulse.producer.cuda`` the runtime for CUDA.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any, Protocol

import numpy as np

from rlpulse.producer.reduce import Reduced, scalar_state


class Marker(Protocol):
    """A point in a stream's work (a CUDA event)."""

    def query(self) -> bool:
        """Whether the device has passed this point (never waits)."""
        ...

    def seconds_until(self, later: Marker) -> float:
        """Device time from this marker to ``later`` (both timing markers, both passed)."""
        ...

    def release(self) -> None:
        """Done with it: the event may be recorded again."""
        ...


class DeviceOps(Protocol):
    """What the pipeline needs from a device runtime."""

    torch: Any

    def owns(self, tensor: Any) -> bool:
        """Whether ``tensor`` lives on a device whose values are deferred."""
        ...

    def current_device(self) -> Any | None:
        """The caller's current device, or None if this process has not started using one."""
        ...

    def marker(self, device: Any, timing: bool = False) -> Marker:
        """Record a marker on ``device``'s current stream."""
        ...

    def after(self, device: Any, marker: Marker) -> AbstractContextManager[object]:
        """Run the enclosed kernels on a side stream of ``device`` once ``marker`` is passed."""
        ...

    def keep(self, tensor: Any, device: Any) -> None:
        """``tensor`` is used on the side stream: its memory must outlive that use."""
        ...

    def to_host(self, tensor: Any) -> Any:
        """Start an asynchronous copy into pinned host memory; valid once a later marker
        on the same stream has passed."""
        ...

    def upload(self, array: np.ndarray, device: Any) -> Any:
        """Host data to ``device`` without waiting (through pinned memory)."""
        ...


class DeviceValue(Protocol):
    """A logged value whose state is known once its batch is ready (sender thread)."""

    def state(self) -> Reduced: ...


class Pending(Protocol):
    """Work a queued ``log()`` call waits for before the sender encodes it."""

    def launch(self) -> None:
        """Queue the remaining device work (sender thread, once)."""
        ...

    def ready(self) -> bool: ...

    def release(self) -> None:
        """The values were read: give back events and buffers."""
        ...


class Known:
    """A device value whose state needed no device work (an empty tensor)."""

    __slots__ = ("value",)

    def __init__(self, value: Reduced) -> None:
        self.value = value

    def state(self) -> Reduced:
        return self.value


class GpuTime:
    """Device time between two timing markers of a phase, in seconds."""

    __slots__ = ("end", "start")

    def __init__(self, start: Marker, end: Marker) -> None:
        self.start, self.end = start, end

    def state(self) -> Reduced:
        return scalar_state(self.start.seconds_until(self.end))


class PhaseTimer:
    """Timing markers at a phase's boundaries on the caller's current stream, recorded in the
    caller and read by the sender once the last one has passed (:class:`Pending`)."""

    def __init__(self, ops: DeviceOps, device: Any) -> None:
        self.ops, self.device = ops, device
        self.marks: dict[str, Marker] = {"start": ops.marker(device, timing=True)}

    def mark(self, point: str) -> None:
        self.marks[point] = self.ops.marker(self.device, timing=True)

    def times(self) -> dict[str, GpuTime]:
        """Part -> device time: ``total``, ``execute``, and ``onload``/``offload`` when the
        phase did them (points ``onloaded``, ``executed``, ``end``)."""
        m = self.marks
        loaded = m.get("onloaded", m["start"])
        executed = m.get("executed", m["end"])
        out = {"total": GpuTime(m["start"], m["end"]), "execute": GpuTime(loaded, executed)}
        if "onloaded" in m:
            out["onload"] = GpuTime(m["start"], loaded)
        if "executed" in m:
            out["offload"] = GpuTime(executed, m["end"])
        return out

    def launch(self) -> None:
        pass

    def ready(self) -> bool:
        return self.marks["end"].query()

    def release(self) -> None:
        for marker in self.marks.values():
            marker.release()
        self.marks = {}
