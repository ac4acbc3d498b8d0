"""``Producer``: the object a training worker logs through.

>>> from rlpulse.producer import Producer, Masked, Weighted
>>> p = Producer("tcp://127.0.0.1:5555", run="r1", role="actor_train", rank=0, world_size=2)
>>> p.log({"actor/pg_loss": Weighted(0.31, 4096), "critic/advantages": Masked(adv, mask)}, step=7)
>>> p.close()
"""

from __future__ import annotations

import atexit
import logging
import os
import sys
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any, SupportsIndex

from rlpulse.producer.buffers import Buffers
from rlpulse.producer.config import DEFAULT, FLUSH_TIMEOUT_S, ProducerConfig
from rlpulse.producer.cuda import cuda_context
from rlpulse.producer.deferred import DeviceValue, Pending
from rlpulse.producer.device import DeviceContext
from rlpulse.producer.encode import INVALID, PASSED, Encoder
from rlpulse.producer.env import (
    curve_from_env,
    default_address,
    expected_roles_from_env,
    resume_from_env,
)
from rlpulse.producer.gpustate import NvmlSampler
from rlpulse.producer.handoff import Call, CallerFirst, Done, Flush, Item, Wake
from rlpulse.producer.hostcopy import HostCopies
from rlpulse.producer.memory import MemoryProbe
from rlpulse.producer.outbox import Identity, Registration
from rlpulse.producer.pending import over_bound
from rlpulse.producer.phase import Phase, PhaseHooks, PhaseNames
from rlpulse.producer.reduce import InvalidValue
from rlpulse.producer.runconfig import prepare
from rlpulse.producer.samples import SampleReducer
from rlpulse.producer.sender import Sender
from rlpulse.producer.sketch import dist_names
from rlpulse.producer.stats import Counters, combine
from rlpulse.producer.steps import as_step
from rlpulse.producer.values import Samples
from rlpulse.schemas.catalog import Catalog
from rlpulse.schemas.endpoint import MetricsUrl
from rlpulse.schemas.errors import SchemaError
from rlpulse.schemas.messages import MAX_STEP
from rlpulse.schemas.metrics import CATALOG
from rlpulse.schemas.protocol import DEFAULT_LIMITS, new_producer_id
from rlpulse.schemas.reductions import Reduction
from rlpulse.wire.transport import CurveKeys, Transport, ZmqTransport

log = logging.getLogger("rlpulse.producer")


