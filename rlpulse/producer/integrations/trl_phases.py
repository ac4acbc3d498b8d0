"""TRL: each process's generation, scoring and optimizer step as phases, and its in-process vLLM
engine's own metrics per step.

:class:`PhaseHook` attaches to one trainer object (``RlpulseCallback`` does it when training
begins; ``GRPOTrainer`` and ``RLOOTrainer``) and times, on every process, as phases of the
process's producer (its role, rank ``process_index``), for the optimizer step that first
trains on them (``global_step + 1``):

* ``rollout/generate``: each training generation (``trainer._generate``: TRL pushes the
  policy's weights to vLLM there when they changed, then generates);
* ``reward/compute_rewards``: the reward functions on it (``trainer._calculate_rewards``);
* ``actor_train/train_step``: the optimizer step, from when its first micro-batch is ready
  (after the generation, in a step that makes one) to ``on_step_end``: every micro-batch's
  forward and backward and the optimizer step.

With vLLM in colocate mode (``vllm_mode="colocate"``: an ``LLM`` in each process), the
engine's own metrics of each training generation go out as ``rollout/engine/...``
(:mod:`rlpulse.producer.vllm_stats`: tokens, requests, preemptions, prefix cache, KV-cache use,
queue lengths, latency histograms), from the first process of each tensor-parallel group (its
processes drive one engine), and the collector merges them across processes. vLLM keeps no
statistics unless its ``LLM`` is built with ``disable_log_stats=False``, which TRL does not
pass: :func:`enable_engine_stats` (``RlpulseCallback.on_init_end``, which runs before TRL
builds the engine) has TRL's next ``LLM`` built with them. In server mode
(``vllm_mode="server"``) the engine is a ``trl vllm-serve`` process, whose metrics come from
its ``/metrics`` (the server path): :func:`engine_source` gives nothing for it here.

Evaluation generations are neither phases nor engine metrics of their own: the engine's work
for them is counted with the next training generation's. Never raises into training: a
failure is warned about once per kind.

>>> PhaseHook.fits(object())
False
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from typing import Any

from rlpulse.producer.integrations.phases import Call, as_phase
from rlpulse.producer.phase import Phase
from rlpulse.producer.vllm_stats import EngineStats
from rlpulse.schemas.topology import (
    ACTOR_TRAIN,
    COMPUTE_REWARDS,
    GENERATE,
    REWARD,
    ROLLOUT,
    TRAIN_STEP,
)

log = logging.getLogger("rlpulse.integrations.trl")

TRL_VLLM = "trl.generation.vllm_generation"
"""The TRL module that builds the colocated engine (``LLM(...)`` in ``VLLMGeneration``)."""


def enable_engine_stats() -> Callable[[], None]:
    """Have TRL build its next ``vllm.LLM`` with ``disable_log_stats=False`` (once; the name is
    put back when it is called). Returns the function that puts it back unused. A no-op where
    TRL's vLLM module or vLLM is not there."""
    module = sys.modules.get(TRL_VLLM)
    original = getattr(module, "LLM", None)
    if module is None or original is None:
        return lambda: None

    def restore() -> None:
        if getattr(module, "LLM", None) is with_stats:
            setattr(module, "LLM", original)  # noqa: B010 (a module attribute)

    def with_stats(*args: Any, **kwargs: Any) -> Any:
        restore()
        kwargs.setdefault("disable_log_stats", False)
        return original(*args, **kwargs)

    setattr(module, "LLM", with_stats)  # noqa: B010
    return restore


def engine_source(trainer: Any) -> EngineStats | None:
    """What measures this process's vLLM engine: its ``LLM`` in colocate mode, on the first
    process of its tensor-parallel group; None without vLLM, on the group's other processes,
    and in server mode (whose engine is measured from its server: not here yet)."""
    generation = getattr(trainer, "vllm_generation", None)
    if not getattr(trainer, "use_vllm", False) or generation is None:
        return None
    if getattr(generation, "mode", None) != "colocate":
        return None  # server mode: the server path's (``trl vllm-serve``'s /metrics)
    if trainer.accelerator.process_index % generation.tensor_parallel_size:
        return None  # another process of this tensor-parallel group measures the engine
    return EngineStats(generation.llm)


