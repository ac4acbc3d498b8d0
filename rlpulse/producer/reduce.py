"""Turn whatever ``log()`` was given into a mergeable state.

Numbers, ``Weighted`` and ``Fraction`` are reduced in the caller's thread, at once; so are host
arrays too small to be worth a copy, or beyond the producer's ``snapshot_limit_bytes`` of copies
not yet reduced. Larger host arrays are copied in ``log()`` and reduced later by the sender
thread (``rlpulse.producer.copies``); tensors on a GPU are handed to ``rlpulse.producer.device``
(reduced on a side stream), so ``log()`` never waits for the GPU. Raw arrays never leave the
producer.

Every reducer returns one record, :class:`Reduced`: the mergeable state of
``rlpulse.schemas.values``, how many non-finite samples were left out of it (counted, never
merged) and, for a distribution metric, the encoded sketch of its finite samples
(``rlpulse.producer.sketch``). The same record travels unchanged to the entry encoder
(``rlpulse.producer.encode``). A reduction the sender thread runs and that fails is a
:class:`Failed` in its place, never an exception in a list.

The numpy path does the least an exact reduction needs: one float64 sum, a min and a max over
the data as it is (no float64 copy; a mask selects its samples with one ``np.compress``). A
finite sum proves every sample finite (a NaN or an infinity would have made it NaN or
infinite), so the finite check runs only when the sum says something is off.

The torch reduction (:func:`reduce_tensor`) lives here too: the caller uses it for tensors it
reduces at once, and ``rlpulse.producer.device`` queues it on a side stream. Imports point one
way: ``device`` -> ``deferred`` -> ``reduce``, never back.
"""

from __future__ import annotations

import math
import sys
from typing import Any, NamedTuple, TypeGuard

import numpy as np

from rlpulse.producer.values import Fraction, Masked, Weighted
from rlpulse.schemas.values import EMPTY, Summary


class Reduced(NamedTuple):
    """One reduced value, from the reducers to the wire entry.

    >>> Reduced(Summary.of_scalar(2.0), nonfinite=1)
    Reduced(state=Summary(sum=2.0, weight=1.0, min=2.0, max=2.0), nonfinite=1, sketch=None)
    """

    state: Summary
    """The mergeable state of the finite samples."""
    nonfinite: int = 0
    """Non-finite samples left out of ``state`` (counted per name, never merged)."""
    sketch: bytes | None = None
    """A distribution metric's encoded quantile sketch of the finite samples; None for any
    other metric, and for a distribution value with no finite sample."""


class Failed(NamedTuple):
    """A value the sender thread could not reduce, in place of its :class:`Reduced`: the call's
    other values still go; this one is counted as invalid and warned about, ``reason`` (the
    error's ``repr``) naming why."""

    reason: str


NOTHING = Reduced(EMPTY, 0)
quiet = np.errstate(over="ignore", invalid="ignore")
"""Decorates the reductions: a sum of +inf and -inf, or one that overflows, is a non-finite
sum they then handle (count the non-finite samples, name the overflow), never a numpy warning
in the training process, nor the exception that warning becomes where the user's program
turns warnings into errors (``-W error``, pytest's ``filterwarnings = error``) or sets
``np.seterr(all="raise")``: that exception failed the whole ``log()`` call. Per call it costs
about 0.7 µs (numpy 2.4 here)."""


class InvalidValue(TypeError):
    """A value ``log()`` cannot turn into samples; the message says why."""


def finish(s: float, w: float, mn: float, mx: float, nf: int) -> Reduced:
    """A state from raw reduction outputs: no weight means no extremes either."""
    if w <= 0:
        return Reduced(EMPTY, nf)
    if not math.isfinite(s):
        raise InvalidValue(f"the sum of the samples overflows float64 ({s})")
    return Reduced(Summary(float(s), float(w), float(mn), float(mx)), nf)


