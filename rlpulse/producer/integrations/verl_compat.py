"""verl compatibility for the exact loss hook (``rlpulse.producer.integrations.verl_loss``):
the verl versions it was tested with (:data:`TESTED_VERL`), the functions it wraps and their
signatures (:func:`check_losses`, :func:`check_trainer`, :func:`check`, each failing with a
ConfigError naming verl's version); ``OnImport`` (shared with ROLL's hook:
``rlpulse.producer.integrations.onimport``) wraps those functions as their modules are
imported, so a Ray process that never trains pays no verl import.

>>> check_version("0.9.1")
"""

from __future__ import annotations

import inspect
from types import ModuleType
from typing import Any

from rlpulse.producer.integrations.onimport import OnImport as OnImport
from rlpulse.schemas.errors import ConfigError

TESTED_VERL = ("0.9",)
"""verl versions (major.minor) whose loss functions and trainers this hook was checked against."""


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
