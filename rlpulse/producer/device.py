"""GPU values and GPU timings without ever making the caller wait for the GPU.

``log()`` must not synchronize with the device, yet the numbers it logs live there. The work
is split across the two threads of a producer:

* **In the caller** (``log()``, ``phase()``): a snapshot and a marker, nothing else. Tensors of
  more than one element are copied on the caller's current stream (``clone``: one kernel, so a
  later in-place update by the training loop cannot change what was logged); single numbers,
  ``Weighted`` and ``Fraction`` parts are gathered into one ``stack`` per dtype. Then one event
  is recorded on that stream. No reduction, no host copy, no ``.item()``: a few microseconds of
  launches whatever is queued on the GPU.
* **In the sender thread**: a side stream waits for the event (on the GPU, not the host),
  reduces every snapshot in a handful of kernels (``reduce.reduce_tensor``), copies the small
  result into pinned memory asynchronously and records a second event. The sender polls that
  event and encodes the entry once it has completed, keeping entries in order.

Snapshots cost GPU memory until the sender reduces them (milliseconds). Past
``snapshot_limit_bytes`` of outstanding snapshots a ``log()`` call reduces on the caller's
stream instead (no copy, a dozen launches, still no synchronization).

Everything CUDA-specific sits behind :class:`DeviceOps`, implemented for CUDA in
``rlpulse.producer.cuda`` (events, streams, pinned copies); tests run the same pipeline on CPU tensors
through a fake of it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rlpulse.producer.deferred import DeviceOps, DeviceValue, Known, Marker, PhaseTimer
from rlpulse.producer.reduce import (
    NOTHING,
    InvalidValue,
    Reduced,
    check_mask,
    finish,
    fraction_state,
    reduce_tensor,
    scalar as host_scalar,
    scalar_state,
    weighted_state,
    writable,
)
from rlpulse.producer.values import Fraction, Masked, Weighted
from rlpulse.schemas.sketch import SLOTS, encode as encode_sketch, torch_counts


def sketch_tensor(torch: Any, values: Any, mask: Any | None) -> Any:
    """The quantile sketch (``rlpulse.schemas.sketch``) of the finite samples of ``values``
    where ``mask`` is true: :data:`SLOTS` float64 counts on the tensor's device, queued
    kernels only (as :func:`reduce_tensor`)."""
    v = values.reshape(-1)
    valid = torch.isfinite(v) if v.is_floating_point() else torch.ones_like(v, dtype=torch.bool)
    if mask is not None:
        valid &= mask.reshape(-1).to(torch.bool)
    return torch_counts(torch, v, valid)


class _ArrayRef:
    __slots__ = ("batch", "index")

    def __init__(self, batch: DeviceBatch, index: int) -> None:
        self.batch, self.index = batch, index

    def state(self) -> Reduced:
        s, w, mn, mx, nf = self.batch.row(self.index)
        reduced = finish(s, w, mn, mx, int(nf))
        counts = self.batch.sketch(self.index)
        if counts is None or reduced.state.weight <= 0:
            return reduced
        return Reduced(reduced.state, reduced.nonfinite, encode_sketch(counts))


class _ScalarRef:
    __slots__ = ("batch", "index")

    def __init__(self, batch: DeviceBatch, index: int) -> None:
        self.batch, self.index = batch, index

    def number(self) -> float:
        return self.batch.scalar(self.index)

    def state(self) -> Reduced:
        return scalar_state(self.number())


def _number(part: _ScalarRef | float) -> float:
    return part.number() if isinstance(part, _ScalarRef) else part


class _PairRef:
    """``Weighted`` or ``Fraction`` with at least one part on the device."""

    __slots__ = ("a", "b", "kind")

    def __init__(self, kind: type, a: _ScalarRef | float, b: _ScalarRef | float) -> None:
        self.kind, self.a, self.b = kind, a, b

    def state(self) -> Reduced:
        a, b = _number(self.a), _number(self.b)
        return weighted_state(a, b) if self.kind is Weighted else fraction_state(a, b)


class DeviceBatch:
    """The device values of one ``log()`` call on one device: snapshotted in the caller,
    reduced on a side stream by the sender.

    The sender's result is one float64 vector: five numbers per array (see
    :func:`reduce_tensor`), then every gathered single number, stack by stack.
    """

    def __init__(self, context: DeviceContext, device: Any) -> None:
        self.context = context
        self.device = device
        self._arrays: list[Any] = []
        """Per array: a snapshot ``(values, mask)`` to reduce, or its row, reduced inline."""
        self._sketches: dict[int, Any] = {}
        """Arrays of distribution metrics: index -> None (sketch the snapshot in
        :meth:`launch`) or the sketch, computed inline with the row past the budget."""
        self._sketch_at: dict[int, int] = {}
        self._groups: dict[Any, list[Any]] = {}
        self._slots: list[tuple[Any, int]] = []
        self._stacks: list[Any] = []
        self._scalar_at: list[int] = []
        self._bytes = 0
        self._marker: Marker | None = None
        self._done: Marker | None = None
        self._host: Any = None
        self._numbers: np.ndarray | None = None

    # ---- the caller's side

    def add_array(self, values: Any, mask: Any | None, sketch: bool = False) -> _ArrayRef | Known:
        ctx, torch = self.context, self.context.ops.torch
        values = values.detach()
        if mask is not None:  # shapes are host metadata: no wait for the device
            check_mask(
                values.shape, mask.shape if isinstance(mask, torch.Tensor) else np.shape(mask)
            )
        if values.numel() == 0:
            return Known(NOTHING)
        if mask is not None:
            if not isinstance(mask, torch.Tensor):
                mask = ctx.ops.upload(np.asarray(mask, dtype=bool).reshape(-1), values.device)
            elif mask.device != values.device:
                mask = ctx.move(mask.detach(), values.device)
            else:
                mask = mask.detach()
        item = ctx.snapshot(values, mask, self)
        self._arrays.append(item)
        if sketch:  # past the budget (no snapshot): sketched inline, as the row was
            inline = None if isinstance(item, tuple) else sketch_tensor(torch, values, mask)
            self._sketches[len(self._arrays) - 1] = inline
        return _ArrayRef(self, len(self._arrays) - 1)

    def add_scalar(self, tensor: Any) -> _ScalarRef:
        if tensor.numel() != 1:
            raise InvalidValue(
                f"a Weighted or Fraction part must be a single number, got a tensor of shape "
                f"{tuple(tensor.shape)}"
            )
        group = self._groups.setdefault(tensor.dtype, [])
        group.append(tensor.detach().reshape(()))
        self._slots.append((tensor.dtype, len(group) - 1))
        return _ScalarRef(self, len(self._slots) - 1)

    def seal(self) -> None:
        """Snapshot the gathered numbers (one ``stack`` per dtype) and mark the stream."""
        torch = self.context.ops.torch
        start, at = {}, 5 * len(self._arrays)
        for dtype, group in self._groups.items():
            start[dtype] = at
            at += len(group)
            self._stacks.append(torch.stack(group))
        self._scalar_at = [start[dtype] + position for dtype, position in self._slots]
        self._groups = {}
        self._marker = self.context.ops.marker(self.device)

    # ---- the sender's side

    def launch(self) -> None:
        ops, torch = self.context.ops, self.context.ops.torch
        assert self._marker is not None, "launch() before seal()"
        try:
            with ops.after(self.device, self._marker):
                parts = []
                for item in self._arrays:
                    if isinstance(item, tuple):
                        values, mask = item
                        ops.keep(values, self.device)
                        if mask is not None:
                            ops.keep(mask, self.device)
                        parts.append(reduce_tensor(torch, values, mask))
                    else:
                        ops.keep(item, self.device)
                        parts.append(item)
                for stack in self._stacks:
                    ops.keep(stack, self.device)
                    parts.append(stack.to(torch.float64))
                at = 5 * len(self._arrays) + sum(len(stack) for stack in self._stacks)
                for index, inline in self._sketches.items():
                    if inline is None:
                        values, mask = self._arrays[index]
                        inline = sketch_tensor(torch, values, mask)
                    else:
                        ops.keep(inline, self.device)
                    parts.append(inline)
                    self._sketch_at[index] = at
                    at += SLOTS
                self._host = ops.to_host(torch.cat(parts) if len(parts) > 1 else parts[0])
                self._done = ops.marker(self.device)
        finally:
            self.abandon()

    def abandon(self) -> None:
        """Drop the snapshots (reduced, or never to be) and give their bytes back."""
        self.context.released(self._bytes)
        self._bytes = 0
        self._arrays, self._stacks, self._sketches = [], [], {}

    def ready(self) -> bool:
        return self._done is not None and self._done.query()

    def release(self) -> None:
        for marker in (self._marker, self._done):
            if marker is not None:
                marker.release()
        self._marker = self._done = None

    def _read(self) -> np.ndarray:
        if self._numbers is None:
            self._numbers = self._host.numpy()
        return self._numbers

    def row(self, index: int) -> list[float]:
        return self._read()[5 * index : 5 * index + 5].tolist()

    def sketch(self, index: int) -> np.ndarray | None:
        """The sketch counts of array ``index``, when it is a distribution metric's."""
        at = self._sketch_at.get(index)
        if at is None:
            return None
        return self._read()[at : at + SLOTS].astype(np.int64)

    def scalar(self, index: int) -> float:
        return float(self._read()[self._scalar_at[index]])


