"""verl's PPO driver (``RayPPOTrainer``): what the setup hook adds to the batch of every worker
call the driver makes, and what it logs from the driver's own batch.

:class:`TrainerHook` wraps the driver's methods that send a batch to a worker group
(:data:`PHASES`): for the call, the batch's meta data holds the step, the run, the collector
and the phase the call is on the workers (``verl_meta``), which verl hands to every shard and
micro-batch; the hooked workers time the call as that phase on their own rank
(``verl_phases``) and log their loss metrics under that step (``verl_loss``). The keys are
removed when the call returns: nothing else in the batch changes.

From the batch the driver already holds (CPU tensors; no worker is asked for anything), the
driver's producer (the live ``rlpulse`` backend's) also logs, at the driver's ``global_steps``:

* after ``_compute_old_log_prob``, where the batch holds the rollout engine's log-probs of the
  sampled tokens (``rollout_log_probs``, with ``actor_rollout_ref.rollout.calculate_log_probs``)
  and the result the trainer's recomputation of them: ``rollout/logprob_diff`` (engine minus
  trainer) and ``rollout/prob_ratio`` per response token, whose quantiles the collector reports
  over every token of the step (verl logs the mean, max and standard deviation of the
  probabilities' difference);
* at the step's first actor or critic update, once the advantages are in the batch: the
  trained generations as ``rollout/samples`` (``verl_samples.train_rows``) and, where the
  rollout recorded the weights' version of each sample (``max_global_steps``, as verl's
  servers do), ``async/staleness`` per response token.

Never raises into verl's step: a failure is warned about once per kind.

>>> sorted(PHASES)[:2]
['_compute_old_log_prob', '_compute_ref_log_prob']
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from functools import wraps
from types import ModuleType
from typing import Any

from rlpulse.producer.integrations.verl_compat import TRAINERS, OnImport, check_trainer
from rlpulse.producer.integrations.verl_meta import batch_meta
from rlpulse.producer.integrations.verl_samples import TRAIN_KEY, ValGenerations, train_rows
from rlpulse.producer.integrations.verl_states import ACTOR_ROLE, CRITIC_ROLE
from rlpulse.producer.values import Masked, Samples
from rlpulse.schemas import metrics as M
from rlpulse.schemas.topology import (
    COMPUTE_LOG_PROBS,
    COMPUTE_VALUES,
    REFERENCE,
    TRAIN_STEP,
)

log = logging.getLogger("rlpulse.integrations.verl")

PHASES = {
    "_compute_old_log_prob": f"{ACTOR_ROLE}/{COMPUTE_LOG_PROBS}",
    "_compute_ref_log_prob": f"{REFERENCE}/{COMPUTE_LOG_PROBS}",
    "_compute_values": f"{CRITIC_ROLE}/{COMPUTE_VALUES}",
    "_update_critic": f"{CRITIC_ROLE}/{TRAIN_STEP}",
    "_update_actor": f"{ACTOR_ROLE}/{TRAIN_STEP}",
}
"""The driver's methods that send a batch to a worker group -> the phase that call is."""
UPDATES = ("_update_critic", "_update_actor")
_MARK = "_rlpulse_trainer_hook"
_MISSING = object()


