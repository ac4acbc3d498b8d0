"""Turn whatever ``log()`` was given into a mergeable state.

Numbers, ``Weighted`` and ``Fraction`` are reduced in the caller's thread, at once. Host arrays
(numpy arrays, CPU tensors, ``Masked`` of them) of at least :data:`COPY_MIN` elements are
copied in the caller (:func:`snapshot_value`, a few µs) and reduced by the sender thread
(:meth:`Snapshot.reduce`, tens of µs for a few thousand samples): the training thread pays
for a copy, not for the reduction, and may change its arrays right after ``log()``. A call's
alike arrays (per-token tensors sharing a response mask) are copied together, in one call into
one array (:func:`snapshot_rows`, a :class:`Rows`), and reduced together. Smaller
ones, and any beyond the producer's ``snapshot_limit_bytes`` of copies not yet reduced, are
reduced at once. Tensors on a GPU are handed to ``rlpulse.producer.device``: the caller only
snapshots them, and the sender thread reduces them later, so ``log()`` never waits for the
GPU. Raw arrays never leave the producer.

A reduced value is ``(Summary, nonfinite)``: the mergeable state of ``rlpulse.schemas.values`` and how
many non-finite samples were left out of it (counted, never merged).

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
from collections import OrderedDict, deque
from collections.abc import Callable
from typing import Any

import numpy as np

from rlpulse.producer.values import Fraction, Masked, Weighted
from rlpulse.schemas.values import EMPTY, Summary

Reduced = tuple[Summary, int]
"""A state and the number of non-finite samples left out of it."""
NOTHING: Reduced = (EMPTY, 0)
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
        return (EMPTY, nf)
    if not math.isfinite(s):
        raise InvalidValue(f"the sum of the samples overflows float64 ({s})")
    return (Summary(float(s), float(w), float(mn), float(mx)), nf)


def weighted_state(v: float, w: float) -> Reduced:
    """``Weighted(v, w)`` from host numbers: a mean over ``w`` samples, extremes unknown."""
    if not math.isfinite(w) or w < 0:
        raise InvalidValue(f"Weighted weight must be finite and non-negative, got {w}")
    if not math.isfinite(v):
        return (EMPTY, 1)
    return (Summary.of_weighted(v, w), 0)


def fraction_state(num: float, den: float) -> Reduced:
    """``Fraction(num, den)`` from host numbers: the two slots of a pooled ratio."""
    if not (math.isfinite(num) and math.isfinite(den)) or den < 0 or num < 0:
        raise InvalidValue(f"Fraction needs finite, non-negative parts, got {num}/{den}")
    return (Summary.of_fraction(num, den), 0)


def scalar_state(x: float) -> Reduced:
    """One sample (none, counted, if it is not finite)."""
    return (Summary.of_scalar(x), 0) if math.isfinite(x) else (EMPTY, 1)


def writable(arr: np.ndarray) -> np.ndarray:
    """``arr``, or a copy of it when it is read-only (``np.frombuffer``, a memory map, a
    frozen array): torch warns when it is given read-only memory, and where the training
    program turns warnings into errors that warning failed the whole ``log()`` call."""
    return arr if arr.flags.writeable else arr.copy()


def _torch() -> Any:
    """torch if this process imported it (never imported here: a CPU-only worker pays nothing)."""
    return sys.modules.get("torch")


def _is_tensor(value: Any) -> bool:
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


def selected(values: Any, mask: Any | None) -> np.ndarray:
    """The samples ``mask`` selects from host ``values``, as a flat numpy array (finite or
    not); raise :class:`InvalidValue` when they cannot be read or the shapes differ."""
    try:
        arr = np.asarray(values)
        if arr.dtype.kind not in "biuf":
            arr = arr.astype(np.float64)
    except (TypeError, ValueError) as exc:
        raise InvalidValue(f"cannot read samples from {type(values).__name__}: {exc}") from None
    arr = arr.reshape(-1)
    if mask is not None:
        m = np.asarray(mask).reshape(-1)
        if m.shape != arr.shape:
            raise InvalidValue(f"mask has {m.size} elements but values have {arr.size}")
        arr = np.compress(m if m.dtype == np.bool_ else m.astype(bool), arr)
    return arr


COPY_MIN = 256
"""Host arrays of at least this many samples are copied in ``log()`` and reduced by the sender
thread; below it, reducing them at once costs the caller about what the copy would."""


class Snapshot:
    """Samples copied in ``log()``, reduced later by the sender thread (:meth:`reduce`):
    ``values`` and ``mask`` (or None) are the producer's own copies, flat, of the same size
    (a mask may be shared by the snapshots of one call); ``nbytes`` what the copies hold
    (counted against ``snapshot_limit_bytes`` until reduced)."""

    __slots__ = ("mask", "nbytes", "values")

    def __init__(self, values: np.ndarray, mask: np.ndarray | None) -> None:
        self.values = values
        self.mask = mask
        self.nbytes = values.nbytes + (0 if mask is None else mask.nbytes)

    def reduce(self) -> Reduced | tuple:
        """The exact state of the selected samples (raises :class:`InvalidValue`)."""
        return _numpy(self.values, self.mask)


class Rows:
    """Alike host arrays of one call, copied together in ``log()`` (:func:`snapshot_rows`):
    row ``k`` of ``values`` (one row per name, flat) holds the samples of ``names[k]``, and
    ``mask`` (flat, or None) selects in every row. The payload holds this one object under
    each of its names, so ``log()`` makes no object per name; the sender reduces it once
    (:meth:`reduce`) and gives ``values`` back once. ``nbytes``: what the copies hold."""

    __slots__ = ("mask", "names", "nbytes", "values")

    def __init__(self, names: list[str], values: np.ndarray, mask: np.ndarray | None) -> None:
        self.names = names
        self.values = values
        self.mask = mask
        self.nbytes = values.nbytes + (0 if mask is None else mask.nbytes)

    def reduce(self) -> list[Any]:
        """The exact state of each row, in ``names`` order (an exception in place of the
        state of a row that could not be reduced)."""
        try:
            return _reduce_block(self.values, self.mask)
        except Exception as exc:  # the caller counts it per name; the call's others still go
            return [exc] * len(self.names)


POOL_IDLE_BYTES = 4 << 20
"""Idle copy buffers :class:`Buffers` keeps per shape and dtype, at most: a sender cycle
(``sender.CYCLE_S``) may gather several calls' copies before it gives them back, and with 1 MiB
(three 20 x 4,096 float32 tensor steps) one call in 25 of the caller-cost benchmark copied
into fresh memory (80 page faults, about 200 µs); with 4 MiB one in 40, mostly at start."""
POOL_SHAPES = 16
"""Shapes and dtypes :class:`Buffers` keeps buffers for, at most, the least recently given
back dropped first: per-token tensors change length from step to step, and a pool that
kept only the first lengths it saw never reused a buffer of a later one. Idle buffers are
bounded by ``POOL_SHAPES * POOL_IDLE_BYTES`` (64 MiB) in all."""


class Buffers:
    """Arrays reused for host copies. Fresh memory for every copy costs page faults (about
    10 µs per 16 KB here: the allocator hands freed memory back to the system between
    calls), a reused buffer about 1 µs. :meth:`take` runs in the caller's thread,
    :meth:`give` in the sender's; a deque's append and pop are atomic, so no lock. Idle
    buffers are bounded: ``POOL_IDLE_BYTES`` per shape and dtype, ``POOL_SHAPES`` of them.
    """

    def __init__(self) -> None:
        self._free: OrderedDict[tuple[str, int], deque[np.ndarray]] = OrderedDict()
        """Idle buffers by dtype and size, the most recently given back last."""

    def take(self, like: np.ndarray) -> np.ndarray:
        """An array of ``like``'s dtype and shape, holding a copy of it."""
        buf = self._pop_as(like.dtype, like.size, like.shape)
        if buf is None:
            return like.copy()
        np.copyto(buf, like)
        return buf

    def empty(self, dtype: np.dtype, shape: tuple[int, int]) -> np.ndarray:
        """An array of ``dtype`` and ``shape`` to copy into."""
        buf = self._pop_as(dtype, shape[0] * shape[1], shape)
        return np.empty(shape, dtype) if buf is None else buf

    def tensor_rows(self, torch: Any, dtype: np.dtype, like: Any, n: int) -> tuple[np.ndarray, Any]:
        """An ``(n, like.numel())`` array of ``dtype`` (numpy's for ``like.dtype``) and a tensor
        over the same memory shaped ``(n, *like.shape)`` to copy ``n`` tensors like ``like``
        into. A buffer made here is a tensor's numpy view, so the tensor comes back with it
        (``base``): reusing one costs no ``from_numpy``, and no ``view`` for flat rows."""
        size = like.numel()
        buf = self._pop(dtype.str, n * size)
        out = None if buf is None else buf.base
        if type(out) is not torch.Tensor or out.dtype is not like.dtype:
            out = torch.empty((n, size), dtype=like.dtype)
            buf = out.numpy()
        elif buf.shape != (n, size):  # the same size, other rows: a view of the same memory
            out = out.view(n, size)
            buf = out.numpy()
        if like.dim() != 1:
            out = out.view(n, *like.shape)
        return buf, out

    def _pop_as(self, dtype: np.dtype, size: int, shape: tuple[int, ...]) -> np.ndarray | None:
        """An idle buffer of ``dtype`` and ``size`` viewed as ``shape``, or None. Buffers are
        kept by dtype and size only: one given back may be a call's rows (``n x size``) or a
        flat copy, whichever asks for it next."""
        buf = self._pop(dtype.str, size)
        if buf is None or buf.shape == shape:
            return buf
        return buf.reshape(shape)

    def _pop(self, dtype: str, size: int) -> np.ndarray | None:
        free = self._free.get((dtype, size))
        try:
            return free.pop() if free else None
        except IndexError:  # emptied meanwhile
            return None

    def give(self, buf: np.ndarray) -> None:
        """``buf`` (from :meth:`take`) is no longer read: keep it for a later copy."""
        key = (buf.dtype.str, buf.size)
        free = self._free.get(key)
        if free is None:
            if buf.nbytes > POOL_IDLE_BYTES:
                return
            while len(self._free) >= POOL_SHAPES:  # a shape not seen for longest goes
                self._free.popitem(last=False)
            free = self._free[key] = deque()
        else:
            self._free.move_to_end(key)
        if (len(free) + 1) * buf.nbytes <= POOL_IDLE_BYTES:
            free.append(buf)


