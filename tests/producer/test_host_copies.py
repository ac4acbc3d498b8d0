"""Host arrays of at least ``COPY_MIN`` samples are copied in ``log()`` and reduced by the
sender thread: the caller pays for a copy, the result stays exact, a change to the caller's
arrays right after ``log()`` changes nothing logged, and the copies held are bounded by
``snapshot_limit_bytes`` (beyond it ``log()`` reduces at once, exactly as well)."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

from rlpulse.producer import Masked, Producer
from rlpulse.producer.buffers import POOL_IDLE_BYTES, POOL_SHAPES, Buffers
from rlpulse.producer.config import ProducerConfig
from rlpulse.producer.copies import (
    COPY_MIN,
    Snapshot,
    alike,
    reduce_snapshots,
    row_key,
    snapshot_rows,
    snapshot_value,
)
from rlpulse.producer.reduce import Failed, InvalidValue, reduce_value
from rlpulse.producer.sender import Sender
from rlpulse.schemas import metrics as M
from tests.producer.conftest import entries, has_bye

ADV, LEN = M.CRITIC_ADVANTAGES.name, "bench/tokens"


def exact(values: np.ndarray, mask: np.ndarray | None = None) -> list[float]:
    """sum, weight, min, max of the selected samples, in float64."""
    x = values.astype(np.float64).ravel()
    if mask is not None:
        x = x[mask.ravel()]
    return [float(x.sum()), float(x.size), float(x.min()), float(x.max())]


@pytest.fixture
def held_sender(monkeypatch):
    """The sender reduces nothing until ``release`` is set: what it reduces then is what
    ``log()`` kept, whatever the caller did to its arrays meanwhile."""
    release = threading.Event()
    original = Sender._reduce_copies

    def waiting(self, payload, copied):
        release.wait(10)
        return original(self, payload, copied)

    monkeypatch.setattr(Sender, "_reduce_copies", waiting)
    return release


def test_arrays_are_copied_in_log_and_reduced_by_the_sender_exactly(inbox, held_sender) -> None:
    p = Producer(inbox.address, run="r", role="a", config=ProducerConfig(gpu_sample_s=0))
    rng = np.random.default_rng(3)
    x = rng.normal(0, 1, 4096).astype(np.float32)
    t = torch.from_numpy(rng.normal(0, 1, 4096))
    mask = torch.from_numpy(rng.random(4096) < 0.8)
    want_x, want_t = exact(x), exact(t.numpy(), mask.numpy())
    p.log({ADV: x, LEN: Masked(t, mask)}, step=0)
    x[:] = 1e6  # the caller reuses its buffers at once, before the sender reduces anything
    t.fill_(-1e6)
    mask.fill_(False)
    held_sender.set()
    p.close()
    (entry,) = entries(inbox.receive(until=has_bye))
    got = dict(zip(entry.names, entry.values.tolist(), strict=True))
    assert got[LEN] == pytest.approx(want_t, rel=1e-12)
    # advantages is a distribution: the same exact state, and its sketch (test_sketch.py)
    assert got[ADV] == pytest.approx(want_x, rel=1e-6)
    assert p.stats()["invalid"] == 0


def test_a_shared_mask_is_copied_once_per_call() -> None:
    mask = np.random.default_rng(0).random(1024) < 0.5
    masks: dict[int, np.ndarray] = {}
    a = snapshot_value(Masked(np.ones(1024), mask), masks)
    b = snapshot_value(Masked(np.zeros(1024), mask), masks)
    assert isinstance(a, Snapshot) and isinstance(b, Snapshot)
    assert a.mask is b.mask and not np.shares_memory(a.mask, mask)
    assert a.reduce() == reduce_value(Masked(np.ones(1024), mask))


def test_small_arrays_and_what_does_not_fit_are_reduced_at_once() -> None:
    small = np.arange(COPY_MIN - 1, dtype=np.float64)
    assert snapshot_value(small) == reduce_value(small)
    big = np.arange(COPY_MIN, dtype=np.float64)
    assert isinstance(snapshot_value(big), Snapshot)
    assert snapshot_value(big, room=big.nbytes - 1) == reduce_value(big)
    with pytest.raises(InvalidValue, match=r"mask has shape \(3,\) but values have shape \(256,\)"):
        snapshot_value(Masked(big, np.ones(3, dtype=bool)))


def test_copies_held_are_bounded_and_released(inbox, held_sender) -> None:
    """With room for one array's copy, the next call's array is reduced in the caller; once
    the sender has reduced the copies their bytes are released; every value is exact."""
    x = np.random.default_rng(5).normal(0, 1, 1024)
    config = ProducerConfig(gpu_sample_s=0, snapshot_limit_bytes=x.nbytes)
    p = Producer(inbox.address, run="r", role="a", config=config)
    p.log({LEN: x}, step=0)
    p.log({LEN: x * 2}, step=1)
    assert p._copied == x.nbytes  # the first call's copy; the second reduced in the caller
    assert p._sender.released_bytes == 0  # the held sender has reduced nothing yet
    held_sender.set()
    p.flush()
    assert p._sender.released_bytes == p._copied == x.nbytes
    p.close()
    got = {e.step: e.values[0].tolist() for e in entries(inbox.receive(until=has_bye))}
    assert got[0] == pytest.approx(exact(x)) and got[1] == pytest.approx(exact(x * 2))


def test_a_bad_mask_is_counted_and_the_call_goes_on(inbox) -> None:
    p = Producer(inbox.address, run="r", role="a", config=ProducerConfig(gpu_sample_s=0))
    x = np.ones(512)
    p.log({LEN: Masked(x, np.ones(3, dtype=bool)), "ok": 1.0}, step=0)
    p.close()
    (entry,) = entries(inbox.receive(until=has_bye))
    assert entry.names == ("ok",) and p.stats()["invalid"] == 1


def test_buffers_are_reused_bounded_and_never_handed_out_twice() -> None:
    pool = Buffers()
    x = np.arange(1024, dtype=np.float32)
    a = pool.take(x)
    assert np.array_equal(a, x) and not np.shares_memory(a, x)
    pool.give(a)
    b = pool.take(x * 2)
    assert b is a and np.array_equal(b, x * 2)  # reused, holding the new copy
    c = pool.take(x)
    assert c is not b  # the only idle one was taken: a fresh one
    big = np.zeros(POOL_IDLE_BYTES // 8 + 1)
    pool.give(pool.take(big))
    assert pool.take(big) is not None and len(pool._free.get((big.dtype.str, big.size), ())) == 0


def test_buffers_keep_the_shapes_given_back_most_recently() -> None:
    """Per-token tensors change length from step to step: a shape not given back for
    longest makes room for a new one, so the pool never fills with lengths of the past."""
    pool = Buffers()
    for n in range(1, POOL_SHAPES + 2):  # one shape more than it keeps
        pool.give(pool.take(np.zeros(n, dtype=np.float32)))
    kept = {size for _, size in pool._free}
    assert len(kept) == POOL_SHAPES and 1 not in kept and POOL_SHAPES + 1 in kept
    pool.give(pool.take(np.zeros(2, dtype=np.float32)))  # used again: kept longest now
    pool.give(pool.take(np.zeros(POOL_SHAPES + 2, dtype=np.float32)))
    kept = {size for _, size in pool._free}
    assert 2 in kept and 3 not in kept


def test_torch_rows_come_back_with_their_tensor() -> None:
    """A buffer for a call's tensors is a tensor's memory: given back and taken again for
    tensors of the same dtype and size, the same memory comes with its tensor (viewed as the
    rows need), what is copied into the tensor is what the sender reads, and a buffer that is
    no tensor's is replaced by one that is."""
    pool = Buffers()
    f32 = np.dtype(np.float32)
    rows, out = pool.tensor_rows(torch, f32, torch.zeros(300), 4)
    assert rows.shape == (4, 300) and tuple(out.shape) == (4, 300)
    torch.stack([torch.full((300,), float(i)) for i in range(4)], out=out)
    assert rows[:, 7].tolist() == [0.0, 1.0, 2.0, 3.0]
    pool.give(rows)
    again, out2 = pool.tensor_rows(torch, f32, torch.zeros(300), 4)
    assert again is rows and out2.data_ptr() == out.data_ptr()
    pool.give(again)
    flat, grid = pool.tensor_rows(torch, f32, torch.zeros(2, 600), 1)  # same size, other rows
    assert flat.shape == (1, 1200) and tuple(grid.shape) == (1, 2, 600)
    assert np.shares_memory(flat, rows)
    grid[0, 1, 0] = 5.0
    assert flat[0, 600] == 5.0
    pool.give(np.zeros(1200, np.float32))  # no tensor's memory
    fresh, out4 = pool.tensor_rows(torch, f32, torch.zeros(1200), 1)
    out4.fill_(2.0)
    assert fresh.shape == (1, 1200) and float(fresh.sum()) == 2400.0


