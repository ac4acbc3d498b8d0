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
verl's names, for the driver's ``global_steps``:

* ``actor/pg_loss``, ``critic/vf_loss``: ``Weighted(mean, weight)`` from the very loss tensor verl
  back-propagates, un-normalised from the global mini-batch to the micro-batch: weighted by
  tokens (``loss_agg_mode`` ``token-mean``) or sequences (the ``seq-mean-*`` modes); not sent
  (verl's value stays) under ``token-sum``, a sum rather than a mean;
* ``actor/pg_clipfrac``, ``actor/pg_clipfrac_lower``: ``Fraction(clipped tokens, tokens)``, and
  ``actor/ppo_kl``: ``Weighted(token mean, tokens)``, recomputed from the tensors verl passes to
  its ``vanilla`` policy loss (verl reads its own values back with ``.item()``; the hook reads
  nothing back);
* ``critic/vf_clipfrac`` (``Fraction``) and ``critic/vpred_mean`` (``Weighted``): from the
  tensor ``compute_value_loss`` returns, before ``value_loss`` reads it back, and its inputs.

No collective, no copy to the host, no ``.item()``: the states are tensors the producer reduces
later. The step and the run travel with the batch: the driver's ``_update_actor`` and
``_update_critic`` put them into the batch's meta data (``rlpulse``, and ``global_steps``),
which verl hands to every micro-batch. The functions are wrapped as their modules are imported
(:class:`OnImport`), so a Ray process that never trains pays no import. Which functions are
wrapped and what they compute is verl's code, so the hook is pinned to the verl versions it was
tested with (:data:`TESTED_VERL`, :func:`check`) and checks the signatures it wraps
(:func:`check_losses`, :func:`check_trainer`), failing with ConfigError naming the version.
``actor/entropy`` needs no hook: verl 0.9's driver computes it over the whole batch.

>>> # hook = LossHook(producer_for, batch_meta); hook.install() ... hook.uninstall()
"""

from __future__ import annotations

import contextvars
import importlib.abc
import importlib.machinery
import inspect
import logging
import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import wraps
from types import ModuleType
from typing import Any, Protocol

from rlpulse.producer.values import Fraction, Weighted
from rlpulse.schemas.errors import ConfigError

log = logging.getLogger("rlpulse.integrations.verl")

TESTED_VERL = ("0.9",)
"""verl versions (major.minor) whose loss functions and trainers this hook was checked against."""

ACTOR_ROLE = "actor"
CRITIC_ROLE = "critic"
"""The roles the hooked workers log as (rank and world size: the worker's ``RANK``, ``WORLD_SIZE``)."""

STEP_KEY = "global_steps"
"""The batch meta data key the driver's step also travels under (verl's own name for it), for
loss code of your own."""
META_KEY = "rlpulse"
"""The batch meta data key of what the hooked workers read: ``{"step", "run", "address"}``;
``step`` None when the driver has no ``rlpulse`` backend (the workers then log nothing)."""

PG_LOSS = "actor/pg_loss"
PG_CLIPFRAC = "actor/pg_clipfrac"
PG_CLIPFRAC_LOWER = "actor/pg_clipfrac_lower"
PPO_KL = "actor/ppo_kl"
VF_LOSS = "critic/vf_loss"
VF_CLIPFRAC = "critic/vf_clipfrac"
VPRED_MEAN = "critic/vpred_mean"

REDUCTIONS = {
    PG_CLIPFRAC: "fraction",
    PPO_KL: "mean",
    VF_LOSS: "mean",
    VF_CLIPFRAC: "fraction",
    VPRED_MEAN: "mean",
}
"""How the hook's names outside rlpulse's catalog merge (``actor/pg_loss`` and
``actor/pg_clipfrac_lower`` are catalog entries)."""

POLICY_LOSSES = ("vanilla",)
"""verl policy losses whose clip fractions and KL the hook recomputes."""
MEAN_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")
"""``loss_agg_mode`` values under which verl's loss is a mean (``token-sum`` is a sum)."""
DATA_PARALLEL = ("fsdp", "fsdp2")
"""Strategies where every worker is its own data-parallel rank (no tensor, pipeline or sequence
parallel group holding the same micro-batch twice)."""

LOSSES = "verl.workers.utils.losses"
"""verl's loss functions (``ppo_loss``, ``value_loss``)."""
TRAINERS = {
    "verl.trainer.ppo.ray_trainer": "RayPPOTrainer",
    "verl.trainer.ppo.v1.trainer_base": "PPOTrainer",
}
"""verl's PPO driver classes (v0, v1) whose updates carry the step to the workers."""
TRAINER_METHODS = ("_update_actor", "_update_critic")

# The signatures the wrappers take and pass on unchanged.
_PPO_LOSS = ("config", "model_output", "data", "dp_group")
_POLICY_LOSS = (
    "old_log_prob",
    "log_prob",
    "advantages",
    "response_mask",
    "loss_agg_mode",
    "config",
    "rollout_is_weights",
)
_VALUE_LOSS = (
    "vpreds",
    "returns",
    "values",
    "response_mask",
    "cliprange_value",
    "loss_agg_mode",
    "dp_size",
    "batch_num_tokens",
    "global_batch_size",
    "loss_scale_factor",
)


class Sink(Protocol):
    def log(self, data: Mapping[str, Any], step: int) -> None: ...


ProducerFor = Callable[[str, str | None, str | None], Sink]
"""(role, run, address) -> the producer a worker's micro-batches go to."""


def check_version(version: str) -> None:
    """ConfigError naming ``version`` unless its major.minor is one of :data:`TESTED_VERL`."""
    if ".".join(version.split(".")[:2]) not in TESTED_VERL:
        raise ConfigError(
            "rlpulse.producer.integrations.verl.register",
            f"verl {version} is not a version the exact loss hook was tested with "
            f"({', '.join(TESTED_VERL)}); set RLPULSE_VERL_EXACT=0 in the job's env_vars to send "
            "verl's own values of its loss metrics",
            version,
        )


def check_trainer(cls: type) -> None:
    """ConfigError naming verl's version unless ``cls`` (verl's PPO trainer) has the actor and
    critic updates the hook passes the step through."""
    import verl

    missing = [m for m in TRAINER_METHODS if not callable(vars(cls).get(m))]
    if missing:
        version = getattr(verl, "__version__", "unknown")
        raise ConfigError(
            "rlpulse.producer.integrations.verl.register",
            f"verl {version}'s {cls.__qualname__} has no {', '.join(missing)}: the exact loss "
            "hook cannot pass the step to the workers; set RLPULSE_VERL_EXACT=0",
            version,
        )


def _params(function: Any) -> tuple[str, ...]:
    return tuple(inspect.signature(function).parameters)


def check() -> None:
    """ConfigError naming the verl version unless it is one the hook was tested with (what
    :func:`register` checks at once; the functions it wraps are checked when imported)."""
    import verl

    check_version(getattr(verl, "__version__", "unknown"))


def check_losses(losses: ModuleType) -> None:
    """ConfigError naming verl's version when the functions the hook wraps in ``losses``
    (``verl.workers.utils.losses``) are missing or have other signatures."""
    import verl

    version = getattr(verl, "__version__", "unknown")
    try:
        from verl.trainer.ppo import core_algos

        expected = {
            "ppo_loss": (losses.ppo_loss, _PPO_LOSS),
            "value_loss": (losses.value_loss, _PPO_LOSS),
            "compute_value_loss": (losses.compute_value_loss, _VALUE_LOSS),
            "POLICY_LOSS_REGISTRY['vanilla']": (
                core_algos.POLICY_LOSS_REGISTRY["vanilla"],
                _POLICY_LOSS,
            ),
        }
        problems = [
            f"{name}{_params(function)}"
            for name, (function, params) in expected.items()
            if _params(getattr(function, "__wrapped__", function)) != params
        ]
        if not callable(getattr(losses, "get_policy_loss_fn", None)):
            problems.append("get_policy_loss_fn missing")
    except (ImportError, AttributeError, KeyError) as exc:
        problems = [repr(exc)]
    if problems:
        raise ConfigError(
            "rlpulse.producer.integrations.verl.register",
            f"verl {version}'s loss functions are not what the exact loss hook wraps "
            f"({'; '.join(problems)}); set RLPULSE_VERL_EXACT=0 to send verl's own values",
            version,
        )


# ------------------------------------------------------------------ which names are exact


def actor_names(loss_mode: str, loss_agg_mode: str, strategy: str, sp_size: int) -> tuple[str, ...]:
    """The actor metrics the hook logs exactly under this configuration (none where it cannot:
    another policy loss, model or sequence parallelism)."""
    if loss_mode not in POLICY_LOSSES or strategy not in DATA_PARALLEL or sp_size > 1:
        return ()
    ratios = (PG_CLIPFRAC, PG_CLIPFRAC_LOWER, PPO_KL)
    return (PG_LOSS, *ratios) if loss_agg_mode in MEAN_MODES else ratios


def critic_names(loss_agg_mode: str, strategy: str, sp_size: int) -> tuple[str, ...]:
    """The critic metrics the hook logs exactly under this configuration."""
    if strategy not in DATA_PARALLEL or sp_size > 1:
        return ()
    ratios = (VF_CLIPFRAC, VPRED_MEAN)
    return (VF_LOSS, *ratios) if loss_agg_mode in MEAN_MODES else ratios


def _sp_size(section: Mapping[str, Any]) -> int:
    fsdp = section.get("fsdp_config") or {}
    return max(
        int(section.get("ulysses_sequence_parallel_size") or 1),
        int(fsdp.get("ulysses_sequence_parallel_size") or 1) if isinstance(fsdp, Mapping) else 1,
    )


def exact_names(config: Mapping[str, Any]) -> tuple[str, ...]:
    """The names the workers log exactly for verl's (resolved) ``config``: the driver leaves its
    own values of them out. The workers decide the same from the same configuration."""
    # With distillation, verl's distillation loss calls ppo_loss (the wrapped one) for the
    # policy-gradient part; without it neither verl nor the hook has these metrics.
    section = (config.get("actor_rollout_ref") or {}).get("actor") or {}
    policy = section.get("policy_loss") or {}
    actor = actor_names(
        policy.get("loss_mode", "vanilla"),
        section.get("loss_agg_mode", "token-mean"),
        section.get("strategy", "fsdp"),
        _sp_size(section),
    )
    critic = config.get("critic") or {}
    return actor + critic_names(
        critic.get("loss_agg_mode", "token-mean"),
        critic.get("strategy", "fsdp"),
        _sp_size(critic),
    )


# ------------------------------------------------------------------ the states


def loss_state(
    loss: Any,
    loss_agg_mode: str,
    mask: Any,
    dp_size: int,
    batch_num_tokens: Any,
    global_batch_size: Any,
) -> Weighted | None:
    """The micro-batch's own mean loss and its weight, from verl's ``agg_loss`` result, which is
    normalised by the global mini-batch (``batch_num_tokens`` tokens or ``global_batch_size``
    sequences over ``dp_size`` ranks): ``Weighted`` pools them to the tokens' (or sequences')
    mean. None under ``token-sum`` (a sum, not a mean). Tensors in, tensors out: nothing read."""
    loss = loss.detach().double()
    if loss_agg_mode == "token-mean":
        tokens = mask.sum()
        if batch_num_tokens is None:  # verl normalised by this micro-batch's tokens
            return Weighted(loss, tokens)
        return Weighted(loss * (batch_num_tokens / dp_size) / tokens.clamp(min=1), tokens)
    if loss_agg_mode in MEAN_MODES:
        if global_batch_size is None:  # verl normalised by this micro-batch's sequences
            return Weighted(loss, (mask.sum(-1) > 0).sum())
        sequences = mask.shape[0]
        return Weighted(loss * (global_batch_size / dp_size / sequences), sequences)
    return None


def vanilla_states(
    old_log_prob: Any, log_prob: Any, advantages: Any, response_mask: Any, config: Any
) -> dict[str, Any]:
    """``actor/ppo_kl``, ``actor/pg_clipfrac`` and ``actor/pg_clipfrac_lower`` of one micro-batch
    as mergeable states, computed as verl 0.9's ``compute_policy_loss_vanilla`` does."""
    import torch

    clip = config.clip_ratio
    low = config.clip_ratio_low if config.clip_ratio_low is not None else clip
    high = config.clip_ratio_high if config.clip_ratio_high is not None else clip
    clip_c = config.get("clip_ratio_c", 3.0)
    mask = response_mask.detach().bool()
    tokens = mask.sum()
    log_ratio = torch.clamp(log_prob.detach() - old_log_prob, min=-20.0, max=20.0)
    ratio = torch.exp(log_ratio)
    advantages = advantages.detach()
    loss1 = -advantages * ratio
    loss2 = -advantages * torch.clamp(ratio, 1 - low, 1 + high)
    clipped = torch.gt(loss2, loss1) & mask
    lower = torch.gt(torch.maximum(loss1, loss2), -advantages * clip_c) & (advantages < 0) & mask
    kl_sum = torch.where(mask, -log_ratio, 0.0).double().sum()
    return {
        PPO_KL: Weighted(kl_sum / tokens.clamp(min=1), tokens),
        PG_CLIPFRAC: Fraction(clipped.sum(), tokens),
        PG_CLIPFRAC_LOWER: Fraction(lower.sum(), tokens),
    }


# ------------------------------------------------------------------ the hook


@dataclass(frozen=True)
class Scope:
    """The training micro-batch a loss function is computing: its role, step and run."""

    role: str
    step: int
    run: str | None
    address: str | None


_SCOPE: contextvars.ContextVar[Scope | None] = contextvars.ContextVar("rlpulse_verl_scope")
_MARK = "_rlpulse_loss_hook"


def _non_tensor(data: Any, key: str) -> Any:
    from verl.utils import tensordict_utils as tu

    return tu.get_non_tensor_data(data=data, key=key, default=None)


class LossHook:
    """Wraps verl's loss functions (and its driver's actor and critic updates) in this process.

    ``producer_for(role, run, address)`` gives the producer a micro-batch's states go to
    (``worker_producer`` by default); ``batch_meta(trainer)`` gives the driver's meta data for
    the batch of an update (the step, the run) or None to leave the batch as it is.

    >>> # hook = LossHook(lambda role, run, address: producer, lambda trainer: None)
    >>> # hook.install(); ... verl trains ...; hook.uninstall()
    """

    def __init__(
        self,
        producer_for: ProducerFor,
        batch_meta: Callable[[Any], Mapping[str, Any] | None],
    ) -> None:
        self.producer_for = producer_for
        self.batch_meta = batch_meta
        self._undo: list[tuple[Any, str, Any]] = []
        self._warned: set[str] = set()
        self._on_import: OnImport | None = None
        self._bound: dict[int, tuple[Any, Any]] = {}

    # ---------------------------------------------------------------- install / uninstall

    def install(self) -> None:
        """Wrap verl's functions in this process: its loss functions and its driver's trainer
        classes, now where their modules are imported, else as soon as they are (before any
        other module binds them by name: ``engine_workers`` binds ``ppo_loss`` at its import).
        Importing them here would cost every process of a Ray job, vLLM servers included,
        verl's training imports. A second install does nothing."""
        if self._on_import is None:
            self._on_import = OnImport((LOSSES, *TRAINERS), self._wrap_module)
            self._on_import.install()

    def _wrap_module(self, module: ModuleType) -> None:
        if module.__name__ == LOSSES:
            self._wrap_losses(module)
        else:
            self._wrap_trainer(module)

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

    def _wrap_trainer(self, module: ModuleType) -> None:
        cls = getattr(module, TRAINERS[module.__name__], None)
        if not isinstance(cls, type) or getattr(vars(cls).get("_update_actor"), _MARK, False):
            return
        check_trainer(cls)
        for method in TRAINER_METHODS:
            self._set(cls, method, self._update(vars(cls)[method]))

    # ---------------------------------------------------------------- the driver: the step

    def _update(self, original: Callable[..., Any]) -> Callable[..., Any]:
        """The driver's ``_update_actor`` / ``_update_critic``: the step (and run) ride in the
        batch's meta data (``meta_info``, or ``extra_info`` on verl's v1 trainer), which verl
        turns into every micro-batch's non-tensor data; removed again after the update."""
        hook = self

        @wraps(original)
        def update(self: Any, batch: Any, *args: Any, **kwargs: Any) -> Any:
            info = getattr(batch, "meta_info", None)
            if not isinstance(info, dict):
                info = getattr(batch, "extra_info", None)
            added: list[str] = []
            try:
                meta = hook.batch_meta(self) if isinstance(info, dict) else None
                for key, value in (meta or {}).items():
                    if key not in info and value is not None:
                        info[key] = value
                        added.append(key)
            except Exception as exc:  # never into verl's step
                hook._warn("meta", f"the step could not be passed to the workers: {exc!r}")
            try:
                return original(self, batch, *args, **kwargs)
            finally:
                for key in added:
                    info.pop(key, None)

        setattr(update, _MARK, True)
        return update

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
        meta = _non_tensor(data, META_KEY)
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
            scope = _SCOPE.get(None)
            info = getattr(config, "global_batch_info", None) or {}
            if (
                scope is not None
                and scope.role == ACTOR_ROLE
                and hook._data_parallel(ACTOR_ROLE, info.get("dp_size"))
            ):
                try:
                    # Now: ppo_loss subtracts the entropy bonus from pg_loss in place later.
                    states: dict[str, Any] = vanilla_states(
                        old_log_prob, log_prob, advantages, response_mask, config
                    )
                    weighted = loss_state(
                        pg_loss,
                        loss_agg_mode,
                        response_mask.detach().bool(),
                        int(info.get("dp_size") or 1),
                        info.get("batch_num_tokens"),
                        info.get("global_batch_size"),
                    )
                    if weighted is not None:
                        states[PG_LOSS] = weighted
                    hook._log(scope, states)
                except Exception as exc:  # never into verl's step
                    hook._warn("actor", f"actor micro-batch not logged: {exc!r}")
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
            scope = _SCOPE.get(None)
            if (
                scope is not None
                and scope.role == CRITIC_ROLE
                and hook._data_parallel(CRITIC_ROLE, dp_size)
            ):
                try:
                    import torch

                    mask = response_mask.detach().bool()
                    tokens = mask.sum()
                    # verl's masked mean: sum / (tokens + 1e-8); the clipped count, back.
                    clipped = vf_clipfrac.detach().double() * (tokens.double() + 1e-8)
                    vpred_sum = torch.where(mask, vpreds.detach(), 0.0).double().sum()
                    states: dict[str, Any] = {
                        VF_CLIPFRAC: Fraction(torch.round(clipped), tokens),
                        VPRED_MEAN: Weighted(vpred_sum / tokens.clamp(min=1), tokens),
                    }
                    weighted = loss_state(
                        vf_loss, loss_agg_mode, mask, dp_size, batch_num_tokens, global_batch_size
                    )
                    if weighted is not None:
                        states[VF_LOSS] = weighted
                    hook._log(scope, states)
                except Exception as exc:  # never into verl's step
                    hook._warn("critic", f"critic micro-batch not logged: {exc!r}")
            return vf_loss, vf_clipfrac

        return compute_value_loss

    def _log(self, scope: Scope, states: Mapping[str, Any]) -> None:
        producer = self.producer_for(scope.role, scope.run, scope.address)
        producer.log(states, step=scope.step)

    def _warn(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            log.warning("rlpulse verl hook: %s", message)


class OnImport(importlib.abc.MetaPathFinder):
    """Calls ``then(module)`` once each of ``names`` is imported (at once for those already
    imported): a finder first on ``sys.meta_path`` that hands the import to the others and
    wraps the loader they return."""

    def __init__(self, names: Any, then: Callable[[ModuleType], None]) -> None:
        self.names = frozenset(names)
        self.then = then

    def install(self) -> None:
        for name in self.names:
            module = sys.modules.get(name)
            if module is not None:
                self.then(module)
        sys.meta_path.insert(0, self)

    def uninstall(self) -> None:
        if self in sys.meta_path:
            sys.meta_path.remove(self)

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname not in self.names:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None:
                    spec.loader = _ThenLoader(spec.loader, self.then)
                return spec
        return None


class _ThenLoader(importlib.abc.Loader):
    def __init__(self, loader: Any, then: Callable[[ModuleType], None]) -> None:
        self.loader = loader
        self.then = then

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self.loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self.loader.exec_module(module)
        self.then(module)

    def __getattr__(self, name: str) -> Any:  # get_source, get_filename... (tracebacks)
        return getattr(self.loader, name)