def reduce_snapshots(snaps: list[Snapshot]) -> list[Any]:
    """Every snapshot's :meth:`Snapshot.reduce` (or the exception it raised), snapshots of
    one shape, dtype and mask reduced together (:func:`_reduce_block`): one stacked
    reduction holds the GIL for a few numpy calls where one per array held it for dozens
    (the training thread waits for the GIL meanwhile)."""
    out: list[Any] = [None] * len(snaps)
    groups: dict[tuple, list[int]] = {}
    for i, snap in enumerate(snaps):
        if type(snap) is Snapshot and snap.values.dtype.kind in "biuf":
            key = (snap.values.dtype.str, snap.values.size, id(snap.mask))
            groups.setdefault(key, []).append(i)
        else:
            out[i] = _reduce_one(snap)
    for members in groups.values():
        if len(members) == 1:
            out[members[0]] = _reduce_one(snaps[members[0]])
            continue
        rows = np.stack([snaps[i].values for i in members])
        try:
            states = _reduce_block(rows, snaps[members[0]].mask)
        except Exception:  # each alone, to tell which one fails
            states = [_reduce_one(snaps[i]) for i in members]
        for i, state in zip(members, states, strict=True):
            out[i] = state
    return out


@quiet
def _reduce_block(rows: np.ndarray, mask: np.ndarray | None) -> list[Any]:
    """The exact state of each row of the 2-D ``rows`` where ``mask`` selects: a sum, a
    min and a max per row in one numpy call each. A row whose sum is not finite holds a
    non-finite sample (or overflows) and is reduced alone (:func:`_numpy`), to count them."""
    if mask is not None:
        rows = np.compress(mask if mask.dtype == np.bool_ else mask.astype(bool), rows, axis=1)
    if rows.shape[1] == 0:
        return [NOTHING] * rows.shape[0]
    sums = rows.sum(axis=1, dtype=np.float64).tolist()
    lows, highs = rows.min(axis=1).tolist(), rows.max(axis=1).tolist()
    weight = float(rows.shape[1])
    return [
        finish(total, weight, lows[k], highs[k], 0)
        if math.isfinite(total)  # then every sample of the row is finite
        else _numpy(rows[k], None)
        for k, total in enumerate(sums)
    ]


