"""Distribution metrics on the producer: the state and the quantile sketch of host values.

A name the catalog declares ``dist`` (``rlpulse.schemas.sketch``) is logged like any other (a
tensor, a numpy array, ``Masked(x, mask)``, a number); ``log()`` then reduces it here instead
of in ``rlpulse.producer.reduce``: the same exact :class:`~rlpulse.producer.reduce.Reduced`,
with the encoded sketch of the finite samples in its ``sketch``. GPU tensors go to
``rlpulse.producer.device`` as every GPU value does, which sketches them on its side stream.

>>> state, nonfinite, sketch = sketch_value(np.array([1.0, 2.0, np.nan]))
>>> state.weight, nonfinite, int(decode(sketch).sum())
(2.0, 1, 2)
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import numpy as np

from rlpulse.producer.buffers import Buffers
from rlpulse.producer.copies import Snapshot, snapshot_value as snapshot
from rlpulse.producer.reduce import (
    InvalidValue,
    Reduced,
    _is_tensor,
    _numpy,
    _numpy_view,
    reduce_value,
    selected,
)
from rlpulse.producer.values import Fraction, Masked, Weighted
from rlpulse.schemas.catalog import Catalog
from rlpulse.schemas.reductions import Reduction
from rlpulse.schemas.sketch import counts_of, decode, encode


def dist_names(catalog: Catalog) -> frozenset[str]:
    """The catalog's distribution entries: the names ``log()`` sketches."""
    return frozenset(n for n, e in catalog.entries.items() if e.reduction is Reduction.DIST)


def _samples(values: Any, mask: Any | None) -> np.ndarray:
    """The selected samples as a flat numpy array (finite or not)."""
    if _is_tensor(values):
        view = _numpy_view(values.detach().cpu())
        values = view if view is not None else values.detach().cpu().double().numpy()
    if _is_tensor(mask):
        mask = mask.detach().cpu().numpy()
    return selected(values, mask)


class Samples(Snapshot):
    """A distribution value's samples, copied in ``log()`` and sketched later, by the
    sender thread (:meth:`reduce`): sketching costs about 60 µs per 1,000 samples on a CPU,
    too much for the training thread; a copy costs a few. The caller may change its arrays
    right after ``log()``: the copy is what is sketched."""

    __slots__ = ()

    def reduce(self) -> Reduced:
        """The exact state and the encoded sketch of the finite selected samples."""
        return _sketched(selected(self.values, self.mask))


def sketch_now(value: Any) -> Reduced:
    """Reduce and sketch one value of a distribution metric at once: ``Weighted`` and
    ``Fraction`` (no samples to sketch: they pool into the mean only) reduced; samples (a
    number, a list, an array, a tensor, ``Masked``) sketched. Raises :class:`InvalidValue`."""
    if isinstance(value, (Weighted, Fraction)):
        return reduce_value(value)
    values, mask = (value.values, value.mask) if isinstance(value, Masked) else (value, None)
    if isinstance(values, (str, bytes, dict)) or values is None:
        raise InvalidValue(f"cannot log a {type(values).__name__} as a metric")
    return _sketched(_samples(values, mask))


def snapshot_value(
    value: Any,
    masks: dict[int, np.ndarray] | None = None,
    room: float = math.inf,
    buffers: Buffers | None = None,
) -> Reduced | Samples:
    """In ``log()``: host samples copied (:class:`Samples`, sketched by the sender thread)
    when their copies fit in ``room`` bytes; anything else (``Weighted``, ``Fraction``, lists,
    tensors numpy cannot view) reduced and sketched now (:func:`sketch_now`). Raises
    :class:`InvalidValue`."""
    return snapshot(value, masks, room, buffers=buffers, cls=Samples, least=1, now=sketch_now)


def sketch_value(value: Any) -> Reduced:
    """Reduce one value of a distribution metric now (:func:`snapshot_value`, then
    :meth:`Samples.reduce`)."""
    snap = snapshot_value(value)
    return snap.reduce() if isinstance(snap, Samples) else snap


def _sketched(arr: np.ndarray) -> Reduced:
    reduced = _numpy(arr, None)
    if reduced.state.weight <= 0:
        return reduced
    x = arr.astype(np.float64, copy=False)
    if reduced.nonfinite:
        x = x[np.isfinite(x)]
    return Reduced(reduced.state, reduced.nonfinite, encode(counts_of(x)))


def merged(sketches: Iterable[bytes]) -> np.ndarray:
    """The counts of several encoded sketches added up (tests, tools)."""
    out = None
    for buf in sketches:
        counts = decode(buf)
        out = counts if out is None else out + counts
    if out is None:
        raise ValueError("no sketches to merge")
    return out
