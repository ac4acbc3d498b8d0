"""Turn whatever ``log()`` was given into a mergeable state, in the caller's thread.

Arrays are reduced where they are: numpy on the CPU, torch on the tensor's own device. For a
CUDA tensor the reduction is queued on the GPU and copied back asynchronously into pinned
memory; the sender thread waits for the copy (:class:`Pending`), so ``log()`` never syncs the
GPU. Raw arrays never leave this module.

A reduced value is ``(sum, weight, min, max, nonfinite)``: non-finite samples are left out of
the state and counted, and ``min``/``max`` are NaN when no sample defines them.
"""

from __future__ import annotations

import math
import sys
from typing import Any

import numpy as np

from producer.values import Fraction, Masked, Weighted

State = tuple[float, float, float, float, int]
NAN = math.nan


class InvalidValue(TypeError):
    """A value ``log()`` cannot turn into samples; the message says why."""


class Pending:
    """A reduction still running on a GPU: ``resolve()`` waits for it (sender thread only)."""

    __slots__ = ("_event", "_host")

    def __init__(self, host: Any, event: Any) -> None:
        self._host = host
        self._event = event

    def resolve(self) -> State:
        self._event.synchronize()
        s, w, mn, mx, nf = self._host.tolist()
        return _finish(s, w, mn, mx, int(nf))


def _finish(s: float, w: float, mn: float, mx: float, nf: int) -> State:
    if w <= 0:
        return (0.0, 0.0, NAN, NAN, nf)
    return (float(s), float(w), float(mn), float(mx), nf)


def _scalar(value: Any, what: str) -> float:
    """A Python number from an int, float, 0-d/1-element array or tensor."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, bool):
        return float(value)
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise InvalidValue(
                f"{what} must be a single number, got a tensor of shape {tuple(value.shape)}"
            )
        return float(value.detach().reshape(()).item())
    if isinstance(value, (np.ndarray, np.generic)):
        arr = np.asarray(value)
        if arr.size != 1:
            raise InvalidValue(f"{what} must be a single number, got an array of shape {arr.shape}")
        return float(arr.reshape(()))
    raise InvalidValue(f"{what} must be a number, got {type(value).__name__}")


def _numpy(values: Any, mask: Any | None) -> State:
    try:
        arr = np.asarray(values, dtype=np.float64).ravel()
    except (TypeError, ValueError) as exc:
        raise InvalidValue(f"cannot read samples from {type(values).__name__}: {exc}") from None
    finite = np.isfinite(arr)
    if mask is not None:
        m = np.asarray(mask).astype(bool).ravel()
        if m.shape != arr.shape:
            raise InvalidValue(f"mask has {m.size} elements but values have {arr.size}")
        nonfinite = int(np.count_nonzero(m & ~finite))
        finite &= m
    else:
        nonfinite = int(arr.size - np.count_nonzero(finite))
    sel = arr[finite]
    if sel.size == 0:
        return (0.0, 0.0, NAN, NAN, nonfinite)
    return (float(sel.sum()), float(sel.size), float(sel.min()), float(sel.max()), nonfinite)


def _numpy_view(tensor: Any) -> np.ndarray | None:
    """A zero-copy numpy view of a CPU tensor; None on a GPU or for dtypes numpy lacks."""
    if tensor.device.type != "cpu":
        return None
    try:
        return tensor.detach().numpy()
    except (TypeError, RuntimeError):  # bfloat16 and friends
        return None


def _torch(torch: Any, values: Any, mask: Any | None) -> State | Pending:
    """Reduce on the tensor's own device (GPU tensors; CPU dtypes numpy cannot view)."""
    v = values.detach().reshape(-1)
    v = v.to(torch.float64) if v.device.type != "mps" else v.to(torch.float32)
    finite = torch.isfinite(v)
    if mask is not None:
        m = torch.as_tensor(mask, device=v.device).reshape(-1).to(torch.bool)
        if m.shape != v.shape:
            raise InvalidValue(f"mask has {m.numel()} elements but values have {v.numel()}")
        nonfinite = (m & ~finite).sum()
        valid = finite & m
    else:
        nonfinite = (~finite).sum()
        valid = finite
    inf = torch.tensor(math.inf, dtype=v.dtype, device=v.device)
    stats = torch.stack(
        [
            torch.where(valid, v, torch.zeros_like(v)).sum(),
            valid.sum().to(v.dtype),
            torch.where(valid, v, inf).min() if v.numel() else inf,
            torch.where(valid, v, -inf).max() if v.numel() else -inf,
            nonfinite.to(v.dtype),
        ]
    )
    if v.device.type == "cuda":
        # non_blocking D2H lands in pinned memory; the event tells the sender when it is there.
        host = stats.to("cpu", non_blocking=True)
        event = torch.cuda.Event()
        event.record()
        return Pending(host, event)
    s, w, mn, mx, nf = stats.tolist()
    return _finish(s, w, mn, mx, int(nf))


def reduce_value(value: Any) -> State | Pending:
    """Reduce one logged value; raise :class:`InvalidValue` if it cannot be read."""
    if isinstance(value, Weighted):
        v = _scalar(value.value, "Weighted value")
        w = _scalar(value.weight, "Weighted weight")
        if not math.isfinite(w) or w < 0:
            raise InvalidValue(f"Weighted weight must be finite and non-negative, got {w}")
        if not math.isfinite(v):
            return (0.0, 0.0, NAN, NAN, 1)
        return (v * w, w, NAN, NAN, 0) if w > 0 else (0.0, 0.0, NAN, NAN, 0)
    if isinstance(value, Fraction):
        num = _scalar(value.numerator, "Fraction numerator")
        den = _scalar(value.denominator, "Fraction denominator")
        if not (math.isfinite(num) and math.isfinite(den)) or den < 0 or num < 0:
            raise InvalidValue(f"Fraction needs finite, non-negative parts, got {num}/{den}")
        return (num, den, NAN, NAN, 0)
    values, mask = (value.values, value.mask) if isinstance(value, Masked) else (value, None)
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(values, torch.Tensor):
        # On the CPU, numpy does this reduction in a few vectorised passes over a zero-copy
        # view, where torch dispatches a dozen small ops (measured ~3x slower on 4k tokens).
        view = _numpy_view(values)
        mask_view = _numpy_view(mask) if isinstance(mask, torch.Tensor) else mask
        if view is not None and (mask is None or mask_view is not None):
            return _numpy(view, mask_view)
        return _torch(torch, values, mask)
    if isinstance(values, (str, bytes, dict)) or values is None:
        raise InvalidValue(f"cannot log a {type(values).__name__} as a metric")
    if torch is not None and isinstance(mask, torch.Tensor):
        mask = mask.detach().cpu().numpy()
    return _numpy(values, mask)
