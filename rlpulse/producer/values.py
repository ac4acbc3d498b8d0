"""Value wrappers a caller passes to ``Producer.log`` when a bare number would pool wrongly."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True)
class Masked:
    """Only the elements of ``values`` where ``mask`` is true are samples (token masks).

    >>> Masked([1.0, 2.0, 9.0], [1, 1, 0])  # two samples: 1.0 and 2.0
    Masked(values=[1.0, 2.0, 9.0], mask=[1, 1, 0])
    """

    values: Any
    mask: Any


@dataclass(frozen=True, slots=True)
class Weighted:
    """A mean this rank already computed, over ``weight`` tokens or samples.

    Ranks pool as sum(value * weight) / sum(weight), so a rank with 7 tokens counts 7/3007 as
    much as one with 3000. Its extremes are unknown, so families report no max/min from it.

    >>> Weighted(0.25, 128)
    Weighted(value=0.25, weight=128)
    """

    value: Any
    weight: Any


@dataclass(frozen=True, slots=True)
class Fraction:
    """``numerator`` of ``denominator`` items had a property (clipped tokens of all tokens).

    >>> Fraction(3, 40)
    Fraction(numerator=3, denominator=40)
    """

    numerator: Any
    denominator: Any


@dataclass(frozen=True, slots=True)
class Samples:
    """Rows behind the numbers (prompt, response, reward, advantage...), one dict per sample
    of strings, numbers, booleans or None. The step keeps, over every rank, the ``k`` rows with
    the largest and the smallest ``key`` and a uniform random ``k`` of all rows
    (``rlpulse.schemas.samples``); ``k`` defaults to the producer's ``samples_k``.

    ``log()`` costs the caller only the copy of ``rows``'s references made here (so rows the
    caller appends to later do not change what was logged; the dicts themselves are read on
    the sender thread, so do not mutate them after logging). Bad rows are dropped there,
    counted and warned about, never raised. ``rows`` that are no sequence of rows (a string,
    a single dict, a number) are not iterated: the value is refused as a whole (``refused``
    says why), counted as invalid and warned about on the sender thread, as is a sequence
    none of whose rows is a mapping.

    >>> Samples([{"prompt": "2+2", "response": "4", "reward": 1.0}], key="reward").key
    'reward'
    >>> Samples("not a list", key="reward").refused
    'got a str'
    """

    rows: tuple[Any, ...]
    key: str
    k: int | None = None
    refused: str = field(default="", repr=False, compare=False)
    """Why ``rows`` is no sequence of rows (then ``rows`` is empty); empty when it is one."""

    def __init__(self, rows: Iterable[Any], key: str, k: int | None = None) -> None:
        kept: tuple[Any, ...] = ()
        refused = ""
        if isinstance(rows, str | bytes | bytearray | Mapping):
            one = " (one row? put it in a list)" if isinstance(rows, Mapping) else ""
            refused = f"got a {type(rows).__name__}{one}"
        else:
            try:
                kept = tuple(rows)
            except TypeError:  # not iterable
                refused = f"got a {type(rows).__name__}"
        object.__setattr__(self, "rows", kept)
        object.__setattr__(self, "key", key)
        object.__setattr__(self, "k", k)
        object.__setattr__(self, "refused", refused)
