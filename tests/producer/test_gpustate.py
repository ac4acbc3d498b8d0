"""GPU state through NVML: read in the sender thread, named from the catalog, absent (noted
once, never raised) without NVML, with a fake ``pynvml`` standing in for the driver."""

from __future__ import annotations

import logging
import os
import time
from types import SimpleNamespace

from rlpulse.producer import Producer
from rlpulse.producer.config import ProducerConfig
from rlpulse.producer.gpustate import NvmlSampler
from rlpulse.schemas import metrics as M
from tests.producer.conftest import entries, has_bye

ME, CHILD, STRANGER = os.getpid(), 4242, 777


class NotSupported(Exception):
    pass


class FakeNvml:
    """Two physical GPUs; ours use 3 GiB (this process) + 5 GiB (a child, e.g. a vLLM engine)
    on GPU 1; GPU 1 draws no readable power."""

    NVML_TEMPERATURE_GPU = 0

    def __init__(self) -> None:
        self.inits = 0
        self.calls = 0

    def nvmlInit(self) -> None:
        self.inits += 1

    def nvmlShutdown(self) -> None:
        pass

    def nvmlDeviceGetCount(self) -> int:
        return 2

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> int:
        return {"GPU-aaaa": 0, "GPU-bbbb": 1}[uuid]

    def nvmlDeviceGetMemoryInfo(self, h: int) -> SimpleNamespace:
        self.calls += 1
        return SimpleNamespace(used=(10 + h) * (1 << 30), total=80 * (1 << 30))

    def nvmlDeviceGetUtilizationRates(self, h: int) -> SimpleNamespace:
        return SimpleNamespace(gpu=40 + 50 * h)

    def nvmlDeviceGetPowerUsage(self, h: int) -> int:
        if h == 1:
            raise NotSupported("Not Supported")
        return 300_500  # mW

    def nvmlDeviceGetTemperature(self, h: int, sensor: int) -> int:
        return 60 + h

    def nvmlDeviceGetComputeRunningProcesses(self, h: int) -> list:
        if h == 0:
            return [SimpleNamespace(pid=STRANGER, usedGpuMemory=9 << 30)]
        return [
            SimpleNamespace(pid=ME, usedGpuMemory=3 << 30),
            SimpleNamespace(pid=CHILD, usedGpuMemory=5 << 30),
            SimpleNamespace(pid=STRANGER, usedGpuMemory=1 << 30),
        ]


def name(template, stat: str | None = None, device: int = 0) -> str:
    params = {"cluster": "rollout", "device_id": device}
    return template.format(**params, **({"stat": stat} if stat else {}))


def test_reads_every_visible_device_in_catalog_units(caplog) -> None:
    caplog.set_level(logging.INFO, "rlpulse.producer")
    s = NvmlSampler("rollout", nvml=FakeNvml(), environ={}, pids=lambda: {ME, CHILD})
    assert s.start()
    got = s.sample()
    mem = M.GPU_DEVICE_MEMORY
    assert got[name(mem, "memory_used", 1)] == 11.0 and got[name(mem, "memory_total", 0)] == 80.0
    assert got[name(mem, "memory_process", 1)] == 8.0  # this process and its child, not others
    assert got[name(mem, "memory_process", 0)] == 0.0
    assert got[name(M.GPU_UTILIZATION, device=1)] == 0.9
    assert got[name(M.GPU_POWER, device=0)] == 300.5
    assert name(M.GPU_POWER, device=1) not in got  # not supported on that board
    assert got[name(M.GPU_TEMPERATURE, device=1)] == 61.0
    assert all(n in M.CATALOG for n in got)
    s.sample()
    assert caplog.text.count("power not readable") == 1  # noted once


def test_visible_devices_follow_cuda_visible_devices() -> None:
    nvml = FakeNvml()
    s = NvmlSampler(
        "rollout", nvml=nvml, environ={"CUDA_VISIBLE_DEVICES": "GPU-bbbb"}, pids=lambda: {ME}
    )
    assert s.start()
    got = s.sample()
    # Physical GPU 1 is this process's device 0.
    assert got[name(M.GPU_DEVICE_MEMORY, "memory_used", 0)] == 11.0
    assert got[name(M.GPU_DEVICE_MEMORY, "memory_process", 0)] == 3.0
    assert not any(n.endswith("/1/memory_used") for n in got)
    s = NvmlSampler("rollout", nvml=FakeNvml(), environ={"CUDA_VISIBLE_DEVICES": ""})
    assert not s.start() and s.off_reason == "no GPU visible to this process"


