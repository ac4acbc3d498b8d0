"""Time and memory of one worker phase, as ROLL's state-offload manager measures them.

Inside ``with producer.phase("actor_train/train_step", step=s, onload=..., offload=...):``

1. start: CPU memory, device peaks reset, GPU snapshot ``start/offload``;
2. ``onload()`` (model/optimizer state to the device), timed; snapshot ``start/onload``;
3. the body, timed as ``execute``; snapshot ``end/onload`` with ``max_*_frac``;
4. ``offload()``, timed; snapshot ``end/offload``; CPU memory at the end.

``total`` covers all four. Every metric is logged at once when the phase ends, also when the
body raises (the exception then propagates unchanged). Metric names come from the catalog's
templates.

A framework that loads state inside the work itself (verl's engines move the model to the GPU
when a worker call starts and back when it ends) times those loads with
``phase.part("onload")`` / ``phase.part("offload")`` around them: they count as the phase's
onload and offload (host and GPU), the snapshots between them are taken there, and
``execute`` is what is left.

Host times say how long the caller was busy. On a GPU the host runs ahead of the device, so
each boundary also records a CUDA event on the current stream (a few microseconds, never a
synchronization) and the sender thread reports the device time between them once the last
has passed: ``time/{cluster}/{phase}/gpu/{total,execute,onload,offload}``. A phase that
queues 300 ms of kernels and returns at once shows ~0 s of host ``execute`` and 300 ms of
GPU ``execute``. The end of a phase also has the sender read the GPUs through NVML
(``rlpulse.producer.gpustate``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Any, Protocol, SupportsIndex

from rlpulse.producer.deferred import DeviceValue, Pending, PhaseTimer
from rlpulse.producer.memory import DeviceMemory, MemoryProbe
from rlpulse.schemas.metrics import MEMORY_CPU, MEMORY_GPU, TIME_PHASE, TIME_PHASE_GPU

if TYPE_CHECKING:
    from rlpulse.producer.device import DeviceContext


class Emit(Protocol):
    def __call__(
        self,
        data: Mapping[str, Any],
        step: SupportsIndex,
        waits: tuple[Pending, ...] = (),
        deferred: Mapping[str, DeviceValue] | None = None,
        phase: bool = False,
    ) -> None: ...


@dataclass(frozen=True)
class PhaseHooks:
    """What a phase may ask of its producer, and nothing more: log its metrics at the end
    (with GPU times still to come), the producer's GPU context, and count an error."""

    emit: Emit
    device: Callable[[], DeviceContext | None]
    error: Callable[[str, BaseException], None]


@dataclass(frozen=True)
class PhaseNames:
    """Concrete metric names of one ``{cluster}/{phase}`` infix, built once and cached."""

    cluster: str
    phase: str

    @classmethod
    def parse(cls, infix: str) -> PhaseNames:
        cluster, sep, phase = infix.partition("/")
        if not sep or not cluster or not phase:
            raise ValueError(f"phase infix must be '{{cluster}}/{{phase}}', got {infix!r}")
        names = cls(cluster, phase)
        names.time("total")  # validates both segments against the catalog template
        return names

    def time(self, part: str) -> str:
        return TIME_PHASE.format(cluster=self.cluster, phase=self.phase, part=part)

    def gpu_time(self, part: str) -> str:
        return TIME_PHASE_GPU.format(cluster=self.cluster, phase=self.phase, part=part)

    def cpu(self, when: str, kind: str) -> str:
        return MEMORY_CPU.format(cluster=self.cluster, phase=self.phase, when=when, kind=kind)

    def gpu(self, when: str, state: str, stat: str, device: int) -> str:
        return MEMORY_GPU.format(
            cluster=self.cluster,
            phase=self.phase,
            when=when,
            state=state,
            stat=stat,
            device_id=device,
        )


