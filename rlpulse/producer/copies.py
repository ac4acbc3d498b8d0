"""Copy now, reduce later: host arrays ``log()`` copies and the sender thread reduces.

Host arrays (numpy arrays, CPU tensors, ``Masked`` of them) of at least :data:`COPY_MIN`
elements are copied in the caller (:func:`snapshot_value`, a few µs, a :class:`Snapshot`) and
reduced by the sender thread (:func:`reduce_copies`, tens of µs for a few thousand samples):
the training thread pays for a copy, not for the reduction, and may change its arrays right
after ``log()``. A call's alike arrays (per-token tensors sharing a response mask) are copied
together, in one call into one array (:func:`snapshot_rows`, a :class:`Rows`), and reduced
together. Smaller ones, and any beyond the producer's ``snapshot_limit_bytes`` of copies not
yet reduced, are reduced at once (``rlpulse.producer.reduce``). The copies' arrays come from,
and go back to, a pool (:class:`Buffers`). The reductions themselves are
``rlpulse.producer.reduce``'s; imports point one way, ``copies`` -> ``reduce``.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from rlpulse.producer.buffers import Buffers
from rlpulse.producer.reduce import (
    NOTHING,
    Failed,
    Reduced,
    _is_tensor,
    _numpy,
    _numpy_view,
    _torch,
    check_mask,
    finish,
    quiet,
    reduce_value,
    shape_of,
)
from rlpulse.producer.values import Fraction, Masked, Weighted

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

    def reduce(self) -> Reduced:
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

    def reduce(self) -> Sequence[Reduced | Failed]:
        """The exact state of each row, in ``names`` order (a :class:`Failed` in place of
        the state of a row that could not be reduced)."""
        try:
            return _reduce_block(self.values, self.mask)
        except Exception as exc:  # the caller counts it per name; the call's others still go
            return [Failed(repr(exc))] * len(self.names)


def reduce_snapshots(snaps: list[Snapshot]) -> list[Reduced | Failed]:
    """Every snapshot's :meth:`Snapshot.reduce` (or why it failed), snapshots of
    one shape, dtype and mask reduced together (:func:`_reduce_block`): one stacked
    reduction holds the GIL for a few numpy calls where one per array held it for dozens
    (the training thread waits for the GIL meanwhile)."""
    out: list[Reduced | Failed] = [NOTHING] * len(snaps)
    groups: dict[tuple[str, int, int], list[int]] = {}
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
        states: list[Reduced] | list[Reduced | Failed]
        try:
            states = _reduce_block(rows, snaps[members[0]].mask)
        except Exception:  # each alone, to tell which one fails
            states = [_reduce_one(snaps[i]) for i in members]
        for i, state in zip(members, states, strict=True):
            out[i] = state
    return out


@quiet
def _reduce_block(rows: np.ndarray, mask: np.ndarray | None) -> list[Reduced]:
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


def _reduce_one(snap: Snapshot) -> Reduced | Failed:
    try:
        return snap.reduce()
    except Exception as exc:  # the caller counts it; the call's other values still go
        return Failed(repr(exc))


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
        check_mask(values.shape, shape_of(mask))  # before both are copied flat
        m = masks.get(id(mask))
        if m is None:
            view = _host_array(mask)
            if view is None:  # a list, a GPU mask: read as reduce_value would
                view = np.asarray(
                    mask.detach().cpu().numpy() if _is_tensor(mask) else mask
                ).reshape(-1)
            m = masks[id(mask)] = view.copy() if buffers is None else buffers.take(view)
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
    ``least`` samples each, whose copies fit in ``room`` bytes, with a mask of their shape
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
        if getattr(mask, "shape", None) != head.shape:  # one by one: each says what is wrong
            return None
        m = masks.get(id(mask))
        if m is None:
            view = _host_array(mask)
            if view is None:
                return None
            m = masks[id(mask)] = view.copy() if buffers is None else buffers.take(view)
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


def reduce_copies(payload: dict[Any, Any], buffers: Buffers | None) -> list[tuple[str, Failed]]:
    """In the sender thread: reduce (and sketch) the host samples ``log()`` copied into
    ``payload`` (:class:`Snapshot` and :class:`Rows`), put each :class:`Reduced` in its
    place, and give the copies' arrays back to ``buffers``. The copies that cannot be
    reduced are returned, by name (the caller counts them and drops them from the payload):
    the call's other values still go."""
    failures: list[tuple[str, Failed]] = []
    names: list[str] = []
    snaps: list[Snapshot] = []
    blocks: dict[int, Rows] = {}  # one object under each of its names: reduced once
    for name, value in payload.items():
        if type(value) is Rows:
            blocks[id(value)] = value
        elif isinstance(value, Snapshot):
            names.append(name)
            snaps.append(value)
    for name, result in zip(names, reduce_snapshots(snaps), strict=True):
        if type(result) is Failed:
            failures.append((name, result))
        else:
            payload[name] = result
    for rows in blocks.values():
        for name, result in zip(rows.names, rows.reduce(), strict=True):
            if type(result) is Failed:
                failures.append((name, result))
            else:
                payload[name] = result
    if buffers is not None:
        copies: list[Snapshot | Rows] = [*snaps, *blocks.values()]
        masks: dict[int, np.ndarray] = {}  # a call's mask is shared by its copies: given once
        for copy in copies:
            buffers.give(copy.values)
            if copy.mask is not None:
                masks[id(copy.mask)] = copy.mask
        for mask in masks.values():
            buffers.give(mask)
    return failures
