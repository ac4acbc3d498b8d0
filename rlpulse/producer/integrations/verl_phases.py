"""verl's worker calls, each a phase of its role on the rank that runs it.

:class:`WorkerPhases` (installed by the setup hook in every process of the job) wraps, as
their modules are imported, the worker methods verl's driver calls
(``rlpulse.producer.integrations.phases.as_phase``):

* ``ActorRolloutRefWorker.compute_log_prob``, ``compute_ref_log_prob``, ``update_actor`` and
  ``TrainingWorker.infer_batch``, ``train_mini_batch`` (the critic's values and update): the
  phase, the step, the run and the collector ride in the batch (``verl_meta``: the driver's
  ``verl_trainer`` puts them there for each call: ``actor/compute_log_probs``,
  ``reference/compute_log_probs``, ``critic/compute_values``, ``actor/train_step``,
  ``critic/train_step``); a call without them (a driver of your own) is not measured;
* ``ActorRolloutRefWorker.update_weights``: ``actor/model_update`` at the step verl passes
  (``global_steps``), for the run this process's last batch named (the weights verl pushes
  before the first step are measured only with ``RLPULSE_RUN`` set);
* ``AgentLoopWorker.generate_sequences``: ``rollout/generate`` at the batch's
  ``global_steps`` (validation generations included, as the demo trainer's), role ``rollout``
  of rank ``i`` of ``agent.num_workers`` (verl names its ``i``-th agent loop worker
  ``agent_loop_worker_{i}_...``), the run from the worker's copy of verl's config.

The classes are wrapped in every process of the job (the setup hook runs in each): verl's
driver makes its agent loop workers' Ray actor class, which copies the class's methods then,
after the hook, so the copy is the wrapper, which reaches each actor by reference to the one its
own process installed.

Rank and world size of the engine workers are their ``RANK`` and ``WORLD_SIZE``; their
producers are the loss hook's (``verl.worker_producer``), one per role and process. verl's
engines move the model and optimizer to the GPU when a call starts and back when it ends, when
offloading is on (``BaseEngineCtx``): those moves are timed as the phase's ``onload`` and
``offload``. The wrappers read only Python meta data (no tensor, no collective, no
``.item()``); GPU time comes from CUDA events the producer records around the call.

>>> agent_rank("agent_loop_worker_3_0f3a9c21"), agent_rank("TaskRunner")
(3, None)
"""

from __future__ import annotations

import logging
import os
import re
import sys
from collections.abc import Callable, Mapping
from types import ModuleType
from typing import Any

from rlpulse.producer.integrations.phases import Call, as_phase, load
from rlpulse.producer.integrations.verl_compat import OnImport
from rlpulse.producer.integrations.verl_meta import META_KEY, non_tensor
from rlpulse.producer.integrations.verl_settings import logging_settings
from rlpulse.producer.integrations.verl_states import ACTOR_ROLE
from rlpulse.schemas.topology import GENERATE, MODEL_UPDATE, ROLLOUT

log = logging.getLogger("rlpulse.integrations.verl")

ENGINE_WORKERS = "verl.workers.engine_workers"
ENGINE_BASE = "verl.workers.engine.base"
AGENT_LOOP = "verl.experimental.agent_loop.agent_loop"
BATCH_CALLS = {
    "ActorRolloutRefWorker": ("compute_log_prob", "compute_ref_log_prob", "update_actor"),
    "TrainingWorker": ("infer_batch", "train_mini_batch"),
}
"""verl's worker methods whose batch says which phase the call is."""
_AGENT_NAME = re.compile(r"^agent_loop_worker_(\d+)_")
_MARK = "_rlpulse_phase_hook"

ProducerFor = Callable[..., Any]
"""``(role, run, address, rank=None, world_size=None)`` -> the producer; rank and world size
default to the worker's ``RANK`` and ``WORLD_SIZE``."""


def agent_rank(name: str | None) -> int | None:
    """The index verl gave an agent loop worker in its actor name, if it is one."""
    match = _AGENT_NAME.match(name or "")
    return int(match.group(1)) if match else None


