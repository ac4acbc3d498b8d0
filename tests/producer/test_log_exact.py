"""Whatever mix of values ``log()`` is given, what reaches the wire is exact.

``log()`` takes many paths to the same states: Python numbers pass through, small arrays are
reduced at once, larger ones are copied (alike per-token tensors stacked into one pooled
array, the rest one by one) and reduced by the sender, bfloat16 and float16 tensors go
through torch, a full copy budget makes ``log()`` reduce at once, pooled buffers come back
in other shapes. This property test draws calls of every kind, in any order, changes every
array, tensor and mask right after each ``log()`` (read-only ones cannot be), and holds the
sender back meanwhile, with warnings turned into errors as many training programs run them;
the states received must equal a float64 reduction of the values as they were when logged,
with non-finite samples counted apart, and nothing may be counted as an error.
"""

from __future__ import annotations

import math
import threading
import warnings
from dataclasses import dataclass
from typing import Any
from unittest import mock

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st

from rlpulse.producer import Masked, Producer
from rlpulse.producer.config import ProducerConfig
from rlpulse.producer.copies import COPY_MIN
from rlpulse.producer.sender import Sender
from tests.producer.conftest import Inbox, entries, has_bye

SIZES = (0, 1, 7, COPY_MIN - 1, COPY_MIN, 300, 2 * COPY_MIN, 600, 1024)
"""Below, at and above the size from which ``log()`` copies rather than reduces at once; a
call's rows of one size and a later copy of two or four times it share pooled buffers."""
TOKENS = (COPY_MIN, 300, 1024)
"""Sizes of per-token calls (one mask for many names)."""
NUMPY_DTYPES = ("float64", "float32", "float16", "int64", "int32", "bool")
TORCH_DTYPES = (
    torch.float32,
    torch.float64,
    torch.bfloat16,
    torch.float16,
    torch.int64,
    torch.bool,
)
ODD = (math.nan, math.inf, -math.inf)


@dataclass
class Drawn:
    """One value for ``log()`` and the samples it stands for, taken before the call."""

    value: Any
    samples: np.ndarray
    """float64, every sample the value selects (finite or not)."""
    arrays: list[Any]
    """The caller's arrays, tensors and masks, changed right after ``log()``."""


@st.composite
def samples(draw: st.DrawFn, size: int, dtype: str) -> np.ndarray:
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    if dtype == "bool":
        return rng.random(size) < 0.4
    if dtype.startswith("int"):
        return rng.integers(-1000, 1000, size).astype(dtype)
    arr = (rng.normal(0, 50, size) + draw(st.sampled_from([0.0, 1e3, -7.5]))).astype(dtype)
    if size and draw(st.booleans()):  # a few non-finite samples
        for i in draw(st.lists(st.integers(0, size - 1), max_size=3)):
            arr[i] = draw(st.sampled_from(ODD))
    return arr


@dataclass(frozen=True)
class Tokens:
    """A per-token call's mask: one object under every masked name, as a trainer passes its
    response mask, and the rows its values come in."""

    logged: Any
    selects: np.ndarray
    rows: int