class Phase:
    """Context manager returned by :meth:`Producer.phase`.

    >>> # with producer.phase("actor_train/train_step", step=3, onload=load, offload=unload):
    >>> #     train_one_step()
    """

    def __init__(
        self,
        hooks: PhaseHooks,
        names: PhaseNames | None,
        step: SupportsIndex,
        probe: MemoryProbe,
        onload: Callable[[], object] | None = None,
        offload: Callable[[], object] | None = None,
    ) -> None:
        self._hooks = hooks
        self._names = names
        self._step = step
        self._probe = probe
        self._onload = onload
        self._offload = offload
        self._metrics: dict[str, float] = {}
        self._timer: PhaseTimer | None = None
        self._inner = 0.0
        """Seconds of the body's own loads (:meth:`part`), left out of ``execute``."""
        self._work_ended = False
        """Whether the end/onload snapshot was taken (at the body's first offload)."""
        self._once: set[str] = set()

    def _gpu(self, when: str, state: str, fractions: bool = False) -> None:
        names = self._names
        assert names is not None
        for device, mem in self._probe.devices().items():
            self._add_device(names, when, state, device, mem, fractions)

    def _add_device(
        self,
        names: PhaseNames,
        when: str,
        state: str,
        device: int,
        mem: DeviceMemory,
        fractions: bool,
    ) -> None:
        m = self._metrics
        m[names.gpu(when, state, "allocated", device)] = mem.allocated
        m[names.gpu(when, state, "reserved", device)] = mem.reserved
        m[names.gpu(when, state, "max_allocated", device)] = mem.max_allocated
        m[names.gpu(when, state, "max_reserved", device)] = mem.max_reserved
        if fractions and mem.total > 0:
            m[names.gpu(when, state, "max_allocated_frac", device)] = mem.max_allocated / mem.total
            m[names.gpu(when, state, "max_reserved_frac", device)] = mem.max_reserved / mem.total

    def __enter__(self) -> Phase:
        self._t0 = time.perf_counter()
        if self._names is None:  # not measured, but the caller's state still moves
            if self._onload is not None:
                self._onload()
            return self
        try:
            device = self._hooks.device()
            self._timer = device.phase_timer() if device is not None else None
        except Exception as exc:  # a CUDA error must not break training
            self._hooks.error("phase GPU timer", exc)
        try:
            rss, vms = self._probe.cpu()
            self._metrics[self._names.cpu("start", "rss")] = rss
            self._metrics[self._names.cpu("start", "vms")] = vms
            self._probe.reset_peaks()
            self._gpu("start", "offload")
        except Exception as exc:  # a probe must never break training
            self._hooks.error("phase probe", exc)
        if self._onload is not None:
            t = time.perf_counter()
            self._onload()
            self._metrics[self._names.time("onload")] = time.perf_counter() - t
            self._mark_once("onloaded")
        try:
            self._gpu("start", "onload")
        except Exception as exc:
            self._hooks.error("phase probe", exc)
        self._t_exec = time.perf_counter()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        names = self._names
        if names is None:
            if self._offload is not None:
                self._offload()
            return
        execute = time.perf_counter() - self._t_exec - self._inner
        if self._offload is not None:
            self._mark_once("executed")
        self._end_work()
        if self._offload is not None:
            t = time.perf_counter()
            try:
                self._offload()
            finally:
                key = names.time("offload")
                self._metrics[key] = self._metrics.get(key, 0.0) + time.perf_counter() - t
        try:
            self._gpu("end", "offload")
            rss, vms = self._probe.cpu()
            self._metrics[names.cpu("end", "rss")] = rss
            self._metrics[names.cpu("end", "vms")] = vms
        except Exception as err:
            self._hooks.error("phase probe", err)
        self._metrics[names.time("execute")] = execute
        self._metrics[names.time("total")] = time.perf_counter() - self._t0
        timer = self._timer
        if timer is not None and self._mark("end"):
            times = {names.gpu_time(part): t for part, t in timer.times().items()}
            self._hooks.emit(self._metrics, self._step, (timer,), times, phase=True)
        else:
            self._hooks.emit(self._metrics, self._step, phase=True)

    def add(self, data: Mapping[str, Any]) -> None:
        """Log ``data`` with the phase's own metrics, in the one ``log()`` call its end makes,
        so the collector reads them with the phase's span: a generation's
        ``rollout/response/finish`` and ``rollout/response/longest`` (the step ledger's
        rollout tail and its engine). Values as ``log()`` takes them; never raises.

        >>> # with producer.phase("rollout/generate", step=3) as phase:
        >>> #     phase.add({"rollout/response/longest": 60})
        """
        if self._names is not None:
            try:
                self._metrics.update(data)
            except Exception as exc:  # an odd mapping must not break training
                self._hooks.error("phase add", exc)

    @contextmanager
    def part(self, name: str) -> Iterator[None]:
        """Time an ``onload`` or ``offload`` the body does itself, as the phase's own: its
        seconds add to ``time/.../onload`` (or ``offload``) and are left out of ``execute``;
        the first onload's end and the first offload's start are the GPU boundaries and the
        ``start/onload`` and ``end/onload`` snapshots. A no-op on a phase not measured.

        >>> # with producer.phase("actor/train_step", step=s) as phase:
        >>> #     with phase.part("onload"): model.to("cuda")
        >>> #     train(); with phase.part("offload"): model.to("cpu")
        """
        if name not in ("onload", "offload"):
            raise ValueError(f"a phase's part is onload or offload, not {name!r}")
        names = self._names
        if names is None:
            yield
            return
        if name == "offload":
            self._mark_once("executed")
            self._end_work()
        t = time.perf_counter()
        try:
            yield
        finally:
            seconds = time.perf_counter() - t
            self._inner += seconds
            key = names.time(name)
            self._metrics[key] = self._metrics.get(key, 0.0) + seconds
            if name == "onload" and self._mark_once("onloaded"):
                try:
                    self._gpu("start", "onload")
                except Exception as exc:
                    self._hooks.error("phase probe", exc)

    def _end_work(self) -> None:
        """The end/onload snapshot (with fractions), once: at the body's first offload, or at
        the end."""
        if self._work_ended:
            return
        self._work_ended = True
        try:
            self._gpu("end", "onload", fractions=True)
        except Exception as err:
            self._hooks.error("phase probe", err)

    def _mark_once(self, point: str) -> bool:
        """:meth:`_mark` unless ``point`` was passed already; whether this is the first time
        (also without a GPU timer: the host-side boundary is still this one)."""
        if point in self._once:
            return False
        self._once.add(point)
        self._mark(point)
        return True

    def _mark(self, point: str) -> bool:
        """Record a timing marker; on a CUDA error give the timer up (counted)."""
        if self._timer is None:
            return False
        try:
            self._timer.mark(point)
            return True
        except Exception as exc:
            self._hooks.error("phase GPU timer", exc)
            self._timer = None
            return False