def test_the_sender_gives_a_shared_mask_back_once(inbox) -> None:
    """20 values sharing one mask: the mask's buffer goes back to the pool once, so two
    later calls never copy into the same array."""
    p = Producer(inbox.address, run="r", role="a", config=ProducerConfig(gpu_sample_s=0))
    mask = np.random.default_rng(1).random(512) < 0.5
    values = [np.random.default_rng(i).normal(0, 1, 512) for i in range(20)]
    for step in range(3):
        p.log({f"v/{i}": Masked(v + step, mask) for i, v in enumerate(values)}, step=step)
        p.flush()
    free = p._buffers._free[(mask.dtype.str, mask.size)]
    assert len({id(b) for b in free}) == len(free) == 1
    p.close()
    got = {
        (e.step, n): row
        for e in entries(inbox.receive(until=has_bye))
        for n, row in zip(e.names, e.values.tolist(), strict=True)
    }
    for step in range(3):
        for i, v in enumerate(values):
            assert got[(step, f"v/{i}")] == pytest.approx(exact(v + step, mask))


def test_snapshots_sharing_a_mask_reduce_together_as_they_would_alone() -> None:
    rng = np.random.default_rng(7)
    mask = rng.random(700) < 0.7
    arrays = [rng.normal(0, 1, 700).astype(np.float32) for _ in range(5)]
    arrays[2][3] = np.nan  # counted one by one: only selected non-finite samples count
    arrays[3][~mask] = np.inf  # not selected: no effect
    ints = rng.integers(-5, 5, 700)
    masks: dict[int, np.ndarray] = {}
    snaps = [snapshot_value(Masked(a, mask), masks) for a in arrays]
    snaps += [snapshot_value(Masked(ints, mask), masks), snapshot_value(arrays[0])]
    snaps.append(snapshot_value(Masked(arrays[1], np.zeros(700, dtype=bool)), {}))
    snaps.append(snapshot_value(Masked(arrays[4], np.zeros(700, dtype=bool)), masks | {}))
    together = reduce_snapshots(snaps)
    alone = [s.reduce() for s in snaps]
    for got, want in zip(together, alone, strict=True):
        assert got[1] == want[1]  # non-finite counts
        assert got[0] == pytest.approx(want[0], rel=1e-12, abs=0.0, nan_ok=True)
    assert together[2][1] == int(mask[3]) and together[3][1] == 0


