"""TRL (and any ``transformers.Trainer``): a callback that streams what the trainer logs.

``RlpulseCallback`` runs in every process of a (``accelerate``/``torchrun``) job, each with a
producer of its own: role ``trl`` (by default), rank ``args.process_index`` of
``args.world_size``. What the trainer logs (``on_log``: loss, grad_norm, learning_rate, and
for ``GRPOTrainer`` reward, kl, entropy, clip ratios, completion lengths...) is already
gathered and averaged over the processes by TRL, the same number on every one of them, so it
is sent once, by the main process, as the *driver's value* (:mod:`rlpulse.producer.integrations.driver`)
and never merged again. The exceptions are each process's own timings (``step_time``,
``train_runtime``, ``train_*_per_second``): the main process's are sent, as TRL's
``log_history`` and its trackers (which log from the main process only) show them.

With ``exact=True`` (the default) the callback also hooks the trainer object it runs in
(:mod:`rlpulse.producer.integrations.trl_loss`): for ``GRPOTrainer`` and ``RLOOTrainer`` every
process logs ``loss``, ``entropy``, ``kl`` and ``clip_ratio/*_mean`` of each training
micro-batch as mergeable states, the collector pools them over the step's tokens (or
sequences), and the main process leaves TRL's averaged values of those names out. No subclass.

With ``samples=True`` (the default) every process also logs its own completions of each
training generation, the rows TRL already keeps for ``log_completions`` (prompt, response,
reward, advantage, per-function rewards), as ``Samples`` under ``rollout/samples``
(:mod:`rlpulse.producer.integrations.trl_samples`): the collector keeps the step's best, worst
and a uniform random few over every process.

With ``phases=True`` (the default) every process also times its generations, their scoring
and its optimizer steps as phases (``rollout/generate``, ``reward/compute_rewards``,
``actor_train/train_step``: timelines, ``straggler/...``), and with vLLM in colocate mode logs
the engine's own metrics of each generation as ``rollout/engine/...``
(:mod:`rlpulse.producer.integrations.trl_phases`).

With ``engines=True`` (the default), when TRL generates through a vLLM server
(``vllm_mode="server"``), the main process logs that server's own metrics per step
(``rollout/engine/...``: tokens, requests, latency histograms, KV cache), scraped around each
generation (:mod:`rlpulse.producer.integrations.trl_engines`).

Every process's producer (``callback.producer``) is there for metrics of your own logged from
the training step itself, e.g. ``Masked(advantages, completion_mask)`` in ``compute_loss``: the
collector pools them over every process's tokens. A step ``k`` is finished on every process
when step ``k + 1`` begins (``on_step_begin``), and the producers close at ``on_train_end``.

>>> # from rlpulse.producer.integrations.trl import RlpulseCallback
>>> # trainer = GRPOTrainer(..., callbacks=[RlpulseCallback(run="grpo-1")]); trainer.train()
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from transformers import (
    Trainer,
    TrainerCallback,
    TrainerControl,
    TrainerState,
    TrainingArguments,
)

from rlpulse.producer.client import Producer
from rlpulse.producer.config import DEFAULT, ProducerConfig
from rlpulse.producer.integrations import trl_engines
from rlpulse.producer.integrations.driver import DriverStream, save_run_config
from rlpulse.producer.integrations.trl_loss import LossHook
from rlpulse.producer.integrations.trl_phases import PhaseHook, enable_engine_stats
from rlpulse.producer.integrations.trl_samples import SamplesHook

log = logging.getLogger("rlpulse.integrations.trl")


class RlpulseCallback(TrainerCallback):
    """Streams a Trainer's logs to an rlpulse collector from every process, with its rank.

    * ``address``: the collector (default ``RLPULSE_ADDRESS``, then ``tcp://127.0.0.1:5555``).
    * ``run``: the run name (default ``args.run_name``, else the output directory's name).
    * ``role``: the processes' role (default ``trl``); ``expected_roles`` adds other roles
      of the run that log too.
    * ``exact``: log the trainer's loss metrics per micro-batch from every process
      (:mod:`~rlpulse.producer.integrations.trl_loss`; default True). On a TRL version the hook
      was not tested with, ``GRPOTrainer.train()`` stops at start naming the version (pass False
      there); other trainers are not hooked.
    * ``samples``: log each process's completions of every training generation as
      ``rollout/samples`` (:mod:`~rlpulse.producer.integrations.trl_samples`; default True;
      ``GRPOTrainer`` and ``RLOOTrainer`` only).
    * ``engines``: in vLLM server mode, the main process logs the server's metrics per step
      (:mod:`~rlpulse.producer.integrations.trl_engines`; default True).
    * ``phases``: time each process's generations, scoring and optimizer steps as phases, and
      log its colocated vLLM engine's metrics per step
      (:mod:`~rlpulse.producer.integrations.trl_phases`; default True; ``GRPOTrainer`` and
      ``RLOOTrainer`` only).
    * ``worker_side``: metrics the processes log exactly themselves; the main process leaves
      TRL's value of them out (the ``exact`` names are added).
    * ``config_dir``: where the run's configuration (the training arguments and the model's
      config) is saved as ``config.yaml``, ``{run}`` filled in; None: not saved. The main
      process sends it to the collector too (``Producer.run_config``), whose sinks record it.
    * ``producer_config``: the producers' buffers and timings.

    >>> cb = RlpulseCallback(run="grpo-1")
    >>> cb.producer is None  # made when training begins
    True
    """

    def __init__(
        self,
        address: str | None = None,
        *,
        run: str | None = None,
        role: str = "trl",
        expected_roles: Mapping[str, int] | None = None,
        exact: bool = True,
        samples: bool = True,
        engines: bool = True,
        phases: bool = True,
        worker_side: Iterable[str] = (),
        config_dir: str | None = "runs/{run}",
        producer_config: ProducerConfig = DEFAULT,
        producer_factory: Callable[..., Producer] = Producer,
    ) -> None:
        if run is not None and (not isinstance(run, str) or not run):
            raise ValueError(f"run must be a non-empty string, got {run!r}")
        self.address = address
        self.run = run
        self.role = role
        self.expected_roles = dict(expected_roles or {})
        self.exact = exact
        self.samples = samples
        self.engines = engines
        self.phases = phases
        self.worker_side = tuple(worker_side)
        self.config_dir = config_dir
        self.producer_config = producer_config
        self._factory = producer_factory
        self._producer: Producer | None = None
        self._stream: DriverStream | None = None
        self._detach: list[Callable[[], None]] = []
        self._samples: SamplesHook | None = None
        self._phases: PhaseHook | None = None
        self._engine_stats_off: Callable[[], None] | None = None
        self.exact_names: tuple[str, ...] = ()
        """The names logged per micro-batch (empty until training begins, or not hooked)."""
        self.config_path: Path | None = None

    @property
    def producer(self) -> Producer | None:
        """This process's producer, from ``on_train_begin`` until ``on_train_end``."""
        return self._producer

    def stats(self) -> dict[str, int]:
        """The main process's driver-stream counts (empty on the other processes), and this
        process's samples counts (``samples_logged``, ``samples_failed``) once hooked."""
        out = self._stream.stats() if self._stream is not None else {}
        return {**out, **(self._samples.stats() if self._samples is not None else {})}

    # ------------------------------------------------------------------ Trainer events

    def on_init_end(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        **kwargs: Any,
    ) -> None:
        # The end of transformers' Trainer.__init__, before TRL's GRPO/RLOO __init__ builds
        # its colocated vLLM engine: have it keep the statistics its metrics need.
        colocated = (
            getattr(args, "use_vllm", False) and getattr(args, "vllm_mode", "") == "colocate"
        )
        if self.phases and colocated and self._engine_stats_off is None:
            self._engine_stats_off = enable_engine_stats()

    def on_train_begin(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        **kwargs: Any,
    ) -> None:
        if self._producer is not None:
            return
        run = self.run or args.run_name or Path(args.output_dir or "trl").name
        trainer = (
            self._trainer() if self.exact or self.samples or self.phases or self.engines else None
        )
        hook = LossHook.for_trainer(trainer) if trainer is not None and self.exact else None
        self._producer = self._factory(
            self.address,
            run=run,
            role=self.role,
            rank=args.process_index,
            world_size=args.world_size,
            expected_roles={**self.expected_roles, self.role: args.world_size},
            reductions=hook.reductions() if hook is not None else None,
            config=self.producer_config,
        )
        if hook is not None:
            self.exact_names = hook.names()
            self._detach.append(hook.attach(trainer, self._producer, self._exact_failed))
        if self.samples and trainer is not None and SamplesHook.fits(trainer):
            self._samples = SamplesHook(self._producer)
            self._detach.append(self._samples.attach(trainer))
        if self._engine_stats_off is not None:  # TRL built its engine (or never will)
            self._engine_stats_off()
            self._engine_stats_off = None
        if self.phases and trainer is not None and PhaseHook.fits(trainer):
            self._phases = PhaseHook(self._producer)
            self._detach.append(self._phases.attach(trainer))
        if self.engines and trainer is not None:
            self._watch_engines(trainer, self._producer)
        if state.is_world_process_zero:
            self._stream = DriverStream(
                self._producer, worker_side=(*self.worker_side, *self.exact_names)
            )
            model_config = getattr(kwargs.get("model"), "config", None)
            config = {
                "training_args": args.to_dict(),
                "model": model_config.to_dict() if model_config is not None else None,
            }
            self._producer.run_config(config)  # the collector's sinks record it
            if self.config_dir is not None:
                directory = self.config_dir.replace("{run}", run)
                self.config_path = save_run_config(directory, config, "config_dir").resolve()
                log.info("rlpulse: configuration of run %r saved to %s", run, self.config_path)

    def on_step_begin(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        **kwargs: Any,
    ) -> None:
        # Step k's logs, evaluation and saving are over when step k + 1 begins.
        if self._producer is not None:
            self._producer.step_done(state.global_step)

    def on_step_end(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        **kwargs: Any,
    ) -> None:
        if self._phases is not None:
            self._phases.step_end()  # the optimizer step's train_step phase ends here

    def on_log(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        logs: Mapping[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        if self._stream is not None and logs:
            self._stream.log(logs, state.global_step)

    def on_train_end(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        **kwargs: Any,
    ) -> None:
        detachers, self._detach = self._detach, []
        for detach in detachers:
            detach()
        self._phases = None
        producer, self._producer = self._producer, None
        if producer is not None:
            producer.close()
            stats = producer.stats()
            lost = stats["unacked"] + stats["dropped_send"]
            if lost:
                log.warning("rlpulse: %d messages not acknowledged at the end of training", lost)

    # ------------------------------------------------------------------ the exact hook

    def _trainer(self) -> Trainer | None:
        """The Trainer whose ``on_train_begin`` is running: transformers hands callbacks no
        trainer, so it is the caller's ``self`` (``Trainer._inner_training_loop``) holding this
        callback. None (and a warning) if there is none."""
        frame = inspect.currentframe()
        try:
            while frame is not None:
                owner = frame.f_locals.get("self")
                if isinstance(owner, Trainer) and self in owner.callback_handler.callbacks:
                    return owner
                frame = frame.f_back
        finally:
            del frame
        log.warning("rlpulse: no Trainer found calling on_train_begin; TRL's own values are sent")
        return None

    def _watch_engines(self, trainer: Trainer, producer: Producer) -> None:
        """The vLLM server's metrics per step, when TRL generates through one."""
        detach = trl_engines.attach(trainer, producer)
        if detach is not None:
            self._detach.append(detach)

    def _exact_failed(self, message: str) -> None:
        """The hook stopped (see :meth:`LossHook.attach`): TRL's values of its names again."""
        self.exact_names = ()
        if self._stream is not None and self._producer is not None:
            self._stream = DriverStream(self._producer, worker_side=self.worker_side)