class TrainerHook:
    """Wraps verl's PPO driver classes (``verl_compat.TRAINERS``) in this process.

    >>> # hook = TrainerHook(); hook.install(); ... verl trains ...; hook.uninstall()
    """

    def __init__(self) -> None:
        self._undo: list[tuple[Any, str, Any]] = []
        self._on_import: OnImport | None = None
        self._warned: set[str] = set()
        self._recomputed: int | None = None
        """The last step whose trainer log-probs were recomputed (the mismatch is real)."""
        self._sampled: int | None = None

    def install(self) -> None:
        """Wrap the driver classes now where their modules are imported, else when they are."""
        if self._on_import is None:
            self._on_import = OnImport(TRAINERS, self._wrap_trainer)
            self._on_import.install()

    def uninstall(self) -> None:
        if self._on_import is not None:
            self._on_import.uninstall()
            self._on_import = None
        while self._undo:
            owner, name, original = self._undo.pop()
            setattr(owner, name, original)

    def _wrap_trainer(self, module: ModuleType) -> None:
        cls = getattr(module, TRAINERS[module.__name__], None)
        if not isinstance(cls, type) or getattr(vars(cls).get("_update_actor"), _MARK, False):
            return
        check_trainer(cls)
        for method, phase in PHASES.items():
            original = vars(cls).get(method)
            if callable(original):
                self._undo.append((cls, method, original))
                setattr(cls, method, self._with_meta(original, method, phase))

    def _with_meta(self, original: Callable[..., Any], method: str, phase: str) -> Any:
        """The driver's method: the meta data rides in the batch (``meta_info``, or
        ``extra_info`` on verl's v1 trainer) for the call, and is removed after it."""
        hook = self

        @wraps(original)
        def call(self: Any, batch: Any, *args: Any, **kwargs: Any) -> Any:
            info: Any = getattr(batch, "meta_info", None)  # a dict, where keys are added
            if not isinstance(info, dict):
                info = getattr(batch, "extra_info", None)
            saved: dict[str, Any] = {}
            try:
                if isinstance(info, dict):
                    for key, value in batch_meta(self.config, self.global_steps, phase).items():
                        saved[key] = info.get(key, _MISSING)
                        info[key] = value
            except Exception as exc:  # never into verl's step
                hook._warn("meta", f"the step could not be passed to the workers: {exc!r}")
            if method in UPDATES:
                hook._step_data(self, batch)
            try:
                result = original(self, batch, *args, **kwargs)
            finally:
                for key, value in saved.items():
                    if value is _MISSING:
                        info.pop(key, None)
                    else:
                        info[key] = value
            if method == "_compute_old_log_prob":
                hook._mismatch(self, batch, result)
            return result

        setattr(call, _MARK, True)
        return call

    # ---------------------------------------------------------------- from the driver's batch

    def _mismatch(self, trainer: Any, batch: Any, result: Any) -> None:
        """``rollout/logprob_diff`` and ``rollout/prob_ratio`` over the step's response tokens."""
        try:
            tensors = batch.batch
            if "rollout_log_probs" not in tensors.keys() or not isinstance(result, tuple):  # noqa: SIM118 (TensorDict)
                return
            producer = self._producer(trainer)
            if producer is None:
                return
            diff = tensors["rollout_log_probs"].float() - result[0].batch["old_log_probs"].float()
            mask = tensors["response_mask"].bool()
            producer.log(
                {
                    M.ROLLOUT_LOGPROB_DIFF.name: Masked(diff, mask),
                    M.ROLLOUT_PROB_RATIO.name: Masked(diff.neg().exp(), mask),
                },
                step=int(trainer.global_steps),
            )
            self._recomputed = int(trainer.global_steps)
        except Exception as exc:
            self._warn("mismatch", f"the rollout/trainer log-prob mismatch is not logged: {exc!r}")

    def _step_data(self, trainer: Any, batch: Any) -> None:
        """Once per step, at its first update: the trained generations and their staleness."""
        try:
            step = int(trainer.global_steps)
            if self._sampled == step or not hasattr(batch, "non_tensor_batch"):
                return
            self._sampled = step
            producer = self._producer(trainer)
            if producer is None:
                return
            rows, stale = train_rows(
                batch, trainer.tokenizer, step, mismatch=self._recomputed == step
            )
            data: dict[str, Any] = {M.ROLLOUT_SAMPLES.name: Samples(rows, key=TRAIN_KEY)}
            if stale is not None:
                mask = batch.batch["response_mask"].bool()
                data[M.ASYNC_STALENESS.name] = Masked(stale[:, None].expand(mask.shape), mask)
            producer.log(data, step=step)
        except Exception as exc:
            self._warn("samples", f"the step's generations are not logged as samples: {exc!r}")

    @staticmethod
    def _producer(trainer: Any) -> Any:
        """The driver's producer: the live ``rlpulse`` backend's of this trainer's run."""
        section = trainer.config.trainer
        found = ValGenerations.find(section.project_name, section.experiment_name)
        return None if found is None else found.producer

    def _warn(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            log.warning("rlpulse verl hook: %s", message)
