"""Distributions: a relative-error quantile sketch whose merge is exact.

A quantile cannot be merged (the p99 of two ranks is not a function of their p99s); counts of
samples in buckets fixed in advance can. This is DDSketch (Masson, Rim and Lee, VLDB 2019)
with its buckets fixed once for every producer and collector:

* a sample ``x`` with ``|x|`` in ``(GAMMA**(k-1), GAMMA**k]`` falls in key ``k`` of the store of
  its sign, ``GAMMA = (1 + ALPHA) / (1 - ALPHA)``; ``|x| <= TINY`` falls in the zero bucket;
* keys are bounded to ``[KEY_MIN, KEY_MAX]`` (``|x|`` from about 1e-9 to 1e12; larger ones are
  counted in ``KEY_MAX``), so a sketch is a vector of :data:`SLOTS` counts, the *slots*, ordered
  by value: the negative keys from the largest magnitude down, the zero bucket, then the
  positive keys upwards;
* merging adds the vectors, elementwise. Counts are integers, so merging any split of the
  samples, in any order and any tree of relays, gives exactly the sketch of their union.

The ``q`` quantile of ``n`` samples is the sample of rank ``ceil(q * n)`` (1-based, ascending):
the smallest sample with at least ``q * n`` samples at or below it, numpy's
``method="inverted_cdf"``. The sketch finds that sample's slot exactly and reports the slot's
representative value ``2 * GAMMA**k / (GAMMA + 1)`` (signed), which is within ``ALPHA``
relative error of every ``x`` in the slot; the collector then clamps it to the exact observed
min and max, which only moves it closer. So for ``TINY < |x| <= GAMMA**KEY_MAX``:
``|estimate - true| <= ALPHA * |true|`` (plus float rounding, a few ulps); below ``TINY`` the
estimate is 0, an absolute error of at most ``TINY``.

On the wire a sketch is its non-zero slots (:func:`encode`), a few kilobytes at most.

>>> c = counts_of(np.array([1.0, 2.0, 3.0, 4.0]))
>>> int(c.sum()), round(quantile(c, 0.5), 3)   # rank 2 of 4: the sample 2.0
(4, 1.994)
>>> merged = decode(encode(counts_of(np.array([1.0, 2.0])))) + counts_of(np.array([3.0, 4.0]))
>>> bool((merged == c).all())
True
"""

from __future__ import annotations

import math
import struct
from fractions import Fraction
from typing import Any

import numpy as np

from rlpulse.schemas.catalog import Entry
from rlpulse.schemas.errors import SchemaError
from rlpulse.schemas.reductions import QUANTILE_STATS, Reduction, Stat

ALPHA = 0.01
"""Relative accuracy of every quantile (see the module docstring)."""
GAMMA = (1 + ALPHA) / (1 - ALPHA)
LN_GAMMA = math.log(GAMMA)
KEY_MIN = -1036
"""Smallest key: ``GAMMA**(KEY_MIN - 1)`` is :data:`TINY`, about 1e-9."""
KEY_MAX = 1382
"""Largest key: ``GAMMA**KEY_MAX`` is about 1e12; larger magnitudes are counted here."""
TINY = GAMMA ** (KEY_MIN - 1)
"""Magnitudes at or below this are counted in the zero bucket (reported as 0)."""
KEYS = KEY_MAX - KEY_MIN + 1
SLOTS = 2 * KEYS + 1
"""Counts per sketch: the negative keys, the zero bucket, the positive keys."""
ZERO_SLOT = KEYS
QUANTILES: tuple[float, ...] = (0.5, 0.9, 0.99)
"""The quantiles a distribution metric reports (``{name}/p50``, ``/p90``, ``/p99``)."""
VERSION = 1
_HEADER = struct.Struct("<BBH")  # version, bytes per count (4 or 8), non-zero slots