def test_a_bad_snapshot_is_returned_as_its_error() -> None:
    snap = Snapshot(np.ones(300), None)
    snap.values = np.array(["x"] * 300)  # unreadable: as a corrupted copy would be
    (result,) = reduce_snapshots([snap])
    assert isinstance(result, Failed) and result.reason  # why, in words; not an exception


def test_per_token_tensors_are_copied_together_and_reduced_as_alone(inbox, held_sender) -> None:
    """A call's tensors of one mask, dtype and shape are copied in one ``torch.stack`` into
    one array; the sender reduces that array as it is. Exact, per name, whatever the caller
    does to its tensors after ``log()``; a non-finite row is counted; an odd one out (another
    shape, a bfloat16 tensor, a bad mask) goes one by one."""
    rng = np.random.default_rng(11)
    mask = torch.from_numpy(rng.random((4, 128)) < 0.7)
    mask_before = mask.numpy().copy()
    alike = {f"t/{i}": torch.from_numpy(rng.normal(i, 1, (4, 128))) for i in range(5)}
    alike["t/4"][0, 0] = float("nan")
    want = {n: exact(t.numpy(), mask.numpy()) for n, t in alike.items() if n != "t/4"}
    finite = alike["t/4"].numpy()[mask.numpy()]
    finite = finite[np.isfinite(finite)]
    want["t/4"] = [float(finite.sum()), float(finite.size), float(finite.min()), finite.max()]
    other = torch.from_numpy(rng.normal(0, 1, 600))
    want["other"] = exact(other.numpy())
    half = torch.ones(4, 128, dtype=torch.bfloat16)
    p = Producer(inbox.address, run="r", role="a", config=ProducerConfig(gpu_sample_s=0))
    data = {n: Masked(t, mask) for n, t in alike.items()}
    p.log({**data, "other": other, "half": Masked(half, mask), "bad": Masked(other, mask)}, 0)
    for t in (*alike.values(), other):
        t.fill_(1e6)
    mask.fill_(False)
    held_sender.set()
    p.close()
    (entry,) = entries(inbox.receive(until=has_bye))
    got = dict(zip(entry.names, entry.values.tolist(), strict=True))
    for name, state in want.items():
        assert got[name] == pytest.approx(state, rel=1e-12), name
    assert got["half"][1] == float(np.asarray(want["t/0"])[1])  # bfloat16: one by one
    assert "bad" not in got and p.stats()["invalid"] == 1
    assert entry.nonfinite == {"t/4": int(mask_before[0, 0])}


