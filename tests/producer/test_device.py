"""The GPU pipeline (``rlpulse.producer.device``) on CPU tensors, through a fake of CUDA's events and
streams: the caller only snapshots; the sender reduces, waits for the "device" and keeps the
order; values are exact; errors are counted, never raised. The same code runs on a GPU in
``test_gpu.py``."""

from __future__ import annotations

import logging
import math
import time

import numpy as np
import pytest
import torch

from rlpulse.producer import Fraction, Masked, Producer, Weighted
from rlpulse.producer.config import ProducerConfig
from rlpulse.producer.reduce import reduce_tensor, reduce_value
from rlpulse.schemas import metrics as M, protocol
from rlpulse.schemas.values import Summary
from tests.producer.conftest import done_steps, entries, has_bye
from tests.producer.fakedevice import SNAPSHOT_OPS, SYNCING_OPS, Recorder, fake_context

DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.int32, torch.bool]


def by_name(msgs: list) -> dict[str, list[float]]:
    return {n: e.values[i].tolist() for e in entries(msgs) for i, n in enumerate(e.names)}


def expect(values: np.ndarray, mask: np.ndarray | None = None) -> list[float]:
    """What an exact reduction gives: numpy on float64, non-finite samples left out."""
    v = values.astype(np.float64).ravel()
    keep = np.isfinite(v) if mask is None else np.isfinite(v) & mask.ravel()
    sel = v[keep]
    return [sel.sum(), float(sel.size), sel.min(), sel.max()] if sel.size else [0.0, 0.0]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("masked", [False, True])
def test_reduce_tensor_matches_numpy(dtype: torch.dtype, masked: bool) -> None:
    gen = torch.Generator().manual_seed(3)
    values = (torch.randn(4, 257, generator=gen) * 50).to(dtype)
    if dtype.is_floating_point:
        values[0, :3] = torch.tensor([math.nan, math.inf, -math.inf], dtype=dtype)
    mask = torch.rand(4, 257, generator=gen) < 0.7
    row = reduce_tensor(torch, values, mask if masked else None).tolist()
    host = values.to(torch.float64).numpy()
    m = mask.numpy() if masked else None
    want = expect(host, m)
    finite = np.isfinite(host) if m is None else np.isfinite(host) & m
    nonfinite = (~np.isfinite(host)).sum() if m is None else (~np.isfinite(host) & m).sum()
    assert row[:4] == pytest.approx(want, rel=1e-12) and row[4] == nonfinite
    assert row[1] == finite.sum()


def test_log_only_snapshots_in_the_callers_thread(inbox) -> None:
    device, ops = fake_context()
    p = Producer(
        inbox.address, run="r", role="a", device=device, config=ProducerConfig(gpu_sample_s=0)
    )
    values = torch.randn(1000)
    mask = torch.rand(1000) < 0.5
    data = {
        "plain": values,
        "masked": Masked(values, mask),
        "host_mask": Masked(values, mask.numpy()),
        "one": torch.tensor(2.5),
        "w": Weighted(torch.tensor(0.5), torch.tensor(8)),
        "f": Fraction(torch.tensor(3), 12),
        "bf16": values.to(torch.bfloat16),
    }
    rec = Recorder()
    with rec:
        p.log(data, step=0)
    p.close()
    assert rec.ops and set(rec.ops) <= SNAPSHOT_OPS, rec.ops
    assert rec.ops.count("stack") == 2  # one per dtype of the single numbers (float32, int64)
    got = by_name(inbox.receive(until=has_bye))
    v, m = values.numpy(), mask.numpy()
    assert got["plain"] == pytest.approx(expect(v), rel=1e-12)
    assert got["masked"] == pytest.approx(expect(v, m), rel=1e-12)
    assert got["host_mask"] == got["masked"]
    assert got["one"] == [2.5, 1.0, 2.5, 2.5]
    assert got["w"][:2] == [4.0, 8.0] and got["f"][:2] == [3.0, 12.0]
    assert got["bf16"] == pytest.approx(expect(values.to(torch.bfloat16).float().numpy()))
    assert ops.side_runs == 1 and p.stats()["errors"] == 0