def weighted_state(v: float, w: float) -> Reduced:
    """``Weighted(v, w)`` from host numbers: a mean over ``w`` samples, extremes unknown."""
    if not math.isfinite(w) or w < 0:
        raise InvalidValue(f"Weighted weight must be finite and non-negative, got {w}")
    if not math.isfinite(v):
        return Reduced(EMPTY, 1)
    return Reduced(Summary.of_weighted(v, w), 0)


def fraction_state(num: float, den: float) -> Reduced:
    """``Fraction(num, den)`` from host numbers: the two slots of a pooled ratio."""
    if not (math.isfinite(num) and math.isfinite(den)) or den < 0 or num < 0:
        raise InvalidValue(f"Fraction needs finite, non-negative parts, got {num}/{den}")
    return Reduced(Summary.of_fraction(num, den), 0)


def scalar_state(x: float) -> Reduced:
    """One sample (none, counted, if it is not finite)."""
    return Reduced(Summary.of_scalar(x), 0) if math.isfinite(x) else Reduced(EMPTY, 1)


def writable(arr: np.ndarray) -> np.ndarray:
    """``arr``, or a copy of it when it is read-only (``np.frombuffer``, a memory map, a
    frozen array): torch warns when it is given read-only memory, and where the training
    program turns warnings into errors that warning failed the whole ``log()`` call."""
    return arr if arr.flags.writeable else arr.copy()


def _torch() -> Any:
    """torch if this process imported it (never imported here: a CPU-only worker pays nothing)."""
    return sys.modules.get("torch")


def _is_tensor(value: Any) -> TypeGuard[Any]:
    torch = _torch()
    return torch is not None and isinstance(value, torch.Tensor)


def scalar(value: Any, what: str) -> float:
    """A Python number from an int, float, 0-d/1-element array or CPU tensor."""
    if isinstance(value, (int, float)):
        return float(value)
    if _is_tensor(value):
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


def shape_of(value: Any) -> tuple[int, ...]:
    """The shape of an array, a tensor, a number or (nested) list, as numpy reads it."""
    shape = getattr(value, "shape", None)
    return tuple(shape) if shape is not None else np.shape(value)


def check_mask(values: tuple[int, ...], mask: tuple[int, ...]) -> None:
    """Raise :class:`InvalidValue` unless a mask of shape ``mask`` fits values of shape
    ``values``: the same shape, exactly. Not numpy's broadcasting: a ``[B]`` mask against
    ``[B, T]`` values broadcasts along the wrong axis when ``B == T`` and is refused otherwise,
    and a transposed ``[T, B]`` mask has the right element count; each would give a wrong
    number silently. Shapes are host metadata: comparing them never waits for a GPU."""
    if mask != values:
        raise InvalidValue(
            f"mask has shape {tuple(mask)} but values have shape {tuple(values)}: a mask must "
            "have its values' shape (a transposed mask? a mask to broadcast: expand it first)"
        )


def selected(values: Any, mask: Any | None) -> np.ndarray:
    """The samples ``mask`` selects from host ``values``, as a flat numpy array (finite or
    not); raise :class:`InvalidValue` when they cannot be read or the shapes differ."""
    try:
        arr = np.asarray(values)
        if arr.dtype.kind not in "biuf":
            arr = arr.astype(np.float64)
    except (TypeError, ValueError) as exc:
        raise InvalidValue(f"cannot read samples from {type(values).__name__}: {exc}") from None
    if mask is not None:
        m = np.asarray(mask)
        check_mask(arr.shape, m.shape)
        m = m.reshape(-1)
        return np.compress(m if m.dtype == np.bool_ else m.astype(bool), arr.reshape(-1))
    return arr.reshape(-1)