def test_snapshot_rows_shares_one_array_and_declines_what_it_cannot_copy() -> None:
    mask = np.ones(300, dtype=bool)
    values = [Masked(np.full(300, float(i)), mask) for i in range(3)]
    names = ["a", "b", "c"]
    assert len({row_key(v) for v in values}) == 1 and alike(values)
    masks: dict[int, np.ndarray] = {}
    rows = snapshot_rows(names, values, masks, room=1e9)
    assert rows is not None and rows.names == names and rows.values.shape == (3, 300)
    assert rows.mask is masks[id(mask)] and rows.nbytes == 3 * 300 * 8 + 300
    assert rows.reduce() == [reduce_value(v) for v in values]
    assert snapshot_rows(names, values, {}, room=3 * 300 * 8 - 1) is None  # does not fit
    small = [np.ones(COPY_MIN - 1), np.ones(COPY_MIN - 1)]
    assert snapshot_rows(names[:2], small, {}, room=1e9) is None
    graded = [torch.full((300,), float(i), requires_grad=True) for i in range(2)]
    rows = snapshot_rows(names[:2], graded, {}, room=1e9)  # of the graph: copied all the same
    assert rows is not None
    assert rows.reduce() == [reduce_value(t.detach()) for t in graded]
    sparse = [torch.ones(300).to_sparse(), torch.ones(300).to_sparse()]
    assert snapshot_rows(names[:2], sparse, {}, room=1e9) is None  # not strided: one by one
    wrong = [Masked(np.ones(300), np.ones(3, dtype=bool))] * 2
    assert snapshot_rows(names[:2], wrong, {}, room=1e9) is None  # named by snapshot_value


def test_alike_is_one_row_key() -> None:
    """``alike`` (the common call's check, no key per value) says what equal ``row_key`` s
    say, for every kind of odd one out."""
    mask, other_mask = torch.ones(300, dtype=torch.bool), torch.ones(300, dtype=torch.bool)
    base = [Masked(torch.zeros(300), mask) for _ in range(3)]
    odd = [
        Masked(torch.zeros(300), other_mask),  # another mask object
        Masked(torch.zeros(300, dtype=torch.float64), mask),  # another dtype
        Masked(torch.zeros(3, 100), mask),  # another shape
        Masked(np.zeros(300, dtype=np.float32), mask),  # another type
        torch.zeros(300),  # not masked
        Masked(torch.zeros(300).to(device="meta"), mask),  # not on the CPU
        Masked([0.0] * 300, mask),  # not an array
    ]
    assert alike(base)
    for value in odd:
        for values in ([*base, value], [value, *base]):
            assert alike(values) == (len({row_key(v) for v in values}) == 1), value
            assert not alike(values)
    plain = [np.zeros(300), np.ones(300)]
    assert alike(plain) and not alike([*plain, np.zeros(300, dtype=np.float32)])
    assert not alike([[0.0] * 300, [0.0] * 300])  # lists are never copied together


