"""verl: the loss metrics of every actor and critic micro-batch, exact, from every worker, with
no change to the user's code.

verl's driver logs ``actor/pg_clipfrac``, ``actor/ppo_kl``, ``actor/pg_clipfrac_lower`` and
``critic/vf_clipfrac`` (and ``critic/vpred_mean``) as each micro-batch's mean, averaged over the
data-parallel ranks (``Metric.aggregate_dp``), over the micro-batches and over the mini-batches:
a mean of means as soon as micro-batches hold different token counts. Its ``actor/pg_loss`` and
``critic/vf_loss`` are normalised by the global mini-batch (exact within one mini-batch), then
averaged over the mini-batches of the step.

:class:`LossHook` (installed by ``rlpulse.producer.integrations.verl.register``, Ray's
``worker_process_setup_hook``, so before verl's workers bind their loss functions) wraps verl's
own functions, and for every training micro-batch of every actor and critic worker logs, under
verl's names, for the driver's ``global_steps``, the states ``verl_states`` lists.

No collective, no copy to the host, no ``.item()``: the states are tensors the producer reduces
later. The step and the run travel with the batch: the driver's ``_update_actor`` and
``_update_critic`` put them into the batch's meta data (``rlpulse``, and ``global_steps``:
``verl_trainer``), which verl hands to every micro-batch. The functions are wrapped as their
modules are imported (``verl_compat.OnImport``), so a Ray process that never trains pays no
import. What they compute is verl's code: the verl versions the hook was tested with and the
signatures it wraps are checked in ``verl_compat``; the states' maths, which needs no verl, is
``verl_states``. ``actor/entropy`` needs no hook: verl 0.9's driver computes it over the whole
batch.

>>> # hook = LossHook(producer_for); hook.install() ... hook.uninstall()
"""

from __future__ import annotations

import contextvars
import logging
import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import wraps
from types import ModuleType
from typing import Any, Protocol

from rlpulse.producer.integrations.verl_compat import LOSSES, OnImport, check_losses
from rlpulse.producer.integrations.verl_meta import META_KEY, non_tensor
from rlpulse.producer.integrations.verl_states import (
    ACTOR_ROLE,
    CRITIC_ROLE,
    PG_LOSS,
    POLICY_LOSSES,
    VF_LOSS,
    loss_state,
    value_states,
    vanilla_states,
)

log = logging.getLogger("rlpulse.integrations.verl")


class Sink(Protocol):
    def log(self, data: Mapping[str, Any], step: int) -> None: ...


ProducerFor = Callable[[str, str | None, str | None], Sink]
"""(role, run, address) -> the producer a worker's micro-batches go to."""


@dataclass(frozen=True)
class Scope:
    """The training micro-batch a loss function is computing: its role, step and run."""

    role: str
    step: int
    run: str | None
    address: str | None


_SCOPE: contextvars.ContextVar[Scope | None] = contextvars.ContextVar("rlpulse_verl_scope")
_MARK = "_rlpulse_loss_hook"


