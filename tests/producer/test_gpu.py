"""On a real GPU, under ``torch.cuda.set_sync_debug_mode("error")``: ``log()``, phases and
GPU state never synchronize, never wait for queued work, and report exact values. Strict mode
holds until ``close()`` has returned, so the sender thread's reductions and copies run under it
too (the mode is process-wide).

Marked ``gpu``; skipped without CUDA. ``bash scripts/gpu-check.sh`` runs them on a GPU machine
with the rest of the GPU checks (README, "On a GPU").
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from rlpulse.producer import Fraction, Masked, Producer, Weighted
from rlpulse.producer.config import ProducerConfig
from rlpulse.producer.gpustate import GIB, NvmlSampler
from rlpulse.schemas import metrics as M
from tests.producer.conftest import entries, has_bye
from tests.producer.gpu import gpu_busy_ms, strict

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def got(inbox) -> dict[str, list[float]]:
    msgs = inbox.receive(until=has_bye)
    return {n: e.values[i].tolist() for e in entries(msgs) for i, n in enumerate(e.names)}


def exact(values: torch.Tensor, mask: torch.Tensor | None = None) -> list[float]:
    v = values.detach().double().cpu().numpy().ravel()
    keep = np.isfinite(v) if mask is None else np.isfinite(v) & mask.cpu().numpy().ravel()
    sel = v[keep]
    return [sel.sum(), float(sel.size), sel.min(), sel.max()]


def test_log_returns_while_the_gpu_is_still_busy(inbox) -> None:
    values = torch.randn(1_000_000, device="cuda")
    mask = torch.rand(1_000_000, device="cuda") < 0.5
    want, want_masked = exact(values), exact(values, mask)
    gpu_busy_ms(1)  # calibrate outside strict mode
    total = values.sum()
    p = Producer(inbox.address, run="r", role="a", config=ProducerConfig(gpu_sample_s=0))
    with strict():
        busy = gpu_busy_ms(300)
        p.log({"v": values, "m": Masked(values, mask), "s": total}, step=0)
        still_busy = not busy.query()
        p.close(timeout=10)  # the sender's reductions run under strict mode too
    assert still_busy, "log() returned only after the queued GPU work finished"
    out = got(inbox)
    assert out["v"] == pytest.approx(want, rel=1e-9)
    assert out["m"] == pytest.approx(want_masked, rel=1e-9)
    assert p.stats()["errors"] == 0 and p.stats()["dropped_send"] == 0


@pytest.mark.parametrize(
    "dtype", [torch.float16, torch.bfloat16, torch.float32, torch.int32, torch.bool], ids=str
)
@pytest.mark.parametrize("n", [1000, 1_000_000])
def test_every_input_kind_is_exact_without_a_sync(inbox, dtype, n) -> None:
    gen = torch.Generator(device="cuda").manual_seed(n)
    base = torch.randn(n, device="cuda", generator=gen) * 10
    values = base > 0 if dtype is torch.bool else base.to(dtype)
    if dtype.is_floating_point:
        values[:3] = torch.tensor([math.nan, math.inf, -math.inf], dtype=dtype).to(
            "cuda", non_blocking=True
        )
    cuda_mask = torch.rand(n, device="cuda", generator=gen) < 0.7
    host_mask = cuda_mask.cpu()
    count, v5 = cuda_mask.sum(), values[5].float()
    p = Producer(inbox.address, run="r", role="a", config=ProducerConfig(gpu_sample_s=0))
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with strict():
        with torch.cuda.stream(side):  # produced and logged on a side stream
            on_side = values * 1
            p.log({"side": on_side}, step=0)
        p.log(
            {
                "plain": values,
                "cuda_mask": Masked(values, cuda_mask),
                "weighted": Weighted(v5, count),
                "fraction": Fraction(count, n),
                "scalar": values[7],
            },
            step=0,
        )
        p.log({"host_mask": Masked(values, host_mask.numpy())}, step=1)
        p.close(timeout=10)
    out = got(inbox)
    assert out["plain"] == pytest.approx(exact(values), rel=1e-9)
    assert out["side"] == pytest.approx(exact(values), rel=1e-9)
    assert out["cuda_mask"] == pytest.approx(exact(values, cuda_mask), rel=1e-9)
    assert out["host_mask"] == out["cuda_mask"]
    k, v5 = float(host_mask.sum()), float(v5)
    if math.isfinite(v5):
        assert out["weighted"][:2] == pytest.approx([v5 * k, k])
    assert out["fraction"][:2] == [k, float(n)]
    assert p.stats()["errors"] == 0 and p.stats()["invalid"] == 0


@pytest.mark.filterwarnings("error::UserWarning")
def test_read_only_host_memory_beside_a_gpu_tensor_is_exact_and_warns_nothing(inbox) -> None:
    """A read-only numpy mask for a GPU tensor, and read-only numpy values under a GPU mask,
    go to the device through pinned memory. torch warns when handed read-only memory, and
    where warnings are errors that failed the whole ``log()`` call."""
    n = 4096
    gen = torch.Generator(device="cuda").manual_seed(7)
    values = torch.randn(n, device="cuda", generator=gen)
    cuda_mask = torch.rand(n, device="cuda", generator=gen) < 0.5
    frozen_mask = cuda_mask.cpu().numpy()
    frozen_mask.flags.writeable = False
    frozen_values = values.cpu().numpy()
    frozen_values.flags.writeable = False
    p = Producer(inbox.address, run="r", role="a", config=ProducerConfig(gpu_sample_s=0))
    with strict():
        p.log(
            {
                "host_mask": Masked(values, frozen_mask),
                "host_values": Masked(frozen_values, cuda_mask),
            },
            step=0,
        )
        p.close(timeout=10)
    out = got(inbox)
    assert p.stats()["errors"] == 0 and p.stats()["invalid"] == 0
    assert out["host_mask"] == pytest.approx(exact(values, cuda_mask), rel=1e-9)
    assert out["host_values"] == pytest.approx(exact(values, cuda_mask), rel=1e-9)


def test_past_the_snapshot_budget_reduction_on_the_callers_stream_does_not_sync(inbox) -> None:
    from rlpulse.producer.cuda import CudaOps
    from rlpulse.producer.device import DeviceContext

    values = torch.randn(4096, device="cuda")
    p = Producer(
        inbox.address,
        run="r",
        role="a",
        device=DeviceContext(CudaOps(torch), snapshot_limit_bytes=1024),
        config=ProducerConfig(gpu_sample_s=0),
    )
    with strict():
        p.log({"big": values}, step=0)
        p.close(timeout=10)
    assert got(inbox)["big"] == pytest.approx(exact(values), rel=1e-9)


def test_phase_reports_the_gpu_time_of_the_work_it_queued(inbox) -> None:
    gpu_busy_ms(1)  # calibrate outside strict mode
    p = Producer(inbox.address, run="r", role="actor_train", config=ProducerConfig(gpu_sample_s=0))
    torch.cuda.synchronize()
    # The work's own time, by events of the test's around it (the phase's are inside them).
    before, after = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    with strict():
        with p.phase("actor_train/train_step", step=0):
            before.record()
            gpu_busy_ms(300)  # queued, not waited for
            after.record()
        p.close(timeout=10)
    out = got(inbox)
    work = before.elapsed_time(after) / 1e3
    part = {
        k: out[M.TIME_PHASE_GPU.format(cluster="actor_train", phase="train_step", part=k)][0]
        for k in ("total", "execute")
    }
    host = out[M.TIME_PHASE.format(cluster="actor_train", phase="train_step", part="execute")][0]
    assert work >= 0.29, f"the queued work took {work:.3f} s on the GPU, not 300 ms"
    assert work <= part["execute"] <= work + 0.005
    assert part["total"] >= part["execute"]
    assert host < 0.1  # the host only queued the work


def test_nvml_sees_the_device_and_this_process() -> None:
    keep = torch.empty(256 * 1024 * 1024, dtype=torch.uint8, device="cuda")
    sampler = NvmlSampler("actor_train")
    if not sampler.start():
        pytest.skip(f"NVML: {sampler.off_reason}")
    with strict():
        readings = sampler.sample()
    device = torch.cuda.current_device()
    used = readings[
        M.GPU_DEVICE_MEMORY.format(cluster="actor_train", device_id=device, stat="memory_used")
    ]
    assert used >= torch.cuda.memory_reserved(device) / GIB
    own = M.GPU_DEVICE_MEMORY.format(cluster="actor_train", device_id=device, stat="memory_process")
    if own in readings:  # absent where a PID namespace hides our process from NVML
        assert readings[own] >= keep.numel() / GIB
    sampler.close()


def test_a_transposed_gpu_mask_and_a_gpu_step_are_refused_without_a_sync(inbox, caplog) -> None:
    """Issue 45, items 1 and 2 on CUDA: the mask's shape and the step tensor's device are host
    metadata; refusing either reads no value from the GPU."""
    import logging

    caplog.set_level(logging.WARNING, "rlpulse.producer")
    values = torch.randn(8, 64, device="cuda")
    transposed = torch.ones(64, 8, device="cuda")
    step = torch.tensor(1, device="cuda")
    gpu_busy_ms(1)  # calibrate outside strict mode
    p = Producer(inbox.address, run="r", role="a", config=ProducerConfig(gpu_sample_s=0))
    with strict():
        gpu_busy_ms(100)
        p.log({"t": Masked(values, transposed), "ok": values}, step=0)
        p.log({"x": values}, step=step)
        p.close(timeout=10)
    assert set(got(inbox)) == {"ok"}
    assert p.stats()["invalid"] == 2 and p.stats()["errors"] == 0
    assert "t: mask has shape (64, 8) but values have shape (8, 64)" in caplog.text
    assert "got a tensor on cuda:0: reading its value would make log() wait" in caplog.text
