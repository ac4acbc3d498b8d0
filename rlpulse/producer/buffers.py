"""The pool of arrays the host copies go into (:class:`Buffers`): ``log()`` takes one for each
copy it makes (``rlpulse.producer.copies``), the sender thread gives it back once the copy is
reduced."""

from __future__ import annotations

from collections import OrderedDict, deque
from typing import Any

import numpy as np

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
        out: Any = None if buf is None else buf.base
        if buf is None or type(out) is not torch.Tensor or out.dtype is not like.dtype:
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