@st.composite
def array_value(draw: st.DrawFn, tokens: Tokens | None, like: tuple[bool, int] | None) -> Drawn:
    """A numpy array or torch tensor, plain or masked (by its own mask or the call's); of the
    call's kind and dtype ``like`` when it has one."""
    size = tokens.selects.size if tokens is not None else draw(st.sampled_from(SIZES))
    if like is not None and draw(st.integers(0, 3)):
        as_torch, dtype = like
    else:
        as_torch = draw(st.booleans())
        dtype = draw(st.sampled_from(range(len(NUMPY_DTYPES))))
    arr = draw(samples(size, "float32" if as_torch and dtype == 2 else NUMPY_DTYPES[dtype]))
    if as_torch:
        value = torch.from_numpy(arr.copy()).to(TORCH_DTYPES[dtype])
        seen = value.to(torch.float64).numpy().copy()  # what bfloat16 and float16 hold
    else:
        value = arr.copy()
        seen = arr.astype(np.float64)
    if tokens is not None:
        value = value.reshape(tokens.rows, -1)
        if draw(st.integers(0, 3)):
            return Drawn(Masked(value, tokens.logged), seen[tokens.selects], [value])
        return Drawn(value, seen, [value])
    rows = draw(st.sampled_from([1, 2])) if size % 2 == 0 and size else 1
    value = value.reshape(rows, size // rows)
    changed = [value]
    if not as_torch and draw(st.booleans()):  # np.frombuffer, a memory map: read-only
        value.flags.writeable = False
        changed = []
    if not draw(st.booleans()):
        return Drawn(value, seen, changed)
    mask = draw(samples(size, "bool"))
    held = draw(mask_of(mask)).reshape(value.shape)
    return Drawn(Masked(value, held), seen[mask], changed)


@st.composite
def mask_of(draw: st.DrawFn, mask: np.ndarray) -> Any:
    """``mask`` as the caller holds it: a bool tensor, a numpy array, or a read-only one."""
    kind = draw(st.sampled_from(["torch", "numpy", "read-only"]))
    if kind == "torch":
        return torch.from_numpy(mask.copy())
    held = mask.copy()
    held.flags.writeable = kind == "numpy"
    return held


@st.composite
def one_value(draw: st.DrawFn, tokens: Tokens | None, like: tuple[bool, int] | None) -> Drawn:
    kinds = ["float", "int", "bool", "list", *["array"] * (8 if like else 2)]
    kind = draw(st.sampled_from(kinds))
    if kind == "float":
        x = draw(st.one_of(st.floats(-1e6, 1e6), st.sampled_from(ODD)))
        return Drawn(x, np.array([x]), [])
    if kind == "int":
        x = draw(st.integers(-(2**60), 2**60))
        return Drawn(x, np.array([float(x)]), [])
    if kind == "bool":
        x = draw(st.booleans())
        return Drawn(x, np.array([float(x)]), [])
    if kind == "list":
        xs = draw(st.lists(st.floats(-1e6, 1e6), max_size=5))
        return Drawn(list(xs), np.array(xs, dtype=np.float64), [])
    return draw(array_value(tokens, like))


@st.composite
def calls(draw: st.DrawFn) -> list[tuple[int, dict[str, Drawn], bool]]:
    """``(step, values, flush after)`` per call; names repeat across calls and steps."""
    out = []
    for _ in range(draw(st.integers(1, 6))):
        step = draw(st.integers(0, 3))
        tokens = like = None
        if draw(st.booleans()):  # a per-token call: one mask for many names
            selects = draw(samples(draw(st.sampled_from(TOKENS)), "bool"))
            rows = draw(st.sampled_from([1, 2]))
            tokens = Tokens(draw(mask_of(selects)).reshape(rows, -1), selects, rows)
        if draw(st.booleans()):  # most arrays of one kind and dtype, as a trainer's are
            like = (draw(st.booleans()), draw(st.sampled_from(range(len(NUMPY_DTYPES)))))
        names = st.sampled_from([f"m/{i}" for i in range(8)])
        chosen = draw(st.lists(names, unique=True, min_size=2 if like else 0))
        values = {name: draw(one_value(tokens, like)) for name in chosen}
        out.append((step, values, draw(st.booleans())))
    return out


def want_states(drawn: list[tuple[int, dict[str, Drawn], bool]]) -> dict:
    """(step, name) -> [sum, count, min, max, non-finite] over every call's samples."""
    pooled: dict[tuple[int, str], list[np.ndarray]] = {}
    for step, values, _ in drawn:
        for name, d in values.items():
            pooled.setdefault((step, name), []).append(d.samples)
    out = {}
    for key, parts in pooled.items():
        x = np.concatenate(parts)
        finite = x[np.isfinite(x)]
        if finite.size:
            out[key] = [finite.sum(), finite.size, finite.min(), finite.max(), x.size - finite.size]
        else:
            out[key] = [0.0, 0.0, math.nan, math.nan, x.size]
    return out


def got_states(messages: list) -> dict:
    """The same, merged over the entries received."""
    out: dict[tuple[int, str], list[float]] = {}
    for e in entries(messages):
        for name, (s, w, mn, mx) in zip(e.names, e.values.tolist(), strict=True):
            held = out.setdefault((e.step, name), [0.0, 0.0, math.nan, math.nan, 0])
            held[0] += s
            held[1] += w
            if w > 0:
                held[2] = mn if math.isnan(held[2]) else min(held[2], mn)
                held[3] = mx if math.isnan(held[3]) else max(held[3], mx)
        for name, n in e.nonfinite.items():
            out.setdefault((e.step, name), [0.0, 0.0, math.nan, math.nan, 0])[4] += n
    return out


def close(got: list[float], want: list[float], scale: float) -> bool:
    """Equal counts and extremes; sums equal up to float64 rounding of ``scale`` (the sum of
    the magnitudes), as any order of summation gives."""
    same = [
        g == w or (math.isnan(g) and math.isnan(w)) for g, w in zip(got[1:], want[1:], strict=True)
    ]
    return all(same) and abs(got[0] - want[0]) <= 1e-12 * scale + 1e-300


# As many training programs run: a warning of numpy or torch is an exception.
@pytest.mark.filterwarnings("error::RuntimeWarning", "error::UserWarning")
@settings(
    max_examples=120,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(calls(), st.sampled_from([256 << 20, 4096]))
def test_any_mix_of_logged_values_reaches_the_wire_exactly(drawn, copy_limit) -> None:
    """Exact whatever was logged; ``copy_limit`` 4096 bytes makes most copies not fit, so
    ``log()`` reduces them at once instead, and must give the same states."""
    release = threading.Event()
    original = Sender._reduce_copies

    def held(self, payload, copied):
        release.wait(10)
        return original(self, payload, copied)

    inbox = Inbox()
    try:
        with mock.patch.object(Sender, "_reduce_copies", held):
            config = ProducerConfig(gpu_sample_s=0, snapshot_limit_bytes=copy_limit)
            p = Producer(inbox.address, run="r", role="a", config=config)
            for step, values, flush in drawn:
                p.log({name: d.value for name, d in values.items()}, step=step)
                for d in values.values():
                    for arr in d.arrays:  # the caller reuses its buffers at once
                        arr.fill_(7) if isinstance(arr, torch.Tensor) else arr.fill(7)
                    m = d.value.mask if isinstance(d.value, Masked) else None
                    if isinstance(m, torch.Tensor):  # its mask too, shared or not
                        m.fill_(True)
                    elif m is not None and m.flags.writeable:
                        m.fill(True)
                if flush:
                    release.set()
                    p.flush()
                    release.clear()
            release.set()
            p.close()
        got = got_states(inbox.receive(until=has_bye))
    finally:
        inbox.close()
    stats = p.stats()
    assert (stats["errors"], stats["invalid"]) == (0, 0), stats
    want = want_states(drawn)
    scale = {
        key: sum(float(np.abs(d.samples[np.isfinite(d.samples)]).sum()) for d in _of(drawn, key))
        for key in want
    }
    for key, state in want.items():
        empty = state[1] == 0 and state[4] == 0
        if empty and key not in got:
            continue  # nothing selected: no state to send
        assert key in got, key
        assert close(got[key], state, scale[key]), (key, got[key], state)
    assert set(got) <= set(want)


def _of(drawn, key: tuple[int, str]) -> list[Drawn]:
    step, name = key
    return [values[name] for s, values, _ in drawn if s == step and name in values]


@pytest.mark.parametrize("strict", ["warnings", "seterr", "default"])
def test_infinities_of_both_signs_are_counted_whatever_the_numpy_settings(inbox, strict) -> None:
    """+inf and -inf in one array make numpy's float64 sum invalid (inf - inf). Where the
    training program turns warnings into errors, or sets ``np.seterr(all="raise")``, that
    raised inside ``log()`` and the whole call was skipped (an error in ``stats()``); by
    default numpy printed a RuntimeWarning into the training log. Now the non-finite samples
    are counted and the rest is exact, with no warning, in every path: reduced at once in
    ``log()``, copied alone, copied with the call's other per-token rows."""
    rng = np.random.default_rng(3)
    small, alone = rng.normal(0, 1, 16), rng.normal(0, 1, 2 * COPY_MIN)
    rows = {f"row/{i}": rng.normal(i, 1, COPY_MIN) for i in range(3)}
    for arr in (small, alone, rows["row/1"]):
        arr[:3] = (math.inf, -math.inf, math.nan)
    data = {"small": small, "alone": alone, **rows}
    want = {
        name: want_states([(0, {name: Drawn(a, a, [])}, False)])[(0, name)]
        for name, a in data.items()
    }
    with warnings.catch_warnings(record=True) as seen, np.errstate(all="warn"):
        warnings.simplefilter("error" if strict == "warnings" else "always")
        if strict == "seterr":
            np.seterr(all="raise")
        try:
            p = Producer(inbox.address, run="r", role="a", config=ProducerConfig(gpu_sample_s=0))
            p.log(data, step=0)
            p.close()
        finally:
            np.seterr(all="warn")
    assert (p.stats()["errors"], p.stats()["invalid"]) == (0, 0), p.stats()
    assert not [w for w in seen if issubclass(w.category, RuntimeWarning)]
    got = got_states(inbox.receive(until=has_bye))
    for name, state in want.items():
        assert close(got[(0, name)], state, float(np.abs(data[name][3:]).sum())), name


@pytest.mark.filterwarnings("error::UserWarning")
def test_read_only_memory_is_logged_exactly_where_warnings_are_errors(inbox) -> None:
    """A read-only numpy mask (``np.frombuffer``, a memory map) for a bfloat16 tensor goes to
    torch, which warns when handed read-only memory: where warnings are errors, that failed
    the whole ``log()`` call, and by default it printed torch's warning into the training log.
    """
    rng = np.random.default_rng(8)
    mask = rng.random(64) < 0.5
    mask.flags.writeable = False
    half = torch.from_numpy(rng.normal(0, 1, 64)).to(torch.bfloat16)
    frozen = rng.normal(0, 1, 64)
    frozen.flags.writeable = False
    p = Producer(inbox.address, run="r", role="a", config=ProducerConfig(gpu_sample_s=0))
    p.log({"half": Masked(half, mask), "frozen": Masked(frozen, mask), "x": 1.0}, step=0)
    p.close()
    got = got_states(inbox.receive(until=has_bye))
    assert (p.stats()["errors"], p.stats()["invalid"]) == (0, 0), p.stats()
    seen = half.to(torch.float64).numpy()[mask]
    assert close(got[(0, "half")], [seen.sum(), seen.size, seen.min(), seen.max(), 0], 100.0)
    assert got[(0, "frozen")][1] == mask.sum()