class DeviceContext:
    """A producer's device state: the ops, the snapshot budget, and the routing test
    ``log()`` runs on every value that is not a plain number."""

    def __init__(self, ops: DeviceOps, snapshot_limit_bytes: int) -> None:
        self.ops = ops
        self.limit = snapshot_limit_bytes
        self._taken = 0  # written by callers only
        self._given_back = 0  # written by the sender only

    def owns(self, value: Any) -> bool:
        """Whether ``value`` holds a tensor on the device (then :meth:`call` takes it)."""
        torch, owns = self.ops.torch, self.ops.owns
        if isinstance(value, torch.Tensor):
            return owns(value)
        if isinstance(value, Masked):
            parts: tuple[Any, ...] = (value.values, value.mask)
        elif isinstance(value, Weighted):
            parts = (value.value, value.weight)
        elif isinstance(value, Fraction):
            parts = (value.numerator, value.denominator)
        else:
            return False
        return any(isinstance(p, torch.Tensor) and owns(p) for p in parts)

    def move(self, tensor: Any, device: Any) -> Any:
        """A tensor onto ``device`` without waiting (host data through pinned memory)."""
        if tensor.device.type == "cpu":
            return self.ops.upload(tensor.numpy(), device)
        return tensor.to(device, non_blocking=True)

    def snapshot(self, values: Any, mask: Any | None, batch: DeviceBatch) -> Any:
        """What the sender will reduce: copies of ``values`` (and ``mask``), or, past the
        budget, the reduced row itself, queued on the caller's stream (no copy)."""
        size = values.numel() * values.element_size()
        if mask is not None:
            size += mask.numel() * mask.element_size()
        if self._taken - self._given_back + size > self.limit:
            return reduce_tensor(self.ops.torch, values, mask)
        self._taken += size
        batch._bytes += size
        return (values.clone(), None if mask is None else mask.clone())

    def released(self, size: int) -> None:
        self._given_back += size

    def outstanding(self) -> int:
        """Bytes of snapshots the sender has not reduced yet."""
        return self._taken - self._given_back

    def call(self) -> DeviceCall:
        return DeviceCall(self)

    def phase_timer(self) -> PhaseTimer | None:
        """Timers for a phase on the current device; None when this process has not started
        using the GPU (a phase must not be the thing that creates a CUDA context)."""
        device = self.ops.current_device()
        return None if device is None else PhaseTimer(self.ops, device)