def test_values_are_those_at_the_call_not_after_an_inplace_update(inbox) -> None:
    device, ops = fake_context(held=True)
    p = Producer(
        inbox.address, run="r", role="a", device=device, config=ProducerConfig(gpu_sample_s=0)
    )
    values = torch.ones(100)
    p.log({"x": values}, step=0)
    values.mul_(7)  # the training loop reuses its buffer before the "GPU" caught up
    ops.release()
    p.close()
    assert by_name(inbox.receive(until=has_bye))["x"] == [100.0, 100.0, 1.0, 1.0]


def test_calls_wait_for_the_device_and_keep_their_order(inbox) -> None:
    device, ops = fake_context(held=True)
    p = Producer(
        inbox.address, run="r", role="a", device=device, config=ProducerConfig(gpu_sample_s=0)
    )
    p.log({"gpu": torch.arange(10.0)}, step=0)
    p.log({"host": 1.0}, step=1)  # a host-only call behind a GPU one waits its turn
    p.step_done(1)
    assert p.flush(0.5) is False  # nothing can be acknowledged while the device is behind
    assert not entries(inbox.receive(timeout_s=0.3))
    ops.release()
    assert p.flush(5)
    msgs = inbox.receive(until=lambda ms: len(entries(ms)) == 2)
    assert [e.step for e in entries(msgs)] == [0, 1]
    # The done comes with (or after) the entries it follows, never before them.
    last = [m for m in msgs if isinstance(m, (protocol.Metrics, protocol.Done))][-1]
    assert done_steps(msgs) == [1] and done_steps([last]) == [1]
    p.close()
    assert all(m.released for m in ops.markers)  # events go back to the pool


def test_close_drops_and_counts_calls_whose_device_never_caught_up(inbox, caplog) -> None:
    caplog.set_level(logging.WARNING, "rlpulse.producer")
    device, _ = fake_context(held=True)
    p = Producer(
        inbox.address, run="r", role="a", device=device, config=ProducerConfig(gpu_sample_s=0)
    )
    p.log({"gpu": torch.arange(10.0)}, step=0)
    p.close(timeout=0.5)
    assert p.stats()["dropped_send"] == 1
    assert "still waiting for the GPU" in caplog.text
    assert has_bye(inbox.receive(until=has_bye))


def test_device_errors_are_counted_and_the_next_calls_go_through(inbox) -> None:
    device, ops = fake_context()
    p = Producer(
        inbox.address, run="r", role="a", device=device, config=ProducerConfig(gpu_sample_s=0)
    )
    ops.fail_launch = True
    p.log({"lost": torch.arange(3.0)}, step=0)
    assert p.flush(5)
    ops.fail_launch = False
    ops.fail_query = True
    p.log({"lost_too": torch.arange(3.0)}, step=1)
    assert p.flush(5)
    ops.fail_query = False
    p.log({"kept": torch.arange(3.0)}, step=2)
    p.close()
    got = by_name(inbox.receive(until=has_bye))
    assert set(got) == {"kept"} and p.stats()["errors"] == 2
    assert device.outstanding() == 0  # a failed launch gives its snapshot bytes back


def test_bad_device_parts_are_invalid_in_the_sender_not_raised(inbox) -> None:
    device, _ = fake_context()
    p = Producer(
        inbox.address, run="r", role="a", device=device, config=ProducerConfig(gpu_sample_s=0)
    )
    p.log(
        {
            "neg": Weighted(torch.tensor(1.0), torch.tensor(-2.0)),
            "nan": Weighted(torch.tensor(math.nan), 3),
            "inf": torch.tensor(math.inf),
            "shape": Masked(torch.ones(3), torch.ones(4)),
            "ok": Fraction(torch.tensor(1.0), torch.tensor(4.0)),
        },
        step=0,
    )
    p.close()
    got = by_name(inbox.receive(until=has_bye))
    assert set(got) == {"ok", "nan", "inf"} and got["ok"][:2] == [1.0, 4.0]
    assert got["nan"][1] == got["inf"][1] == 0.0  # no samples: left out, counted below
    (entry,) = entries(inbox.receive(until=has_bye))
    assert dict(entry.nonfinite) == {"nan": 1, "inf": 1}
    assert p.stats()["invalid"] == 2 and p.stats()["errors"] == 0