class PhaseHook:
    """Times one trainer's generations, scoring and optimizer steps on this process, and
    measures its colocated engine (see the module text).

    >>> # hook = PhaseHook(producer); detach = hook.attach(trainer); ... hook.step_end() ...
    """

    def __init__(self, producer: Any) -> None:
        self.producer = producer
        self.engine: EngineStats | None = None
        self._train: Phase | None = None
        self._warned: set[str] = set()

    @staticmethod
    def fits(trainer: Any) -> bool:
        """Whether ``trainer`` generates and scores as TRL's GRPO and RLOO trainers do."""
        return all(
            callable(getattr(trainer, name, None))
            for name in ("_generate", "_calculate_rewards", "_prepare_inputs")
        )

    def attach(self, trainer: Any) -> Callable[[], None]:
        """Wrap the trainer's methods on the instance (the class is untouched) and start
        measuring its engine; returns the function that undoes it."""
        producer = self.producer

        def training(infix: str) -> Callable[..., Call | None]:
            def describe(*args: Any, **kwargs: Any) -> Call | None:
                if not trainer.model.training:
                    return None
                return Call(producer, infix, trainer.state.global_step + 1)

            return describe

        generate = as_phase(trainer._generate, training(f"{ROLLOUT}/{GENERATE}"))
        rewards = as_phase(trainer._calculate_rewards, training(f"{REWARD}/{COMPUTE_REWARDS}"))
        prepare = trainer._prepare_inputs

        def generate_and_measure(*args: Any, **kwargs: Any) -> Any:
            out = generate(*args, **kwargs)
            if trainer.model.training:
                self._engine_metrics(trainer.state.global_step + 1)
            return out

        def prepare_inputs(*args: Any, **kwargs: Any) -> Any:
            out = prepare(*args, **kwargs)
            if trainer.model.training and self._train is None:
                self._open_step(trainer.state.global_step + 1)
            return out

        try:
            self.engine = engine_source(trainer)
        except Exception as exc:  # StatsOff, or another TRL's layout
            self._warn("engine", f"the vLLM engine's metrics are not logged: {exc}")
        trainer._generate = generate_and_measure
        trainer._calculate_rewards = rewards
        trainer._prepare_inputs = prepare_inputs

        def detach() -> None:
            self.step_end()
            for name in ("_generate", "_calculate_rewards", "_prepare_inputs"):
                trainer.__dict__.pop(name, None)
            if self.engine is not None:
                self.engine.detach()
                self.engine = None

        return detach

    def step_end(self) -> None:
        """The optimizer step is over (``on_step_end``): its ``train_step`` phase ends."""
        phase, self._train = self._train, None
        if phase is not None:
            try:
                phase.__exit__(None, None, None)
            except Exception as exc:  # never into the training step
                self._warn("train_step-end", f"an optimizer step's phase was not sent: {exc!r}")

    def _open_step(self, step: int) -> None:
        try:
            phase = self.producer.phase(f"{ACTOR_TRAIN}/{TRAIN_STEP}", step=step)
            phase.__enter__()
        except Exception as exc:  # never into the training step
            self._warn("train_step", f"optimizer steps are not timed: {exc!r}")
            return
        self._train = phase

    def _engine_metrics(self, step: int) -> None:
        if self.engine is None:
            return
        try:
            self.producer.log(self.engine.take_metrics(), step=step)
        except Exception as exc:  # never into the training step
            self._warn("engine-read", f"the vLLM engine's metrics of a step are lost: {exc!r}")

    def _warn(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            log.warning("rlpulse: %s", message)