def _reduce_one(snap: Snapshot) -> Any:
    try:
        return snap.reduce()
    except Exception as exc:  # the caller counts it; the call's other values still go
        return exc


def _host_array(values: Any) -> np.ndarray | None:
    """A flat numpy view of host ``values`` (a numpy array or a CPU tensor), or None for
    anything else (numbers, lists, tensors numpy cannot view or not on the CPU). Flat
    already: the view itself (no reshape: in ``log()`` every numpy call counts)."""
    if isinstance(values, np.ndarray):
        if values.dtype.kind not in "biuf":
            return None
        return values if values.ndim == 1 else values.reshape(-1)
    torch = _torch()
    if torch is None or not isinstance(values, torch.Tensor):
        return None
    if not values.is_cpu or values.layout is not torch.strided:
        return None
    view = _numpy_view(values)
    if view is None or view.ndim == 1:
        return view
    return view.reshape(-1)


def snapshot_value(
    value: Any,
    masks: dict[int, np.ndarray] | None = None,
    room: float = math.inf,
    *,
    buffers: Buffers | None = None,
    cls: type[Snapshot] = Snapshot,
    least: int = COPY_MIN,
    now: Callable[[Any], Any] | None = None,
) -> Any:
    """In ``log()``: a :class:`Snapshot` (``cls``) of host samples of at least ``least``
    elements whose copies fit in ``room`` bytes; anything else reduced now (by ``now``,
    default :func:`reduce_value`). ``masks`` holds the masks this call copied already, by
    ``id`` (a response mask shared by every per-token tensor is copied once); copies go
    into ``buffers``' arrays when given (the sender gives them back). Raises
    :class:`InvalidValue`.

    >>> snap = snapshot_value(np.arange(300.0))
    >>> type(snap).__name__, snap.reduce()[0].weight
    ('Snapshot', 300.0)
    """
    values, mask = (value.values, value.mask) if isinstance(value, Masked) else (value, None)
    arr = None if isinstance(value, (Weighted, Fraction)) else _host_array(values)
    if arr is None or arr.size < least or arr.nbytes > room:
        return (now or reduce_value)(value)
    masks = {} if masks is None else masks
    m = None
    if mask is not None:
        m = masks.get(id(mask))
        if m is None:
            view = _host_array(mask)
            if view is None:  # a list, a GPU mask: read as reduce_value would
                view = np.asarray(
                    mask.detach().cpu().numpy() if _is_tensor(mask) else mask
                ).reshape(-1)
            m = masks[id(mask)] = view.copy() if buffers is None else buffers.take(view)
        if m.size != arr.size:
            raise InvalidValue(f"mask has {m.size} elements but values have {arr.size}")
    return cls(arr.copy() if buffers is None else buffers.take(arr), m)


