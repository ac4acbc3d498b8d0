"""ROLL's workers, hooked: exact loss metrics of every training micro-batch, every worker call
as a phase of its own rank, and the step's end as the driver says it.

:class:`WorkerHook` is installed in every process of a ROLL job by the worker setup hook
(``rlpulse.producer.integrations.roll.worker_setup``), before ROLL's worker modules are
imported there, and wraps them as they are (``onimport.OnImport``):

* ``loss_func`` of rlvr's and agentic's ``ActorWorker`` and of ``CriticWorker``: ROLL's own
  function runs unchanged (its loss bit-identical); around it, the log-probabilities ROLL
  computes (``strategy.op_compute_log_probs``) and the old ones it uses
  (``get_old_log_probs_with_cache``) are kept for the call, and the micro-batch's states
  (``roll_states``) are logged for ``meta_info["global_step"]``, only by the ranks ROLL collects
  (tensor-parallel rank 0, last pipeline stage, context-parallel rank 0: once per
  data-parallel rank). No collective, no ``.item()``: tensors go to the producer.
* every method ROLL's ``@register`` exposes to the driver, and ``start_model_update``: a phase
  ``{cluster}/{method}`` (``{cluster}/model_update``) of the worker's producer, at the step the
  call carries (a ``DataProto``'s ``meta_info["global_step"]``, or ``global_step=``), else the
  step the process is in (``phases.StepClock``).

Each worker process logs through one producer: its ROLL cluster as the role, ``RANK`` of
``WORLD_SIZE``, the run and collector of its pipeline config's ``tracker_kwargs`` (only with
``track_with: rlpulse``). :func:`step_over` runs in the worker when the driver ends a step (a
Ray ``__ray_call__``): the worker has finished it, and calls without a step now belong to the
next.

>>> # WorkerHook().install()  (what worker_setup does)
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from functools import wraps
from types import ModuleType
from typing import Any

from rlpulse.producer.client import Producer
from rlpulse.producer.env import expected_roles_from_env
from rlpulse.producer.integrations import roll_compat as C, roll_config, roll_states as S
from rlpulse.producer.integrations.onimport import OnImport
from rlpulse.producer.integrations.phases import MARK, Call, StepClock, as_phase
from rlpulse.producer.integrations.roll_settings import (
    RollSettings,
    resumes,
    tracked,
    tracker_kwargs,
)

log = logging.getLogger("rlpulse.integrations.roll")

CLOCK = StepClock()
"""The step this process is in."""

_PRODUCERS: dict[tuple[str, str, int, int], Producer] = {}
_LOCK = threading.Lock()
_warned: set[str] = set()
_HOOKED = "_rlpulse_loss_of"


def _warn(key: str, message: str) -> None:
    if key not in _warned:
        _warned.add(key)
        log.warning("rlpulse ROLL hook: %s", message)


def worker_settings(worker: Any) -> RollSettings | None:
    """The settings of a ROLL worker whose pipeline tracks with rlpulse, else None."""
    config = getattr(worker, "pipeline_config", None)
    if config is None or not tracked(config):
        return None
    return RollSettings.from_config(config, tracker_kwargs(config))


def producer_for(worker: Any, factory: Callable[..., Producer] = Producer) -> Producer | None:
    """The producer of this worker process (made at the first call; None where the pipeline
    does not track with rlpulse or the worker has no pipeline config yet)."""
    settings = worker_settings(worker)
    if settings is None:
        return None
    role = str(getattr(worker, "cluster_name", None) or "worker")
    rank, world = int(getattr(worker, "rank", 0)), int(getattr(worker, "world_size", 1))
    key = (role, settings.run, rank, world)
    producer = _PRODUCERS.get(key)
    if producer is None:
        with _LOCK:
            producer = _PRODUCERS.get(key)
            if producer is None:
                if not resumes(worker.pipeline_config):
                    CLOCK.start(0)  # a fresh run starts at step 0
                expected = {settings.role: 1, **expected_roles_from_env()}
                producer = _PRODUCERS[key] = factory(
                    settings.address,
                    run=settings.run,
                    role=role,
                    rank=rank,
                    world_size=world,
                    expected_roles=expected,
                    reductions=S.REDUCTIONS,
                    resume=resumes(worker.pipeline_config),
                    config=settings.producer,
                )
    return producer


def step_over(worker: Any, step: int) -> None:
    """The driver has ended ``step`` (run in the worker through Ray's ``__ray_call__``)."""
    CLOCK.finished(step)
    for producer in list(_PRODUCERS.values()):
        producer.step_done(step)


def close_all(worker: Any, timeout: float) -> int:
    """Flush and close this process's producers (the driver's exit, before Ray stops the
    workers); the number closed."""
    closed = 0
    for producer in list(_PRODUCERS.values()):
        producer.close(timeout)
        closed += 1
    return closed


def step_of(args: tuple[Any, ...], kwargs: dict[str, Any]) -> int | None:
    """The step a ROLL worker call carries: ``global_step=``, or a ``DataProto``'s
    ``meta_info["global_step"]``."""
    step = kwargs.get("global_step")
    if step is None:
        for value in (*args, *kwargs.values()):
            meta = getattr(value, "meta_info", None)
            if isinstance(meta, dict) and meta.get("global_step") is not None:
                step = meta["global_step"]
                break
    return int(step) if isinstance(step, int) else None


def infix_of(worker: Any, method: str) -> str | None:
    settings = worker_settings(worker)
    if settings is None or not settings.phases:
        return None
    cluster = getattr(worker, "cluster_name", None) or "worker"
    return f"{cluster}/{C.PHASE_NAMES.get(method, method)}"


def _phase(method: Callable[..., Any], name: str) -> Callable[..., Any]:
    """``method`` of a ROLL worker, each call the phase ``infix_of`` names on the worker's own
    producer, at the step the call carries, else the process's (``CLOCK``)."""

    def describe(worker: Any, *args: Any, **kwargs: Any) -> Call | None:
        producer = producer_for(worker)  # first: making it may start the clock
        infix = infix_of(worker, name) if producer is not None else None
        if producer is None or infix is None:
            return None
        step = CLOCK.step_for(step_of(args, kwargs))
        if step is None:
            CLOCK.counts["unstepped"] += 1
            return None
        CLOCK.counts["phases"] += 1
        return Call(producer, infix, step)

    return as_phase(method, describe)


class WorkerHook:
    """Wraps ROLL's worker classes in this process (see the module docstring)."""

    def __init__(self, exact: bool = True, phases: bool = True) -> None:
        self.exact = exact
        self.phases = phases
        self._on_import: OnImport | None = None
        self._undo: list[tuple[Any, str, Any]] = []

    def install(self) -> None:
        if self._on_import is None:
            names = [*C.LOSS_CLASSES] if self.exact else []
            if self.phases:
                names += [C.DECORATOR, *C.MODEL_UPDATE_CLASSES]
            self._on_import = OnImport(set(names), self._wrap_module)
            self._on_import.install()

    def uninstall(self) -> None:
        if self._on_import is not None:
            self._on_import.uninstall()
            self._on_import = None
        while self._undo:
            owner, name, original = self._undo.pop()
            setattr(owner, name, original)

    def _set(self, owner: Any, name: str, value: Any) -> None:
        self._undo.append((owner, name, vars(owner)[name]))
        setattr(owner, name, value)

    def _wrap_module(self, module: ModuleType) -> None:
        name = module.__name__
        if name == C.DECORATOR and self.phases:
            register = vars(module).get("register")
            if callable(register) and not getattr(register, MARK, None):
                self._set(module, "register", self._register(register))
        if self.phases:
            for cls_name in C.MODEL_UPDATE_CLASSES.get(name, ()):
                cls = getattr(module, cls_name, None)
                method = vars(cls).get("start_model_update") if cls is not None else None
                if method is not None and not getattr(method, MARK, None):
                    self._set(cls, "start_model_update", _phase(method, "start_model_update"))
        if self.exact:
            for cls_name, kind in C.LOSS_CLASSES.get(name, {}).items():
                cls = getattr(module, cls_name, None)
                if cls is None or getattr(vars(cls).get("loss_func"), _HOOKED, None):
                    continue
                C.check_loss(cls, name)
                self._set(cls, "loss_func", _loss(vars(cls)["loss_func"], kind))

    @staticmethod
    def _register(original: Callable[..., Any]) -> Callable[..., Any]:
        """ROLL's ``register(...)`` decorator, whose methods also become phases."""

        @wraps(original)
        def register(*args: Any, **kwargs: Any) -> Any:
            decorate = original(*args, **kwargs)

            def decorator(func: Callable[..., Any]) -> Any:
                return _phase(decorate(func), func.__name__)  # wraps keeps ROLL's flag

            return decorator

        setattr(register, MARK, original)
        return register


def _loss(original: Callable[..., Any], kind: str) -> Callable[..., Any]:
    """A ``loss_func`` of ``kind`` (``rlvr``, ``agentic``, ``critic``) that also logs the
    micro-batch's states."""

    @wraps(original)
    def loss_func(self: Any, data: Any, output_tensor: Any) -> Any:
        try:
            scope = _scope(self, data, kind)
        except Exception as exc:  # never into ROLL's step
            _warn(f"scope:{kind}", f"{kind} micro-batch not logged: {exc!r}")
            scope = None
        if scope is None:
            return original(self, data, output_tensor)
        captured: dict[str, Any] = {}
        undo = _capture(self, captured) if kind != "critic" else []
        try:
            result = original(self, data, output_tensor)
        finally:
            for owner, name, had, value in undo:
                if had:
                    setattr(owner, name, value)
                else:
                    delattr(owner, name)
        try:
            producer, step = scope
            producer.log(_states(self, data, output_tensor, kind, captured), step=step)
        except Exception as exc:  # never into ROLL's step
            _warn(f"log:{kind}", f"{kind} micro-batch not logged: {exc!r}")
        return result

    setattr(loss_func, _HOOKED, original)
    return loss_func


def _scope(worker: Any, data: Any, kind: str) -> tuple[Producer, int] | None:
    """The producer and step a training micro-batch logs under, or None: not tracked with
    rlpulse, exact off, a rank ROLL does not collect, or no step in the batch."""
    settings = worker_settings(worker)
    if settings is None or not settings.exact:
        return None
    info = getattr(worker, "rank_info", None)
    if info is not None and not (
        info.tp_rank == 0 and info.pp_rank == info.pp_size - 1 and info.cp_rank == 0
    ):
        return None
    step = (getattr(data, "meta_info", None) or {}).get("global_step")
    if step is None:
        _warn(f"step:{kind}", f"{kind}: a micro-batch without meta_info['global_step']; not logged")
        return None
    producer = producer_for(worker)
    return (producer, int(step)) if producer is not None else None


def _capture(worker: Any, captured: dict[str, Any]) -> list[tuple[Any, str, bool, Any]]:
    """For one call: keep the first log-probabilities ROLL computes and the old ones it
    takes, as ROLL returns them (instance attributes shadowing the methods, removed after)."""
    undo: list[tuple[Any, str, bool, Any]] = []

    def keep(owner: Any, name: str, key: str) -> None:
        method = getattr(owner, name)

        def kept(*args: Any, **kwargs: Any) -> Any:
            result = method(*args, **kwargs)
            captured.setdefault(key, result)
            return result

        had = name in vars(owner)
        undo.append((owner, name, had, vars(owner).get(name)))
        setattr(owner, name, kept)

    keep(worker.strategy, "op_compute_log_probs", "log_probs")
    keep(worker, "get_old_log_probs_with_cache", "old_log_probs")
    return undo


def _states(
    worker: Any, data: Any, output_tensor: Any, kind: str, captured: dict[str, Any]
) -> dict:
    import torch

    config = worker.pipeline_config
    with torch.no_grad():
        batch = data.batch
        if kind == "critic":
            values, _ = worker.forward_func_values(data=data, output_tensor=output_tensor)
            return S.critic_states(
                values,
                batch["values"],
                batch["returns"],
                batch["response_mask"][:, 1:],
                roll_config.critic_settings(config),
            )
        settings = roll_config.actor_settings(config, agentic=kind == "agentic")
        response = batch["response_mask"][:, 1:].long()
        log_probs = captured["log_probs"]
        old = captured.get("old_log_probs", log_probs)
        infer = batch.get("infer_logprobs", old) if "infer_logprobs" in batch else old
        if len(infer) == 0:
            infer = old
        loss = response if kind == "agentic" else batch.get("final_response_mask", response)
        if "final_response_mask" not in batch:
            loss = response
        out: dict[str, Any] = {}
        weight = None
        base = response
        if settings.correction is not None:
            corr, passed, weight = S.correction_states(settings.correction, old, infer, response)
            out.update(corr)
            response = response * passed.long()
            loss = loss.long() * passed.long()
        elif _is_weight_on(config):
            weight = batch["train_infer_is_weight"]
        sample_weights = None
        if kind == "rlvr":
            sample_weights = worker.compute_sample_weights(data, response)
        ref = batch.get("ref_log_probs", old)
        tensors = S.ActorTensors(
            log_probs=log_probs,
            old_log_probs=old,
            ref_log_probs=ref,
            advantages=batch["advantages"],
            loss_mask=loss,
            base_mask=base,
            infer_log_probs=infer,
            is_weight=weight,
            sample_weights=sample_weights,
        )
        out.update(S.actor_states(tensors, settings))
        return out


def _is_weight_on(config: Any) -> bool:
    corr = getattr(config, "train_infer_correction", None)
    weight = getattr(corr, "is_weight", None) if corr is not None else None
    return bool(getattr(weight, "enabled", False))