class DeviceCall:
    """The device part of one ``log()`` call: a batch per device, sealed at the end."""

    __slots__ = ("batches", "context")

    def __init__(self, context: DeviceContext) -> None:
        self.context = context
        self.batches: dict[Any, DeviceBatch] = {}

    def _batch(self, device: Any) -> DeviceBatch:
        batch = self.batches.get(device)
        if batch is None:
            batch = self.batches[device] = DeviceBatch(self.context, device)
        return batch

    def _part(self, part: Any, what: str) -> _ScalarRef | float:
        ops = self.context.ops
        if isinstance(part, ops.torch.Tensor) and ops.owns(part):
            return self._batch(part.device).add_scalar(part)
        return host_scalar(part, what)

    def add(self, value: Any, sketch: bool = False) -> DeviceValue:
        """Take one value :meth:`DeviceContext.owns`; raise InvalidValue as ``log()`` would.
        ``sketch``: a distribution metric's, whose samples are also sketched."""
        ops = self.context.ops
        if isinstance(value, Weighted):
            return _PairRef(
                Weighted,
                self._part(value.value, "Weighted value"),
                self._part(value.weight, "Weighted weight"),
            )
        if isinstance(value, Fraction):
            return _PairRef(
                Fraction,
                self._part(value.numerator, "Fraction numerator"),
                self._part(value.denominator, "Fraction denominator"),
            )
        values, mask = (value.values, value.mask) if isinstance(value, Masked) else (value, None)
        if not (isinstance(values, ops.torch.Tensor) and ops.owns(values)):
            # Only the mask is on the device: bring the values there.
            assert mask is not None  # owns() said a part of the value is on the device
            host = writable(np.asarray(values))
            values = self.context.move(ops.torch.as_tensor(host), mask.device)
        if values.numel() == 1 and mask is None and not sketch:
            return self._batch(values.device).add_scalar(values)
        return self._batch(values.device).add_array(values, mask, sketch)

    def abandon(self) -> None:
        """The call failed half-way: give back what its snapshots took."""
        for batch in self.batches.values():
            batch.abandon()

    def seal(self) -> tuple[DeviceBatch, ...]:
        """Snapshot and mark every batch; the sender launches them (:class:`Pending`)."""
        batches = tuple(self.batches.values())
        for batch in batches:
            batch.seal()
        return batches