_NUMPY_DTYPES: dict[Any, np.dtype] = {}
"""The numpy dtype of each torch dtype seen (found by viewing an empty tensor once)."""


def row_key(value: Any) -> tuple | None:
    """What values :func:`snapshot_rows` can copy together share (their mask, type, dtype
    and shape); None for values it never copies."""
    arr, mask = (value.values, value.mask) if type(value) is Masked else (value, None)
    if type(arr) is np.ndarray:
        return (id(mask), np.ndarray, arr.dtype, arr.shape)
    torch = sys.modules.get("torch")  # _is_tensor, inlined: once per tensor of every call
    if torch is not None and isinstance(arr, torch.Tensor):
        return (id(mask), type(arr), arr.dtype, arr.shape, arr.is_cpu)  # only CPU rows go
    return None


def alike(values: list[Any]) -> bool:
    """Whether ``values`` all share one :func:`row_key` (not None): the common call, whose
    per-token tensors share a mask, a dtype and a shape. Checked in one loop of attribute
    reads, without building a key per value."""
    first = values[0]
    if row_key(first) is None:
        return False
    masked = type(first) is Masked
    mask = first.mask if masked else None
    head = first.values if masked else first
    kind, dtype, shape = type(head), head.dtype, head.shape
    cpu = kind is np.ndarray or head.is_cpu
    for value in values:
        if masked:
            if type(value) is not Masked or value.mask is not mask:
                return False
            value = value.values
        if type(value) is not kind or value.dtype != dtype or value.shape != shape:
            return False
        if kind is not np.ndarray and value.is_cpu is not cpu:
            return False
    return True