def test_a_sparse_tensor_is_named_invalid_and_the_call_goes_on(inbox) -> None:
    """Copied alone or with another like it, a sparse tensor gets a clear error, not the
    loss of the whole call."""
    p = Producer(inbox.address, run="r", role="a", config=ProducerConfig(gpu_sample_s=0))
    sparse = {f"s/{i}": torch.ones(300).to_sparse() for i in range(2)}
    p.log({**sparse, "ok": 1.0}, step=0)
    p.log({"s/0": torch.ones(300).to_sparse(), "ok": 2.0}, step=1)
    p.close()
    got = [e.names for e in entries(inbox.receive(until=has_bye))]
    assert got == [("ok",), ("ok",)]
    assert p.stats()["invalid"] == 3 and p.stats()["errors"] == 0


def test_a_calls_rows_given_back_hold_a_later_copy_of_their_size() -> None:
    """The pool keeps buffers by dtype and size: a call's rows (2 x 384) given back serve a
    later flat copy of 768 values."""
    pool = Buffers()
    pool.give(np.zeros((2, 384), dtype=np.float32))
    x = np.arange(768, dtype=np.float32)
    got = pool.take(x)
    assert got.shape == (768,) and np.array_equal(got, x) and not np.shares_memory(got, x)


def test_a_call_after_one_whose_rows_were_given_back_is_logged_exactly(inbox) -> None:
    """What the demo met: a step's two per-token tensors of 384 tokens are copied as one 2 x
    384 array, which the sender gives back; the next step's one tensor of 768 values is
    copied into that buffer. It must be logged, exactly, not fail and be skipped."""
    rng = np.random.default_rng(5)
    p = Producer(inbox.address, run="r", role="a", config=ProducerConfig(gpu_sample_s=0))
    mask = torch.ones(384, dtype=torch.bool)
    pair = {f"t/{i}": torch.from_numpy(rng.normal(i, 1, 384).astype(np.float32)) for i in (0, 1)}
    p.log({n: Masked(t, mask) for n, t in pair.items()}, step=0)
    p.flush()  # the sender has reduced step 0 and given its rows back
    long = torch.from_numpy(rng.normal(5, 1, 768).astype(np.float32))
    p.log({"long": long}, step=1)
    p.close()
    got = {
        (e.step, n): row
        for e in entries(inbox.receive(until=has_bye))
        for n, row in zip(e.names, e.values.tolist(), strict=True)
    }
    assert p.stats()["errors"] == 0
    for name, t in pair.items():
        assert got[(0, name)] == pytest.approx(exact(t.numpy()), rel=1e-12)
    assert got[(1, "long")] == pytest.approx(exact(long.numpy()), rel=1e-12)


@given(
    st.lists(
        st.tuples(
            st.sampled_from(["take", "empty", "tensor"]),
            st.sampled_from([np.float32, np.float64, np.int64]),
            st.sampled_from([(1, 768), (2, 384), (3, 256), (4, 192), (6, 128)]),
            st.booleans(),
        ),
        min_size=1,
        max_size=40,
    )
)
@settings(max_examples=150, deadline=None)
def test_any_mix_of_copies_through_the_pool_holds_what_was_copied(ops) -> None:
    """Flat copies, rows of several shapes and torch rows of one size share the pool's
    buffers in any order: each copy holds exactly what was copied into it, while the others
    held at the same time keep theirs, and none is handed out twice."""
    pool = Buffers()
    held: list[tuple[np.ndarray, np.ndarray]] = []  # (buffer, what it must hold)
    rng = np.random.default_rng(0)
    for kind, dtype, (n, size), give_back in ops:
        data = rng.integers(-1000, 1000, n * size).astype(dtype)
        if kind == "take":
            buf = pool.take(data)
            want = data.copy()
        elif kind == "empty":
            buf = pool.empty(np.dtype(dtype), (n, size))
            want = data.reshape(n, size)
            np.copyto(buf, want)
        else:
            like = torch.from_numpy(np.zeros(size, dtype))
            rows, out = pool.tensor_rows(torch, np.dtype(dtype), like, n)
            want = data.reshape(n, size)
            torch.stack([torch.from_numpy(r.copy()) for r in want], out=out)
            buf = rows
        assert buf.shape == want.shape and buf.dtype == want.dtype
        assert not any(np.shares_memory(buf, other) for other, _ in held)
        held.append((buf, want.copy()))
        for other, kept in held:
            assert np.array_equal(other, kept)
        if give_back:
            pool.give(held.pop(0)[0])