def test_without_nvml_it_is_off_says_why_once_and_never_raises(caplog) -> None:
    caplog.set_level(logging.INFO, "rlpulse.producer")

    class Missing:
        def nvmlInit(self) -> None:
            raise RuntimeError("NVML Shared Library Not Found")

    s = NvmlSampler("critic", nvml=Missing())
    assert not s.start() and not s.start()
    assert s.sample() == {}
    assert caplog.text.count("GPU state not reported") == 1
    assert "NVML Shared Library Not Found" in caplog.text


def test_memory_process_is_left_out_when_nvml_cannot_see_our_processes(caplog) -> None:
    """In a container with its own PID namespace our pids never appear: no false zero."""
    caplog.set_level(logging.INFO, "rlpulse.producer")
    s = NvmlSampler("rollout", nvml=FakeNvml(), environ={}, pids=lambda: {123456})
    s.start()
    got = s.sample()
    assert not any("memory_process" in n for n in got)
    assert "PID namespace" in caplog.text


def test_the_sender_reads_gpus_at_phase_ends_and_periodically_at_the_current_step(inbox) -> None:
    nvml = FakeNvml()
    sampler = NvmlSampler("rollout", nvml=nvml, environ={}, pids=lambda: {ME})
    p = Producer(
        inbox.address,
        run="r",
        role="rollout",
        nvml=sampler,
        config=ProducerConfig(gpu_sample_s=0.05),
    )
    p.log({"x": 1.0}, step=0)
    time.sleep(0.3)  # periodic readings at step 0
    with p.phase("rollout/generate", step=1):
        pass
    p.step_done(1)
    assert p.flush(5)  # the done is through the sender
    calls = nvml.calls
    time.sleep(0.3)  # step 1 is done: no reading is tagged with a finished step
    assert nvml.calls == calls
    p.close()
    got = entries(inbox.receive(until=has_bye))
    used = name(M.GPU_DEVICE_MEMORY, "memory_used", 1)
    readings = [e for e in got if used in e.names]
    assert {e.step for e in readings} == {0, 1} and len(readings) >= 3
    first_log = next(e for e in got if "x" in e.names)
    for e in readings:  # a reading carries its step's own time, never moving the step's end
        if e.step == 0:
            assert e.time == first_log.time
    assert nvml.inits == 1


def test_gpu_sample_s_zero_turns_readings_off(inbox) -> None:
    nvml = FakeNvml()
    p = Producer(
        inbox.address,
        run="r",
        role="rollout",
        nvml=NvmlSampler("rollout", nvml=nvml, environ={}),
        config=ProducerConfig(gpu_sample_s=0),
    )
    with p.phase("rollout/generate", step=0):
        pass
    p.close()
    inbox.receive(until=has_bye)
    assert nvml.inits == 0 and nvml.calls == 0


class FakeNvmlV2(FakeNvml):
    """A driver with NVML's v2 memory reading: ``used`` leaves out the 512 MiB the driver
    reserves for itself, as ``nvidia-smi`` shows it; v1 counts them as used."""

    nvmlMemory_v2 = 0x2000028

    def __init__(self, v2_works: bool = True) -> None:
        super().__init__()
        self.v2_works = v2_works

    def nvmlDeviceGetMemoryInfo(self, h: int, version: int | None = None) -> SimpleNamespace:
        self.calls += 1
        used, reserved = (10 + h) * (1 << 30), 512 << 20
        if version is None:
            return SimpleNamespace(used=used + reserved, total=80 * (1 << 30))
        if not self.v2_works:
            raise NotSupported("Function Not Found")
        assert version == self.nvmlMemory_v2
        return SimpleNamespace(used=used, reserved=reserved, total=80 * (1 << 30))


def test_memory_used_is_what_nvidia_smi_shows_where_nvml_has_the_v2_reading() -> None:
    sampler = NvmlSampler("rollout", nvml=FakeNvmlV2(), environ={}, pids=lambda: {ME})
    assert sampler.start()
    readings = sampler.sample()
    assert readings[name(M.GPU_DEVICE_MEMORY, "memory_used")] == 10.0
    assert readings[name(M.GPU_DEVICE_MEMORY, "memory_used", 1)] == 11.0


def test_without_the_v2_reading_memory_used_falls_back_to_v1_and_says_so(caplog) -> None:
    caplog.set_level(logging.INFO, "rlpulse.producer")
    fake = FakeNvmlV2(v2_works=False)
    sampler = NvmlSampler("rollout", nvml=fake, environ={}, pids=lambda: {ME})
    assert sampler.start()
    for _ in range(2):
        readings = sampler.sample()
        assert readings[name(M.GPU_DEVICE_MEMORY, "memory_used")] == 10.5
    assert caplog.text.count("v2 memory reading is unavailable") == 1
    assert fake.calls == 5  # one failed v2 try, then v1 for each device and reading