class WorkerPhases:
    """Wraps verl's worker methods in this process (see the module text).

    >>> # hooks = WorkerPhases(producer_for); hooks.install(); ...; hooks.uninstall()
    """

    def __init__(self, producer_for: ProducerFor) -> None:
        self.producer_for = producer_for
        self._undo: list[tuple[Any, str, Any]] = []
        self._on_import: OnImport | None = None
        self._warned: set[str] = set()
        self._last: tuple[str | None, str | None] | None = None
        """(run, address) of the last batch this process's workers got, for update_weights."""

    def install(self) -> None:
        if self._on_import is None:
            self._on_import = OnImport((ENGINE_WORKERS, ENGINE_BASE, AGENT_LOOP), self._wrap)
            self._on_import.install()

    def uninstall(self) -> None:
        if self._on_import is not None:
            self._on_import.uninstall()
            self._on_import = None
        while self._undo:
            owner, name, original = self._undo.pop()
            setattr(owner, name, original)

    # ---------------------------------------------------------------- wrapping

    def _wrap(self, module: ModuleType) -> None:
        if module.__name__ == ENGINE_WORKERS:
            for cls_name, methods in BATCH_CALLS.items():
                for method in methods:
                    self._set(module, cls_name, method, self._batch_call)
            self._set(module, "ActorRolloutRefWorker", "update_weights", self._weights_call)
        elif module.__name__ == ENGINE_BASE:
            self._wrap_loads(getattr(module, "BaseEngineCtx", None))
        else:
            self._set(module, "AgentLoopWorker", "generate_sequences", self._generate_call)

    def _set(self, module: ModuleType, cls_name: str, method: str, describe: Any) -> None:
        cls = getattr(module, cls_name, None)
        original = vars(cls).get(method) if isinstance(cls, type) else None
        if original is None:
            self._warn(
                f"missing:{cls_name}.{method}", f"verl has no {cls_name}.{method}: not timed"
            )
            return
        if getattr(original, _MARK, False):
            return
        wrapped = as_phase(original, describe)
        setattr(wrapped, _MARK, True)
        self._undo.append((cls, method, original))
        setattr(cls, method, wrapped)

    def _wrap_loads(self, ctx: Any) -> None:
        """``BaseEngineCtx._context_switch``: the engine's own onload (to the device) and
        offload (to the CPU) when offloading is on, as the running call's phase's."""
        original = vars(ctx).get("_context_switch") if isinstance(ctx, type) else None
        if original is None or getattr(original, _MARK, False):
            if original is None:
                self._warn("missing:BaseEngineCtx", "verl has no BaseEngineCtx: loads not timed")
            return

        def _context_switch(self: Any, device: Any) -> Any:
            engine = self.engine
            moves = not self.disable_auto_offload and (
                engine.is_param_offload_enabled or engine.is_optimizer_offload_enabled
            )
            if not moves:
                return original(self, device)
            with load("offload" if device == "cpu" else "onload"):
                return original(self, device)

        setattr(_context_switch, _MARK, True)
        self._undo.append((ctx, "_context_switch", original))
        ctx._context_switch = _context_switch

    # ---------------------------------------------------------------- which phase a call is

    def _batch_call(self, worker: Any, data: Any, *args: Any, **kwargs: Any) -> Call | None:
        meta = non_tensor(data, META_KEY)
        if not isinstance(meta, Mapping) or meta.get("step") is None:
            return None
        run, address = meta.get("run"), meta.get("address")
        self._last = (run, address)
        phase = meta.get("phase")
        if not phase:
            return None
        producer = self.producer_for(phase.partition("/")[0], run, address)
        return Call(producer, phase, int(meta["step"]))

    def _weights_call(
        self, worker: Any, global_steps: Any = None, *args: Any, **kwargs: Any
    ) -> Any:
        if global_steps is None:
            return None
        run, address = self._last or (os.environ.get("RLPULSE_RUN"), None)
        if not run:
            return None
        producer = self.producer_for(ACTOR_ROLE, run, address)
        return Call(producer, f"{ACTOR_ROLE}/{MODEL_UPDATE}", int(global_steps))

    def _generate_call(self, worker: Any, batch: Any, *args: Any, **kwargs: Any) -> Call | None:
        step = batch.meta_info.get("global_steps")
        settings = logging_settings(worker.config)
        ray = sys.modules.get("ray")
        if step is None or settings is None or ray is None or not ray.is_initialized():
            return None
        rank = agent_rank(ray.get_runtime_context().get_actor_name())
        if rank is None:
            self._warn("agent", "an agent loop worker verl did not name: generation not timed")
            return None
        world = int(worker.config.actor_rollout_ref.rollout.agent.num_workers)
        producer = self.producer_for(
            ROLLOUT, settings.run, settings.address, rank=rank, world_size=world
        )
        return Call(producer, f"{ROLLOUT}/{GENERATE}", int(step))

    def _warn(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            log.warning("rlpulse verl hook: %s", message)