@quiet
def _numpy(values: Any, mask: Any | None) -> Reduced:
    arr = selected(values, mask)
    if arr.size == 0:
        return NOTHING
    s = float(np.sum(arr, dtype=np.float64))
    if math.isfinite(s):  # then every sample is finite
        return finish(s, float(arr.size), float(arr.min()), float(arr.max()), 0)
    finite = np.isfinite(arr)
    sel = np.compress(finite, arr)
    nonfinite = int(arr.size - sel.size)
    if sel.size == 0:
        return Reduced(EMPTY, nonfinite)
    s = float(np.sum(sel, dtype=np.float64))
    return finish(s, float(sel.size), float(sel.min()), float(sel.max()), nonfinite)


def _numpy_view(tensor: Any) -> np.ndarray | None:
    """A zero-copy numpy view of a CPU tensor; None for dtypes numpy lacks (bfloat16)."""
    try:
        return (tensor.detach() if tensor.requires_grad else tensor).numpy()
    except (TypeError, RuntimeError):
        return None


def reduce_tensor(torch: Any, values: Any, mask: Any | None) -> Any:
    """``[sum, count, min, max, nonfinite]`` (float64, on the tensor's device) of the finite
    samples of ``values`` (where ``mask`` is true). Queued kernels only: nothing is read back.
    ``min``/``max`` are +inf/-inf when no sample is valid; ``values`` must not be empty."""
    v = values.reshape(-1)
    if not v.is_floating_point():
        v = v.to(torch.float64)  # ints and bools: exact in float64, and inf representable
    valid = torch.isfinite(v)
    if mask is None:
        nonfinite = v.numel() - valid.sum()
    else:
        m = mask.reshape(-1).to(torch.bool)
        nonfinite = (m & ~valid).sum()
        valid &= m
    f64 = torch.float64
    return torch.stack(
        [
            torch.where(valid, v, 0).sum(dtype=f64),
            valid.sum().to(f64),
            torch.where(valid, v, math.inf).amin().to(f64),
            torch.where(valid, v, -math.inf).amax().to(f64),
            nonfinite.to(f64),
        ]
    )


def reduce_host_tensor(values: Any, mask: Any | None) -> Reduced:
    """Reduce a tensor with torch where it lives, synchronously: CPU tensors numpy cannot
    view, and devices other than CUDA (no deferral there)."""
    torch = _torch()
    if mask is not None:
        if not isinstance(mask, torch.Tensor):
            mask = torch.as_tensor(writable(np.asarray(mask)))
        check_mask(values.shape, mask.shape)
        mask = mask.to(values.device)
    if values.numel() == 0:
        return NOTHING
    s, w, mn, mx, nf = reduce_tensor(torch, values, mask).tolist()
    return finish(s, w, mn, mx, int(nf))


def reduce_value(value: Any) -> Reduced:
    """Reduce one logged value now; raise :class:`InvalidValue` if it cannot be read.

    ``log()`` sends GPU tensors to ``rlpulse.producer.device`` before it gets here; a GPU tensor that
    does arrive (tests, tools) is reduced where it lives and read back, which waits for it.
    """
    if isinstance(value, Weighted):
        return weighted_state(
            scalar(value.value, "Weighted value"), scalar(value.weight, "Weighted weight")
        )
    if isinstance(value, Fraction):
        return fraction_state(
            scalar(value.numerator, "Fraction numerator"),
            scalar(value.denominator, "Fraction denominator"),
        )
    values, mask = (value.values, value.mask) if isinstance(value, Masked) else (value, None)
    if isinstance(values, (str, bytes, dict)) or values is None:
        raise InvalidValue(f"cannot log a {type(values).__name__} as a metric")
    if _is_tensor(values):
        if values.layout is not _torch().strided:
            raise InvalidValue(f"cannot log a {values.layout} tensor; log its .to_dense()")
        view = _numpy_view(values) if values.device.type == "cpu" else None
        mask_view = _numpy_view(mask) if _is_tensor(mask) else mask
        if view is None or (mask_view is None and mask is not None):
            return reduce_host_tensor(values, mask)
        return _numpy(view, mask_view)
    if _is_tensor(mask):
        mask = mask.detach().cpu().numpy()
    return _numpy(values, mask)