def snapshot_rows(
    names: list[str],
    values: list[Any],
    masks: dict[int, np.ndarray],
    room: float,
    buffers: Buffers | None = None,
    least: int = COPY_MIN,
) -> Rows | None:
    """In ``log()``: the :class:`Rows` of ``values`` (those of ``names``), which share one
    :func:`row_key`, copied in one call into one array (a call's per-token tensors: one
    ``torch.stack``, about 1 µs a tensor, where :func:`snapshot_value` pays 6-8 µs of
    Python for each). None unless they are host arrays of a dtype numpy holds, of at least
    ``least`` samples each, whose copies fit in ``room`` bytes, with a mask of their size
    if any: then copy them one by one (:func:`snapshot_value`, which also names what is
    wrong with a value)."""
    first = values[0]
    mask = first.mask if type(first) is Masked else None
    head = first.values if mask is not None else first
    torch = None
    if type(head) is np.ndarray:
        dtype = head.dtype
    elif head.is_cpu and head.dim() > 0 and head.layout is _torch().strided:
        dtype = _NUMPY_DTYPES.get(head.dtype)
        if dtype is None:
            view = _numpy_view(head[:0])
            if view is None:  # bfloat16 and the like: one by one
                return None
            dtype = _NUMPY_DTYPES[head.dtype] = view.dtype
        torch = _torch()
    else:
        return None
    n, size = len(values), math.prod(head.shape)
    if dtype.kind not in "biuf" or size < least or n * size * dtype.itemsize > room:
        return None
    m = None
    if mask is not None:
        m = masks.get(id(mask))
        if m is None:
            view = _host_array(mask)
            if view is None:
                return None
            m = masks[id(mask)] = view.copy() if buffers is None else buffers.take(view)
        if m.size != size:
            return None
    arrays = [v.values for v in values] if mask is not None else values
    if torch is None:
        rows = np.empty((n, size), dtype) if buffers is None else buffers.empty(dtype, (n, size))
        np.stack(arrays, out=rows.reshape((n, *head.shape)))
    else:
        if buffers is None:
            rows = np.empty((n, size), dtype)
            out = torch.from_numpy(rows).view(n, *head.shape)
        else:
            rows, out = buffers.tensor_rows(torch, dtype, head, n)
        try:
            torch.stack(arrays, out=out)
        except RuntimeError:  # a tensor that requires grad (no_grad costs every call µs)
            with torch.no_grad():
                torch.stack(arrays, out=out)
    return Rows(names, rows, m)


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
        return (EMPTY, nonfinite)
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
        if mask.numel() != values.numel():
            raise InvalidValue(f"mask has {mask.numel()} elements but values have {values.numel()}")
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
