"""GPU state read through NVML, in the sender thread only.

torch's allocator statistics (``rlpulse.producer.memory``) miss the CUDA context, NCCL buffers, and
every other process on the device, such as a vLLM engine that a rollout worker started. NVML
sees the device as the driver does. Per visible device this reads:

* ``memory_used`` / ``memory_total``: the whole device, every process and context included;
* ``memory_process``: this worker process and its child processes (a vLLM engine core runs
  as a child of the rollout worker, so its memory shows up under the rollout role);
* ``utilization`` (share of time a kernel ran), ``power`` (W) and ``temperature`` (°C).

Visible devices follow ``CUDA_VISIBLE_DEVICES`` (indices or ``GPU-`` UUIDs; ``device_id`` is
the local index, as torch numbers them). Without NVML, a driver or a visible device the
sampler is off, says so once, and never raises; a reading a device does not support (power
on some boards, per-process memory inside some containers) is left out and noted once.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Callable, Mapping
from typing import Any

import psutil

from rlpulse.producer.stats import Counters
from rlpulse.schemas.catalog import Template
from rlpulse.schemas.metrics import GPU_DEVICE_MEMORY, GPU_POWER, GPU_TEMPERATURE, GPU_UTILIZATION

log = logging.getLogger("rlpulse.producer")
GIB = float(1 << 30)


def _utilization(nvml: Any, handle: Any) -> float:
    return nvml.nvmlDeviceGetUtilizationRates(handle).gpu / 100.0


def _power(nvml: Any, handle: Any) -> float:
    return nvml.nvmlDeviceGetPowerUsage(handle) / 1000.0  # mW -> W


def _temperature(nvml: Any, handle: Any) -> float:
    return float(nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU))


_GAUGES: dict[str, tuple[Template, Callable[[Any, Any], float]]] = {
    "utilization": (GPU_UTILIZATION, _utilization),
    "power": (GPU_POWER, _power),
    "temperature": (GPU_TEMPERATURE, _temperature),
}
"""Per-device readings besides memory: their catalog template and how NVML gives them."""


def own_tree() -> set[int]:
    """This process and its descendants."""
    me = psutil.Process()
    pids = {me.pid}
    with contextlib.suppress(psutil.Error):
        pids.update(child.pid for child in me.children(recursive=True))
    return pids


class NvmlSampler:
    """Reads per-device state through NVML. ``nvml`` (the ``pynvml`` module) and ``pids`` are
    injectable for tests; :meth:`start` runs in the sender thread (``import pynvml`` and
    ``nvmlInit`` cost tens of milliseconds)."""

    def __init__(
        self,
        role: str,
        *,
        nvml: Any | None = None,
        environ: Mapping[str, str] = os.environ,
        pids: Callable[[], set[int]] = own_tree,
    ) -> None:
        self.role = role
        self._nvml: Any = nvml
        self._environ = environ
        self._pids = pids
        self._handles: list[tuple[int, Any]] = []
        self._started = False
        self.off_reason: str | None = None
        self._noted: set[str] = set()
        self._names: dict[tuple[int, str], str] = {}
        self._memory_v2 = True

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> bool:
        """Initialise NVML and find the visible devices; False (with ``off_reason``) when
        there is nothing to read. Safe to call again."""
        if self._started:
            return bool(self._handles)
        self._started = True
        try:
            if self._nvml is None:
                import pynvml

                self._nvml = pynvml
            self._nvml.nvmlInit()
        except Exception as exc:  # ImportError, NVMLError_LibraryNotFound, driver missing
            return self._off(f"NVML unavailable ({type(exc).__name__}: {exc})")
        try:
            self._handles = self._visible()
        except Exception as exc:
            return self._off(f"cannot list GPUs through NVML ({type(exc).__name__}: {exc})")
        if not self._handles:
            return self._off("no GPU visible to this process")
        return True

    def _off(self, reason: str) -> bool:
        self.off_reason = reason
        self._handles = []
        log.info("rlpulse producer (%s): GPU state not reported: %s", self.role, reason)
        return False

    def _visible(self) -> list[tuple[int, Any]]:
        nvml = self._nvml
        spec = self._environ.get("CUDA_VISIBLE_DEVICES")
        if spec is None:
            return [
                (i, nvml.nvmlDeviceGetHandleByIndex(i)) for i in range(nvml.nvmlDeviceGetCount())
            ]
        out = []
        for local, item in enumerate(x.strip() for x in spec.split(",") if x.strip()):
            if item.isdigit():
                out.append((local, nvml.nvmlDeviceGetHandleByIndex(int(item))))
            elif item.startswith("GPU-"):
                out.append((local, nvml.nvmlDeviceGetHandleByUUID(item)))
            else:  # MIG instances and anything else: not mapped
                self._note(f"spec:{item}", f"CUDA_VISIBLE_DEVICES entry {item!r} is not read")
                continue
        return out

    def close(self) -> None:
        if self._handles:
            with contextlib.suppress(Exception):
                self._nvml.nvmlShutdown()
        self._handles = []

    # ------------------------------------------------------------------ reading

    def _note(self, key: str, message: str) -> None:
        if key not in self._noted:
            self._noted.add(key)
            log.info("rlpulse producer (%s): %s", self.role, message)

    def _name(self, device: int, stat: str) -> str:
        name = self._names.get((device, stat))
        if name is None:
            if stat in _GAUGES:
                name = _GAUGES[stat][0].format(cluster=self.role, device_id=device)
            else:
                name = GPU_DEVICE_MEMORY.format(cluster=self.role, device_id=device, stat=stat)
            self._names[(device, stat)] = name
        return name

    def sample(self) -> dict[str, float]:
        """One reading of every visible device, as catalog names -> values; empty when off."""
        if not self._handles:
            return {}
        nvml, out = self._nvml, {}
        ours: dict[int, float] = {}
        pids = self._pids()
        for device, handle in self._handles:
            try:
                memory = self._memory(handle)
                out[self._name(device, "memory_used")] = memory.used / GIB
                out[self._name(device, "memory_total")] = memory.total / GIB
            except Exception as exc:
                self._note(f"memory:{device}", f"GPU {device}: memory not readable ({exc})")
            for stat, (_, read) in _GAUGES.items():
                try:
                    out[self._name(device, stat)] = read(nvml, handle)
                except Exception as exc:  # NVMLError_NotSupported and friends
                    self._note(f"{stat}:{device}", f"GPU {device}: {stat} not readable ({exc})")
            try:
                used = self._process(handle, pids)
            except Exception as exc:
                self._note(f"process:{device}", f"GPU {device}: process list not readable ({exc})")
                continue
            if used is not None:
                ours[device] = used
        if any(v > 0 for v in ours.values()):
            for device, used in ours.items():
                out[self._name(device, "memory_process")] = used / GIB
        elif ours:
            self._note(
                "process",
                "no process of this worker appears in NVML's process lists (idle, or a PID "
                "namespace hides it, as in many containers): memory_process is not reported",
            )
        return out

    def _memory(self, handle: Any) -> Any:
        """The device's memory as ``nvidia-smi`` shows it: NVML's v2 reading, whose ``used``
        leaves out what the driver reserves for itself (the v1 reading counts it as used:
        2.07 GiB against nvidia-smi's 1.60 on an idle H100 holding 1 GiB). v1 where the
        driver or the bindings lack v2."""
        nvml = self._nvml
        version = getattr(nvml, "nvmlMemory_v2", None)
        if version is not None and self._memory_v2:
            try:
                return nvml.nvmlDeviceGetMemoryInfo(handle, version=version)
            except Exception as exc:  # NVMLError_FunctionNotFound on older drivers
                self._memory_v2 = False
                self._note("memory-v2", f"NVML's v2 memory reading is unavailable ({exc})")
        return nvml.nvmlDeviceGetMemoryInfo(handle)

    def _process(self, handle: Any, pids: set[int]) -> float | None:
        """Bytes our processes use on the device; None when NVML withholds the numbers."""
        used = 0
        for proc in self._nvml.nvmlDeviceGetComputeRunningProcesses(handle):
            if proc.pid in pids:
                if proc.usedGpuMemory is None:
                    return None
                used += proc.usedGpuMemory
        return float(used)


class GpuReadings:
    """When the sender thread reads the GPUs through ``nvml`` (at a phase's end, and every
    ``every_s`` seconds while a step is under way; 0 turns it off) and what it logs of them.
    A failed reading is counted (``errors``) and warned about once.

    >>> GpuReadings(None, 1.0, Counters(), print).read() is None
    True
    """

    def __init__(
        self,
        nvml: NvmlSampler | None,
        every_s: float,
        counters: Counters,
        warn_once: Callable[[str, str], None],
    ) -> None:
        self.nvml = nvml
        self.every_s = every_s
        self.counters = counters
        self.warn_once = warn_once
        self.next_at = 0.0
        """When the periodic reading is due (``time.monotonic()``)."""

    def due(self) -> bool:
        return time.monotonic() >= self.next_at

    def read(self) -> dict[str, float] | None:
        """The readings to log now; None when off or when nothing was read."""
        nvml = self.nvml
        if nvml is None or self.every_s <= 0 or not nvml.start():
            return None
        try:
            readings = nvml.sample()
        except Exception as exc:
            self.counters.errors += 1
            self.warn_once("nvml", f"reading the GPUs through NVML failed: {exc!r}")
            return None
        self.next_at = time.monotonic() + self.every_s
        return readings or None

    def close(self) -> None:
        if self.nvml is not None:
            self.nvml.close()