def test_past_the_snapshot_budget_the_caller_reduces_in_place(inbox) -> None:
    device, _ = fake_context(snapshot_limit_bytes=1000)
    p = Producer(
        inbox.address, run="r", role="a", device=device, config=ProducerConfig(gpu_sample_s=0)
    )
    values = torch.randn(10_000)  # 40 kB: over the budget, no copy
    rec = Recorder()
    with rec:
        p.log({"big": values, "small": torch.randn(10)}, step=0)
    p.close()
    assert "clone" in rec.ops and "sum" in rec.ops  # the small one copied, the big one reduced
    assert not SYNCING_OPS & set(rec.ops), rec.ops
    assert by_name(inbox.receive(until=has_bye))["big"] == pytest.approx(expect(values.numpy()))
    assert device.outstanding() == 0


def test_phase_reports_device_time_between_its_boundaries(inbox) -> None:
    device, ops = fake_context(held=True)
    p = Producer(
        inbox.address,
        run="r",
        role="actor_train",
        device=device,
        config=ProducerConfig(gpu_sample_s=0),
    )
    with p.phase(
        "actor_train/train_step",
        step=0,
        onload=lambda: setattr(ops, "clock", ops.clock + 0.5),
        offload=lambda: setattr(ops, "clock", ops.clock + 0.25),
    ):
        ops.clock += 3.0  # the body queues 3 s of "kernels" and returns at once
    assert not entries(inbox.receive(timeout_s=0.2))  # the phase waits for its end marker
    ops.release()
    p.close()
    got = by_name(inbox.receive(until=has_bye))

    def gpu(part: str) -> float:
        return got[M.TIME_PHASE_GPU.format(cluster="actor_train", phase="train_step", part=part)][0]

    assert (gpu("onload"), gpu("execute"), gpu("offload"), gpu("total")) == (0.5, 3.0, 0.25, 3.75)
    host = got[M.TIME_PHASE.format(cluster="actor_train", phase="train_step", part="execute")][0]
    assert host < 0.5


def test_loads_the_body_does_itself_are_the_phases_onload_and_offload(inbox) -> None:
    """verl's engines move the model inside the worker call: ``phase.part`` times those loads
    as the phase's onload and offload, on the host and on the device, and execute is the rest."""
    device, ops = fake_context(held=True)
    p = Producer(
        inbox.address, run="r", role="actor", device=device, config=ProducerConfig(gpu_sample_s=0)
    )
    with p.phase("actor/train_step", step=4) as phase:
        ops.clock += 0.125  # queued before the load: on the device, before its end marker
        with phase.part("onload"):
            ops.clock += 0.5
            time.sleep(0.05)
        ops.clock += 3.0
        with phase.part("offload"):
            ops.clock += 0.25
            time.sleep(0.03)
    ops.release()
    p.close()
    got = by_name(inbox.receive(until=has_bye))

    def host(part: str) -> float:
        return got[M.TIME_PHASE.format(cluster="actor", phase="train_step", part=part)][0]

    def gpu(part: str) -> float:
        return got[M.TIME_PHASE_GPU.format(cluster="actor", phase="train_step", part=part)][0]

    assert (gpu("onload"), gpu("execute"), gpu("offload"), gpu("total")) == (
        0.625,
        3.0,
        0.25,
        3.875,
    )
    assert host("onload") >= 0.05 and host("offload") >= 0.03
    assert host("execute") < 0.03  # the loads are not the work
    assert host("total") >= host("onload") + host("offload") + host("execute")


def test_no_phase_timers_before_the_process_uses_its_gpu(inbox) -> None:
    device, ops = fake_context(initialized=False)
    p = Producer(
        inbox.address,
        run="r",
        role="actor_train",
        device=device,
        config=ProducerConfig(gpu_sample_s=0),
    )
    with p.phase("actor_train/train_step", step=0):
        pass
    p.close()
    got = by_name(inbox.receive(until=has_bye))
    assert not [n for n in got if "/gpu/" in n] and not ops.markers


def test_reduce_value_still_reduces_a_value_synchronously() -> None:
    """Tools and tests call reduce_value directly; GPU deferral is the producer's business."""
    state, nf, _ = reduce_value(Masked(torch.tensor([1.0, 2.0, 4.0]), torch.tensor([1, 0, 1])))
    assert (state, nf) == (Summary(5.0, 2.0, 1.0, 4.0), 0)