class LossHook:
    """Wraps verl's loss functions in this process.

    ``producer_for(role, run, address)`` gives the producer a micro-batch's states go to
    (``worker_producer`` by default).

    >>> # hook = LossHook(lambda role, run, address: producer)
    >>> # hook.install(); ... verl trains ...; hook.uninstall()
    """

    def __init__(self, producer_for: ProducerFor) -> None:
        self.producer_for = producer_for
        self._undo: list[tuple[Any, str, Any]] = []
        self._warned: set[str] = set()
        self._on_import: OnImport | None = None
        self._bound: dict[int, tuple[Any, Any]] = {}

    # ---------------------------------------------------------------- install / uninstall

    def install(self) -> None:
        """Wrap verl's loss functions in this process, now where their module is imported,
        else as soon as it is (before any other module binds them by name: ``engine_workers``
        binds ``ppo_loss`` at its import). Importing it here would cost every process of a Ray
        job, vLLM servers included, verl's training imports. A second install does nothing."""
        if self._on_import is None:
            self._on_import = OnImport((LOSSES,), self._wrap_losses)
            self._on_import.install()

    def _wrap_losses(self, losses: ModuleType) -> None:
        if getattr(losses.ppo_loss, _MARK, False):
            return
        check_losses(losses)
        originals = {"ppo_loss": losses.ppo_loss, "value_loss": losses.value_loss}
        wrapped = {
            "ppo_loss": self._outer(losses.ppo_loss, ACTOR_ROLE),
            "value_loss": self._outer(losses.value_loss, CRITIC_ROLE),
        }
        self._bound = {id(wrapped[n]): (wrapped[n], original) for n, original in originals.items()}
        for name, function in wrapped.items():
            self._set(losses, name, function)
        self._set(losses, "get_policy_loss_fn", self._policy_lookup(losses.get_policy_loss_fn))
        self._set(losses, "compute_value_loss", self._value_loss(losses.compute_value_loss))
        # Modules that bound verl's functions by name before this ran (a process that calls
        # register() after importing verl's workers).
        for module_name, module in list(sys.modules.items()):
            if module_name.startswith("verl.") and module is not losses and module is not None:
                for name, original in originals.items():
                    if vars(module).get(name) is original:
                        self._set(module, name, wrapped[name])

    def uninstall(self) -> None:
        """Put verl's functions back."""
        if self._on_import is not None:
            self._on_import.uninstall()
            self._on_import = None
        for module_name, module in list(sys.modules.items()):  # bound after install
            if module_name.startswith("verl.") and module is not None:
                for name, value in list(vars(module).items()):
                    wrapper, original = self._bound.get(id(value), (None, None))
                    if wrapper is not None and wrapper is value:
                        setattr(module, name, original)
        while self._undo:
            owner, name, original = self._undo.pop()
            setattr(owner, name, original)

    def _set(self, owner: Any, name: str, value: Any) -> None:
        self._undo.append((owner, name, vars(owner)[name]))
        setattr(owner, name, value)

    # ---------------------------------------------------------------- the workers

    def _outer(self, original: Callable[..., Any], role: str) -> Callable[..., Any]:
        """``ppo_loss`` / ``value_loss``: the scope of a training micro-batch, for the inner
        wrappers (which see the tensors) to log under."""
        hook = self

        # verl's own signature: engine_workers binds config= with functools.partial.
        @wraps(original)
        def loss(config: Any, model_output: Any, data: Any, dp_group: Any = None) -> Any:
            token = None
            try:
                scope = hook._scope(role, data)
                if scope is not None:
                    token = _SCOPE.set(scope)
            except Exception as exc:
                hook._warn(f"scope:{role}", f"micro-batch not logged: {exc!r}")
            try:
                return original(config, model_output, data, dp_group)
            finally:
                if token is not None:
                    _SCOPE.reset(token)

        setattr(loss, _MARK, True)
        return loss

    def _scope(self, role: str, data: Any) -> Scope | None:
        import torch

        if not torch.is_grad_enabled():  # a forward-only pass (log probs, values)
            return None
        meta = non_tensor(data, META_KEY)
        if meta is None:
            self._warn(
                f"step:{role}",
                f"{role}: the batch carries no {META_KEY!r} meta data (a trainer overriding "
                "_update_actor or _update_critic?): its loss metrics are not logged worker-side",
            )
            return None
        if meta.get("step") is None:  # the driver logs to no rlpulse backend
            return None
        return Scope(role, int(meta["step"]), meta.get("run"), meta.get("address"))

    def _data_parallel(self, role: str, dp_size: Any) -> bool:
        """Whether every worker is its own data-parallel rank (else model or sequence parallel
        ranks would log the same micro-batch twice)."""
        world = self._world_size()
        if dp_size is None or world is None or int(dp_size) == world:
            return True
        self._warn(
            f"dp:{role}",
            f"{role}: {world} workers for {dp_size} data-parallel ranks (model or sequence "
            "parallel): loss metrics not logged worker-side",
        )
        return False

    @staticmethod
    def _world_size() -> int | None:
        value = os.environ.get("WORLD_SIZE")
        return int(value) if value and value.isdigit() else None

    def _policy_lookup(self, original: Callable[[str], Any]) -> Callable[[str], Any]:
        """``get_policy_loss_fn`` as ``ppo_loss`` sees it: the policy loss, wrapped when it is
        one whose clip fractions the hook recomputes."""
        hook = self
        cache: dict[Any, Any] = {}

        @wraps(original)
        def get_policy_loss_fn(name: Any) -> Any:
            function = original(name)
            if name not in POLICY_LOSSES:
                return function
            if function not in cache:
                cache[function] = hook._policy_loss(function)
            return cache[function]

        return get_policy_loss_fn

    def _policy_loss(self, original: Callable[..., Any]) -> Callable[..., Any]:
        hook = self

        @wraps(original)
        def policy_loss(
            old_log_prob: Any,
            log_prob: Any,
            advantages: Any,
            response_mask: Any,
            loss_agg_mode: str = "token-mean",
            config: Any = None,
            rollout_is_weights: Any = None,
        ) -> Any:
            pg_loss, metrics = original(
                old_log_prob=old_log_prob,
                log_prob=log_prob,
                advantages=advantages,
                response_mask=response_mask,
                loss_agg_mode=loss_agg_mode,
                config=config,
                rollout_is_weights=rollout_is_weights,
            )
            info = getattr(config, "global_batch_info", None) or {}

            def states() -> dict[str, Any]:
                # Now: ppo_loss subtracts the entropy bonus from pg_loss in place later.
                out = vanilla_states(old_log_prob, log_prob, advantages, response_mask, config)
                weighted = loss_state(
                    pg_loss,
                    loss_agg_mode,
                    response_mask.detach().bool(),
                    int(info.get("dp_size") or 1),
                    info.get("batch_num_tokens"),
                    info.get("global_batch_size"),
                )
                if weighted is not None:
                    out[PG_LOSS] = weighted
                return out

            hook._log_for(ACTOR_ROLE, info.get("dp_size"), states)
            return pg_loss, metrics

        return policy_loss

    def _value_loss(self, original: Callable[..., Any]) -> Callable[..., Any]:
        hook = self

        @wraps(original)
        def compute_value_loss(
            vpreds: Any,
            returns: Any,
            values: Any,
            response_mask: Any,
            cliprange_value: float,
            loss_agg_mode: str = "token-mean",
            dp_size: int = 1,
            batch_num_tokens: Any = None,
            global_batch_size: Any = None,
            loss_scale_factor: Any = None,
        ) -> Any:
            vf_loss, vf_clipfrac = original(
                vpreds=vpreds,
                returns=returns,
                values=values,
                response_mask=response_mask,
                cliprange_value=cliprange_value,
                loss_agg_mode=loss_agg_mode,
                dp_size=dp_size,
                batch_num_tokens=batch_num_tokens,
                global_batch_size=global_batch_size,
                loss_scale_factor=loss_scale_factor,
            )

            def states() -> dict[str, Any]:
                mask = response_mask.detach().bool()
                out = value_states(vpreds, vf_clipfrac, mask)
                weighted = loss_state(
                    vf_loss, loss_agg_mode, mask, dp_size, batch_num_tokens, global_batch_size
                )
                if weighted is not None:
                    out[VF_LOSS] = weighted
                return out

            hook._log_for(CRITIC_ROLE, dp_size, states)
            return vf_loss, vf_clipfrac

        return compute_value_loss

    def _log_for(self, role: str, dp_size: Any, states: Callable[[], dict[str, Any]]) -> None:
        """The guard both loss wrappers share: log ``states()`` when a training micro-batch
        of ``role`` is in scope and every worker is its own data-parallel rank; never raise
        into verl's step (a failure is warned about once per role)."""
        scope = _SCOPE.get(None)
        if scope is None or scope.role != role or not self._data_parallel(role, dp_size):
            return
        try:
            producer = self.producer_for(scope.role, scope.run, scope.address)
            producer.log(states(), step=scope.step)
        except Exception as exc:  # never into verl's step
            self._warn(role, f"{role} micro-batch not logged: {exc!r}")

    def _warn(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            log.warning("rlpulse verl hook: %s", message)