def slots_of(x: np.ndarray) -> np.ndarray:
    """The slot of each sample (finite float64 samples; a NaN must not be passed).

    >>> slots_of(np.array([-1.0, 0.0, 1e-12, 1.0])).tolist() == [
    ...     ZERO_SLOT - (1 - KEY_MIN), ZERO_SLOT, ZERO_SLOT, ZERO_SLOT + (1 - KEY_MIN)]
    True
    """
    with np.errstate(divide="ignore"):
        k = np.ceil(np.log(np.abs(x)) / LN_GAMMA)
    # distance from the zero bucket: 0 for |x| <= TINY (log 0 = -inf included)
    d = np.clip(k, KEY_MIN - 1, KEY_MAX) - (KEY_MIN - 1)
    return (ZERO_SLOT + np.copysign(d, x)).astype(np.intp)


def counts_of(x: np.ndarray) -> np.ndarray:
    """The sketch (:data:`SLOTS` int64 counts) of the finite samples ``x`` (float64)."""
    return np.bincount(slots_of(x), minlength=SLOTS).astype(np.int64, copy=False)


def torch_counts(torch: Any, v: Any, valid: Any) -> Any:
    """The sketch of ``v`` where ``valid``, as float64 counts on ``v``'s device (exact to
    2**53 samples). Queued kernels only: ``scatter_add_`` over a fixed range, never
    ``bincount`` (which reads the largest key back and so waits for the GPU). The keys are
    computed in float64, as on the host, so a sample lands in the same slot on either."""
    f64 = torch.float64
    x = torch.where(valid, v.to(f64), 0.0)
    k = torch.ceil(torch.log(x.abs()) / LN_GAMMA)
    d = k.clamp(KEY_MIN - 1, KEY_MAX) - (KEY_MIN - 1)
    slots = (ZERO_SLOT + torch.copysign(d, x)).to(torch.int64)
    out = torch.zeros(SLOTS, dtype=f64, device=v.device)
    return out.scatter_add_(0, slots, valid.to(f64))


def representative(slot: int) -> float:
    """The value a slot reports: within ``ALPHA`` relative error of every sample in it.

    >>> representative(ZERO_SLOT), round(representative(ZERO_SLOT + 1 - KEY_MIN), 4)
    (0.0, 0.99)
    """
    d = slot - ZERO_SLOT
    if d == 0:
        return 0.0
    k = abs(d) + KEY_MIN - 1
    return math.copysign(2.0 * GAMMA**k / (GAMMA + 1.0), d)


