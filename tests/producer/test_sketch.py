"""Distribution metrics on the producer: a name the catalog declares ``dist`` is logged as
usual and its samples are sketched, on the host at once and on the "GPU" (the fake device of
``test_device.py``) in the sender, without synchronizing; the sketch rides beside the exact
state, and other names are untouched."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from rlpulse.producer import Masked, Producer, Weighted
from rlpulse.producer.config import ProducerConfig
from rlpulse.producer.device import sketch_tensor
from rlpulse.producer.reduce import reduce_value
from rlpulse.producer.sketch import sketch_value
from rlpulse.schemas import metrics as M, protocol, sketch as S
from rlpulse.schemas.reductions import Reduction
from tests.producer.conftest import entries, has_bye
from tests.producer.fakedevice import SNAPSHOT_OPS, SYNCING_OPS, Recorder, fake_context

ADV, LEN, LOSS = M.CRITIC_ADVANTAGES.name, M.RESPONSE_LENGTH.name, M.ACTOR_PG_LOSS.name


def want(values: np.ndarray, mask: np.ndarray | None = None) -> np.ndarray:
    v = values.astype(np.float64).ravel()
    keep = np.isfinite(v) if mask is None else np.isfinite(v) & mask.ravel()
    return S.counts_of(v[keep])


def sketches(msgs: list) -> list[dict[str, np.ndarray]]:
    """Per entry, its sketches by metric name."""
    tables: dict[int, list[str]] = {}
    out = []
    for m in msgs:
        if isinstance(m, protocol.Hello):
            tables.update((t.id, t.names) for t in m.tables)
        elif isinstance(m, protocol.Metrics):
            per: list[dict[str, np.ndarray]] = [{} for _ in m.entries]
            for i, row, buf in m.sketches:
                per[i][tables[m.entries[i][2]][row]] = S.decode(buf)
            out += per
    return out


def values_with_nan() -> np.ndarray:
    x = np.random.default_rng(1).normal(0, 2, 5000)
    x[:3] = [math.nan, math.inf, -math.inf]
    return x


@pytest.mark.parametrize(
    "value, expected",
    [
        (values_with_nan(), lambda x: want(x)),
        (torch.tensor(values_with_nan()), lambda x: want(x.numpy())),
        (torch.tensor(values_with_nan()).to(torch.bfloat16), lambda x: want(x.double().numpy())),
        (
            Masked(values_with_nan(), np.arange(5000) % 3 == 0),
            lambda v: want(v.values, v.mask),
        ),
        (
            Masked(torch.tensor(values_with_nan()), torch.arange(5000) % 2 == 0),
            lambda v: want(v.values.numpy(), v.mask.numpy()),
        ),
        ([1, 2, 3], lambda x: want(np.array(x, dtype=np.float64))),
    ],
    ids=["numpy", "tensor", "bf16", "masked", "masked-tensor", "list"],
)
def test_sketch_value_is_the_exact_state_plus_the_sketch(value, expected) -> None:  # type: ignore[no-untyped-def]
    state, nonfinite, buf = sketch_value(value)
    plain = reduce_value(value)
    assert state == pytest.approx(plain[0], rel=1e-12) and nonfinite == plain[1]
    assert (S.decode(buf) == expected(value)).all()


def test_values_without_samples_pool_into_the_mean_only() -> None:
    assert sketch_value(Weighted(0.5, 8)).sketch is None
    assert sketch_value(np.array([math.nan])).sketch is None  # nothing finite: no sketch


def test_producer_sends_sketches_of_distributions_only(inbox) -> None:
    p = Producer(inbox.address, run="r", role="a", config=ProducerConfig(gpu_sample_s=0))
    x = np.random.default_rng(2).normal(0, 1, 10_000)
    mask = np.random.default_rng(3).random(10_000) < 0.5
    lengths = torch.randint(1, 512, (64,))
    p.log({ADV: Masked(x, mask), LEN: lengths, LOSS: Masked(x, mask), "other": x}, step=0)
    p.log({LEN: 17}, step=1)  # a number under a distribution: one sample
    p.close()
    msgs = inbox.receive(until=has_bye)
    got = sketches(msgs)
    assert set(got[0]) == {ADV, LEN}
    assert (got[0][ADV] == want(x, mask)).all()
    assert (got[0][LEN] == want(lengths.numpy())).all()
    assert (got[1][LEN] == S.counts_of(np.array([17.0]))).all()
    first = entries(msgs)[0]
    kinds = dict(zip(first.names, first.kinds, strict=True))
    assert kinds[ADV] == Reduction.MEAN  # an older collector reads it as before
    row = first.values[first.names.index(ADV)]
    assert row[1] == mask.sum() and row[3] == x[mask].max()
    assert p.stats()["errors"] == 0 and p.stats()["invalid"] == 0


def test_the_sketch_kernel_never_waits_for_the_device() -> None:
    v = torch.randn(10_000)
    v[:2] = torch.tensor([math.nan, math.inf])
    mask = torch.rand(10_000) < 0.5
    rec = Recorder()
    with rec:
        counts = sketch_tensor(torch, v, mask)
    assert not (SYNCING_OPS | {"bincount"}) & set(rec.ops), rec.ops
    assert (counts.numpy().astype(np.int64) == want(v.numpy(), mask.numpy())).all()


@pytest.mark.parametrize("budget", [1 << 30, 1000], ids=["side-stream", "past-the-budget"])
def test_device_values_are_sketched_in_the_sender(inbox, budget: int) -> None:
    device, _ = fake_context(snapshot_limit_bytes=budget)
    p = Producer(
        inbox.address, run="r", role="a", device=device, config=ProducerConfig(gpu_sample_s=0)
    )
    values = torch.randn(4, 1000) * 3
    values[0, 0] = math.nan
    mask = torch.rand(4, 1000) < 0.6
    rec = Recorder()
    with rec:
        p.log({ADV: Masked(values, mask), LEN: torch.tensor([5.0]), "plain": values}, step=0)
    p.close()
    assert not SYNCING_OPS & set(rec.ops), rec.ops
    if budget > 1 << 20:
        assert set(rec.ops) <= SNAPSHOT_OPS, rec.ops  # the caller only snapshots
    got = sketches(inbox.receive(until=has_bye))[0]
    assert set(got) == {ADV, LEN}
    assert (got[ADV] == want(values.numpy(), mask.numpy())).all()
    assert (got[LEN] == S.counts_of(np.array([5.0]))).all()
    assert p.stats()["errors"] == 0


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_a_gpu_the_sketch_is_built_without_synchronizing(inbox) -> None:
    from tests.producer.gpu import gpu_busy_ms, strict

    values = torch.randn(1_000_000, device="cuda") * 5
    mask = torch.rand(1_000_000, device="cuda") < 0.7
    expected = want(values.double().cpu().numpy(), mask.cpu().numpy())
    gpu_busy_ms(1)  # calibrate outside strict mode
    p = Producer(inbox.address, run="r", role="a", config=ProducerConfig(gpu_sample_s=0))
    with strict():  # any synchronizing call raises, in the caller and the sender alike
        gpu_busy_ms(200)
        p.log({ADV: Masked(values, mask)}, step=0)
        p.close()
    (got,) = sketches(inbox.receive(until=has_bye))
    assert (got[ADV] == expected).all()
    assert p.stats()["errors"] == 0


def test_samples_are_copied_in_log_and_sketched_by_the_sender(inbox) -> None:
    """log() only copies a distribution's samples (sketching is the sender thread's work),
    so changing the arrays right after log() changes nothing that was logged."""
    p = Producer(inbox.address, run="r", role="a", config=ProducerConfig(gpu_sample_s=0))
    x = np.random.default_rng(4).normal(0, 1, 5_000)
    t = torch.from_numpy(x.copy())
    original = x.copy()
    p.log({ADV: x, LEN: t}, step=0)
    x[:] = 1e6  # the caller reuses its buffers at once
    t.fill_(1e6)
    p.close()
    got = sketches(inbox.receive(until=has_bye))
    assert (got[0][ADV] == want(original)).all() and (got[0][LEN] == want(original)).all()