class Producer:
    """Sends one worker's metrics to an rlpulse collector, off the training thread.

        ``log(data, step)`` reduces arrays and tensors to mergeable states right away (raw arrays
        never cross the wire), queues the call and returns; a background thread encodes and
        sends. Neither ``log()`` nor ``phase()`` ever raises into the caller or blocks on the
        network: a full queue or an unreachable collector drops, counts (:meth:`stats`) and
        warns once. The counts reach the collector with every heartbeat.

        Who it is: ``run``, ``role``, ``rank`` and ``world_size``; ``expected_roles`` (role ->
        world size) tells the collector the run's whole topology, so it waits for roles that have
        not registered yet instead of emitting without them (default: ``RLPULSE_EXPECTED_ROLES``,
    ``driver=1,actor_train=8``, which verl's setup hook sets). A run name that already ran to its
        end on the collector starts a new attempt there (``name-2``: :attr:`recorded_run`, and a
        warning) unless ``resume`` is true: then the run continues (default: ``RLPULSE_RESUME``,
        or true in a process torchrun restarted). ``reductions`` declares how names outside the
        catalog merge (``{"my/peak": "max"}``); the catalog's own declarations cannot be
        overridden. ``curve`` (or the ``RLPULSE_CURVE_*`` environment variables) turns on
        CurveZMQ encryption and authentication. ``config`` holds the buffers, timings and
        bounds (:class:`~rlpulse.producer.config.ProducerConfig`).

        ``metrics_url`` registers a Prometheus ``/metrics`` endpoint this process serves (a vLLM
        server's, say): while the producer is open, the collector lists it for Prometheus' HTTP
        service discovery, labelled with ``run``, ``role`` and ``rank``. A process that only
        registers its endpoint passes ``logs=False``: it is then no rank of the run (the collector
        never waits for it) and its ``log()`` calls are dropped::

            Producer(run="r1", role="rollout", rank=0, world_size=4, logs=False,
                     metrics_url="http://10.0.0.7:8000/metrics")

        Delivery is acknowledged: up to ``config.max_unacked`` messages are kept and resent until
        the collector has them in its write-ahead log, so a collector restart loses nothing.

        ``address`` is ``tcp://HOST:PORT`` or ``ipc://PATH``; anything else raises
        :class:`~rlpulse.schemas.errors.ConfigError` here, and a producer no collector has
        answered within a few seconds warns once, naming it.

        The rest are injected dependencies, for tests and tools: ``transport`` (default: ZeroMQ
        to ``address``), ``catalog``, ``memory_probe``, ``device`` (GPU pipeline) and ``nvml``.
    """

    def __init__(
        self,
        address: str | None = None,
        *,
        run: str,
        role: str,
        rank: int = 0,
        world_size: int = 1,
        expected_roles: Mapping[str, int] | None = None,
        reductions: Mapping[str, str | Reduction] | None = None,
        metrics_url: str | None = None,
        logs: bool = True,
        resume: bool | None = None,
        curve: CurveKeys | None = None,
        config: ProducerConfig = DEFAULT,
        transport: Transport | None = None,
        catalog: Catalog = CATALOG,
        memory_probe: MemoryProbe | None = None,
        device: DeviceContext | None = None,
        nvml: NvmlSampler | None = None,
    ) -> None:
        limit = DEFAULT_LIMITS.max_label_length  # what the collector accepts in a hello
        if not run or not isinstance(run, str) or len(run) > limit:
            raise ValueError(f"run must be a string of 1..{limit} characters, got {run!r:.200}")
        if not role or not isinstance(role, str) or len(role) > limit:
            raise ValueError(f"role must be a string of 1..{limit} characters, got {role!r:.200}")
        if not (isinstance(world_size, int) and world_size >= 1):
            raise ValueError(f"world_size must be a positive integer, got {world_size!r}")
        if not (isinstance(rank, int) and 0 <= rank < world_size):
            raise ValueError(f"rank must be an integer in [0, {world_size}), got {rank!r}")
        if metrics_url is not None:
            try:
                MetricsUrl.parse(metrics_url)
            except SchemaError as exc:
                raise ValueError(f"metrics_url: {exc.detail}") from None
        if not logs and not metrics_url:
            raise ValueError("logs=False registers a metrics endpoint only: give metrics_url")
        self.address = address or default_address()
        self.run, self.role, self.rank, self.world_size = run, role, rank, world_size
        self.config = config
        self.logs = logs
        self._queue: deque[Item] = deque()
        self._wake = Wake()
        self._caller = CallerFirst()
        self._closed = False
        self._close_lock = threading.Lock()
        self._warned: set[str] = set()
        self._phase_names: dict[str, PhaseNames | None] = {}
        self._probe = memory_probe or MemoryProbe()
        self._device = device
        self._device_known = device is not None
        """GPU routing is decided once torch is imported (by the caller, never by us)."""
        self._counters = Counters()  # the caller's; the sender thread keeps its own
        self._phase_hooks = PhaseHooks(self._log, self._device_context, self._note_error)
        identity = Identity(
            run,
            role,
            rank,
            world_size,
            dict(expected_roles_from_env() if expected_roles is None else expected_roles),
            metrics_url=metrics_url or "",
            logs=logs,
            resume=resume_from_env() if resume is None else bool(resume),
        )
        declared = {k: Reduction.parse(v) for k, v in (reductions or {}).items()}
        self._dists = dist_names(catalog)  # names whose samples are also sketched
        self._copied = 0
        """Bytes of host samples ``log()`` copied for the sender (its ``released_bytes``
        says how many it has reduced and let go)."""
        self._copy_limit = config.snapshot_limit_bytes
        self._pending = 0
        """Bytes of ``Samples`` rows ``log()`` handed to the sender (its ``released_pending``
        says how many it has reduced or dropped): ``rlpulse.producer.pending``."""
        self._pending_limit = config.pending_limit_bytes
        self._buffers = Buffers()
        self._copies = HostCopies(self._dists, self._buffers)
        samples = SampleReducer(  # on the sender thread
            (role, rank), config.sample_limits(), warn_once=self._warn_once
        )
        self._sender = Sender(
            config=config,
            registration=Registration(identity, new_producer_id()),
            queue=self._queue,
            wake=self._wake,
            transport=transport
            or ZmqTransport(self.address, sndhwm=config.sndhwm, curve=curve or curve_from_env()),
            encoder=Encoder(catalog, declared, samples.counters, self._warn_once, samples=samples),
            stats=self.stats,
            warn_once=self._warn_once,
            nvml=nvml if nvml is not None else NvmlSampler(role),
            buffers=self._buffers,
            caller=self._caller,
            address=self.address,
        )
        self._row_bytes = self._sender.row_bytes
        self._sender.start()
        ref = weakref.ref(self)

        def close_at_exit() -> None:
            producer = ref()
            if producer is not None:
                producer.close()

        self._atexit = close_at_exit
        atexit.register(close_at_exit)

    # ------------------------------------------------------------------ the hot path

    def log(self, data: Mapping[str, Any], step: SupportsIndex) -> None:
        """Queue the metrics of ``step``. Never raises, never blocks, never waits for a GPU.

        Values: ``int``/``float`` (one sample), numpy arrays and torch tensors (every element
        a sample), :class:`Masked`, :class:`Weighted`, :class:`Fraction`, :class:`Samples`
        (rows, reduced by the sender thread, as GPU tensors are: ``rlpulse.producer.device``).
        ``step``: any integer from 0 (a numpy integer, a 0-d integer array or CPU tensor too:
        ``rlpulse.producer.steps``); a call with anything else is dropped, counted and warned.
        """
        caller = self._caller
        caller.enter()  # the sender waits meanwhile (CallerFirst)
        try:
            self._log(data, step)
        finally:
            caller.leave()

    def _log(
        self,
        data: Mapping[str, Any],
        step: SupportsIndex,
        waits: tuple[Pending, ...] = (),
        deferred: Mapping[str, DeviceValue] | None = None,
        phase: bool = False,
    ) -> None:
        """``log()``, plus values already deferred to the device (a phase's GPU times) with
        the work they wait for, and whether this ends a phase (the sender then reads the
        GPUs' state)."""
        call = None
        try:
            c = self._counters
            if self._closed:
                c.invalid += 1
                self._warn_once("closed", "log() after close(): dropped")
                return
            if not self.logs:
                c.invalid += 1
                self._warn_once("no-logs", "log() of a producer made with logs=False: dropped")
                return
            # A plain int passes; a numpy int, a tensor... is read once (steps.py)
            at = step if type(step) is int and 0 <= step <= MAX_STEP else self._step(step)
            if at is None:
                return
            if len(self._queue) >= self.config.max_pending:
                c.dropped_queue_full += 1
                self._warn_once(
                    "full",
                    f"{self.config.max_pending} log() calls are queued unsent; dropping "
                    "(counted in stats())",
                )
                return
            payload = dict(data)
            # Inlined _device_context(): this is the hot path.
            device = self._device if self._device_known else self._find_device()
            host: list[str] = []
            pending, incomplete = 0, False
            for name, value in payload.items():
                if type(value) in PASSED:  # numbers, reduced samples: the sender reads them
                    continue
                if type(value) is Samples:  # the sender reduces the rows: held within a bound
                    held = self._pending + pending - self._sender.released_pending
                    size = self._row_bytes.estimate(name, value, held > 0)
                    if held + size <= self._pending_limit:
                        pending += size
                    else:
                        self._unreduced(payload, name, at, size, held)
                        incomplete = True
                    continue
                try:
                    if device and device.owns(value):
                        if call is None:
                            call = device.call()
                        payload[name] = call.add(value, sketch=name in self._dists)
                    else:
                        host.append(name)
                except InvalidValue as exc:
                    self._invalid(payload, name, exc)
            copied = 0
            if host:  # copied (or reduced now), bounded by the copies the sender still holds
                room = self._copy_limit - (self._copied - self._sender.released_bytes)
                copied = self._copies.copy(payload, host, room, self._invalid)
            if call is not None:
                waits = (*waits, *call.seal())
            if deferred:
                payload.update(deferred)
            self._copied += copied
            self._pending += pending
            self._queue.append(
                Call(at, time.time(), payload, waits, phase, copied, pending, incomplete)
            )
            c.logged += 1
            if not self._wake.is_set():
                self._wake.set()
        except Exception as exc:  # a bug, an odd mapping or a CUDA error must not reach training
            if call is not None:
                call.abandon()
            self._note_error("log()", exc)

    def _step(self, step: SupportsIndex) -> int | None:
        """``step`` as an int (:func:`~rlpulse.producer.steps.as_step`); None, counted and
        warned about once, when it is no step."""
        try:
            return as_step(step)
        except Exception as exc:  # BadStep, or an odd __index__ that a bug of ours let by
            self._counters.invalid += 1
            self._warn_once(f"step:{type(step).__name__}", f"{exc}: call dropped")
            return None

    def _unreduced(self, payload: dict, name: str, step: int, size: int, held: int) -> None:
        payload[name] = INVALID  # past pending_limit_bytes: its step goes out incomplete
        self._counters.dropped_unreduced += 1
        self._warn_once("unreduced", over_bound(name, step, size, held, self._pending_limit))

    def _invalid(self, payload: dict, name: str, exc: InvalidValue) -> None:
        payload[name] = INVALID
        self._counters.invalid += 1
        self._warn_once(f"value:{name}", f"{name}: {exc}; that metric is dropped")

    def _device_context(self) -> DeviceContext | None:
        """This producer's GPU context (None without CUDA, or before torch is imported)."""
        return self._device if self._device_known else self._find_device()

    def _find_device(self) -> DeviceContext | None:
        """The CUDA context once torch is imported (never imported by us); until then None,
        and asked again at the next call."""
        if sys.modules.get("torch") is None:
            return None
        self._device = cuda_context(self.config.snapshot_limit_bytes)
        self._device_known = True
        return self._device

    def phase(
        self,
        infix: str,
        *,
        step: SupportsIndex,
        onload: Callable[[], object] | None = None,
        offload: Callable[[], object] | None = None,
    ) -> Phase:
        """Time a phase and take memory snapshots around it (see ``rlpulse.producer.phase``)."""
        names = self._phase_names.get(infix, ...)
        if names is ...:
            try:
                names = PhaseNames.parse(infix)
            except ValueError as exc:
                self._warn_once(f"phase:{infix}", f"{exc}; the phase runs but is not measured")
                names = None
            self._phase_names[infix] = names
        return Phase(self._phase_hooks, names, step, self._probe, onload, offload)

    def step_done(self, step: SupportsIndex) -> None:
        """Say this rank has finished every step up to ``step`` (logging a later step says so
        too). A rank that logs nothing at some steps calls this so the collector need not wait
        for it."""
        if self._closed or not self.logs:
            return
        at = step if type(step) is int and 0 <= step <= MAX_STEP else self._step(step)
        if at is None:
            return
        self._queue.append(Done(at))
        self._wake.set()

    def run_config(self, config: Mapping[str, Any]) -> bool:
        """Send the run's configuration (its hyper-parameters) once, from the driver: the
        collector keeps it with the run and its sinks record it (TensorBoard's hparams, the W&B
        and SwanLab run's config, ``config`` in the jsonl). It rides in every hello; a later
        call replaces it. Never raises: what is no plain data is left out and a config too large
        for a hello is not sent, each counted (``stats()["invalid"]``) and named in a warning
        (``rlpulse.producer.runconfig``). Returns whether it will be sent."""
        try:
            data = prepare(config, self._counters, self._warn_once)
        except Exception as exc:  # a mapping that raises when read: never into the caller
            self._note_error("run_config()", exc)
            return False
        if data is None or self._closed or not self.logs:
            return False
        self._sender.registration.config = data  # the sender's next hello carries it
        self._wake.set()
        return True

    # ------------------------------------------------------------------ lifecycle

    def flush(self, timeout: float = FLUSH_TIMEOUT_S) -> bool:
        """Wait until the collector has acknowledged everything logged so far; False on
        timeout (the data stays buffered and is still delivered later)."""
        if self._closed or not self._sender.is_alive():
            return False
        done = threading.Event()
        self._queue.append(Flush(done))
        self._wake.set()
        return done.wait(timeout)

    def close(self, timeout: float | None = None) -> None:
        """Send what is queued, say goodbye and stop, within ``timeout`` seconds (default
        ``config.close_timeout_s``) even when no collector is listening. Safe to call twice."""
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
        atexit.unregister(self._atexit)
        limit = self.config.close_timeout_s if timeout is None else timeout
        self._sender.stop(limit)
        self._sender.join(limit + 1.0)
        if self._sender.is_alive():
            log.error(
                "rlpulse producer %s/%s: sender did not stop within %.1fs; abandoned",
                self.role,
                self.rank,
                limit,
            )

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ accounting

    @property
    def recorded_run(self) -> str:
        """The run the collector records this producer's data under: ``run``, or a new
        attempt of it (``run-2``...) when ``run`` had already ended there and this producer
        does not resume it (known once the collector has answered)."""
        return self._sender.recorded_run or self.run

    def stats(self) -> dict[str, int]:
        """Counters: calls queued (``logged``), messages sent and resent, messages awaiting
        acknowledgement, calls dropped (caller queue full, unacked buffer full, or never sent
        when close() gave up: ``dropped_send``; those sent but not acknowledged by then, which
        the collector may hold, are ``unconfirmed``, not dropped; delivered but left out by the
        collector, which says so in its acks: ``dropped_late`` for steps it had emitted,
        ``dropped_conflict`` while another process held this rank, ``dropped_rejected`` in
        messages it rejected, ``dropped_names`` values of names beyond its run's bound), calls
        larger than a message (``dropped_oversized``), invalid values and names, non-finite
        samples left out, errors; ``Samples`` rows dropped as bad and texts cut (rows), and
        values dropped before the sender reduced them (``dropped_unreduced``: their steps go
        out partial naming this rank; ``rlpulse.producer.pending``)."""
        return combine(self._counters, self._sender.counters, unacked=self._sender.unacked)

    def _warn_once(self, key: str, message: str) -> None:
        if key in self._warned:
            return
        self._warned.add(key)
        log.warning(
            "rlpulse producer %s/%s (pid %d): %s", self.role, self.rank, os.getpid(), message
        )

    def _note_error(self, where: str, exc: BaseException) -> None:
        self._counters.errors += 1
        self._warn_once(
            f"error:{where}:{type(exc).__name__}", f"{where} failed and was skipped: {exc!r}"
        )