def rank(q: float, n: int) -> int:
    """The 1-based rank of the ``q`` quantile of ``n`` samples, ``ceil(q * n)`` computed
    exactly (``0.9 * 10`` is 9, not the float 9.000000000000002), at least 1.

    >>> rank(0.9, 10), rank(0.5, 3), rank(0.99, 1)
    (9, 2, 1)
    """
    f = Fraction(q).limit_denominator(1_000_000)
    return max(1, -(-f.numerator * n // f.denominator))


def quantile(
    counts: np.ndarray, q: float, *, low: float | None = None, high: float | None = None
) -> float | None:
    """The ``q`` quantile (``0 < q < 1``) of a sketch; None when it holds no sample.

    ``low`` and ``high``, the exact min and max when known, clamp the estimate.

    >>> quantile(counts_of(np.array([5.0, 7.0])), 0.99, high=7.0)
    7.0
    """
    if not 0.0 < q < 1.0:
        raise ValueError(f"quantile must be strictly between 0 and 1, got {q!r}")
    cumulative = np.cumsum(counts)
    n = int(cumulative[-1])
    if n <= 0:
        return None
    slot = int(np.searchsorted(cumulative, rank(q, n), side="left"))
    value = representative(slot)
    if low is not None and not math.isnan(low):
        value = max(value, low)
    if high is not None and not math.isnan(high):
        value = min(value, high)
    return value


def encode(counts: np.ndarray) -> bytes:
    """A sketch's wire form: its non-zero slots (``uint16``) and their counts (``uint32``,
    or ``uint64`` when one is larger), little-endian, after a 4-byte header."""
    nz = np.flatnonzero(counts)
    values = np.asarray(counts)[nz]
    wide = bool(len(values)) and int(values.max()) > 0xFFFFFFFF
    dtype = "<u8" if wide else "<u4"
    return (
        _HEADER.pack(VERSION, 8 if wide else 4, len(nz))
        + nz.astype("<u2").tobytes()
        + values.astype(dtype).tobytes()
    )


def decode(buf: bytes) -> np.ndarray:
    """The :data:`SLOTS` int64 counts of an :func:`encode`-d sketch; raise
    :class:`SchemaError` (``bad_sketch``) if it is not one."""
    if len(buf) < _HEADER.size:
        raise SchemaError("bad_sketch", f"a sketch of {len(buf)} bytes has no header")
    version, width, n = _HEADER.unpack_from(buf)
    if version != VERSION or width not in (4, 8) or len(buf) != _HEADER.size + n * (2 + width):
        raise SchemaError(
            "bad_sketch", f"not a version-{VERSION} sketch (version {version}, {len(buf)} bytes)"
        )
    at = _HEADER.size
    slots = np.frombuffer(buf, dtype="<u2", count=n, offset=at)
    counts = np.frombuffer(buf, dtype="<u8" if width == 8 else "<u4", count=n, offset=at + 2 * n)
    if n and (int(slots[-1]) >= SLOTS or (np.diff(slots.astype(np.int64)) <= 0).any()):
        raise SchemaError("bad_sketch", "sketch slots must increase and be below SLOTS")
    if int(counts.max(initial=1)) > 2**62 or (n and int(counts.min()) == 0):
        raise SchemaError("bad_sketch", "sketch counts must be positive and below 2**62")
    out = np.zeros(SLOTS, dtype=np.int64)
    out[slots] = counts
    return out


def bucket_bounds(counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The non-empty slots as ``(upper_bounds, counts)``, ascending: a slot's upper bound is
    the largest value it holds (``GAMMA**k`` for positive keys, ``-GAMMA**(k-1)`` for
    negative ones, 0 for the zero bucket, taken as holding exactly 0). For histograms
    (TensorBoard, Prometheus)."""
    nz = np.flatnonzero(counts)
    d = nz - ZERO_SLOT
    k = np.abs(d) + KEY_MIN - 1
    upper = np.where(d > 0, GAMMA ** k.astype(np.float64), -(GAMMA ** (k - 1.0)))
    upper[d == 0] = 0.0
    return upper, np.asarray(counts)[nz]


def distribution(name: str, unit: str, help: str) -> Entry:
    """A catalog entry for a distribution: ``{name}/mean``, ``/max`` and ``/min`` exact, and
    ``/p50``, ``/p90``, ``/p99`` from the merged sketch, with the error bound in its help.

    >>> sorted(distribution("a/b", "1", "x").output_names().values())
    ['a/b/max', 'a/b/mean', 'a/b/min', 'a/b/p50', 'a/b/p90', 'a/b/p99']
    """
    return Entry(
        name,
        Reduction.DIST,
        unit,
        f"{help} Mean, max and min pooled exactly over every sample; p50, p90 and p99 read "
        f"off a quantile sketch merged exactly across ranks and relays, within {ALPHA:.0%} "
        f"relative error of the true sample quantile (numpy's inverted_cdf) for magnitudes "
        f"above {TINY:.1e} (smaller ones read as 0).",
        outputs=(Stat.MEAN, Stat.MAX, Stat.MIN, *QUANTILE_STATS),
    )


def coarse_buckets(counts: np.ndarray, every: int = 10) -> tuple[np.ndarray, np.ndarray]:
    """:func:`bucket_bounds` with ``every`` neighbouring keys of a sign pooled into one bucket
    (``GAMMA**10``: buckets 22% wide, about as TensorBoard draws its own): at most a few
    hundred buckets whatever the sketch holds.

    >>> upper, n = coarse_buckets(counts_of(np.array([1.0, 1.01, 1.02, 5.0])))
    >>> n.tolist()
    [3, 1]
    """
    nz = np.flatnonzero(counts)
    if not len(nz):
        return np.zeros(0), np.zeros(0, dtype=np.int64)
    d = nz - ZERO_SLOT
    group = np.sign(d) * ((np.abs(d) + every - 1) // every)
    upper, n = bucket_bounds(counts)
    starts = np.flatnonzero(np.concatenate([[True], np.diff(group) != 0]))
    ends = np.concatenate([starts[1:], [len(group)]]) - 1
    return upper[ends], np.add.reduceat(n, starts)
