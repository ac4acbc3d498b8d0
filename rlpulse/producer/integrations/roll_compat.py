"""ROLL compatibility for the rlpulse hook: what it wraps, where, and the checks that what it
wraps is what it was written for. ROLL is on no package registry (the registry's ``roll`` is an
unrelated web framework), so its version cannot be trusted from package metadata: the hook
checks the functions it wraps instead (feature detection) and stops with a ConfigError naming
what differs. Tested with ROLL at commit :data:`TESTED_ROLL`.

>>> sorted(LOSS_CLASSES["roll.pipeline.base_worker"])
['CriticWorker']
"""

from __future__ import annotations

import inspect
from typing import Any

from rlpulse.schemas.errors import ConfigError

TESTED_ROLL = "8eb27cc2dc34c4d1310b169d9b86d339004d811a"
"""The alibaba/ROLL commit the hook was tested against (``tests/frameworks/test_roll_real.py``)."""

TRACKING = "roll.utils.tracking"
"""ROLL's tracker registry (``tracker_registry``, ``create_tracker``)."""

CLUSTER = "roll.distributed.executor.cluster"
"""ROLL's ``Cluster`` (the driver's handle on a group of worker actors)."""

DECORATOR = "roll.distributed.scheduler.decorator"
"""ROLL's ``register``, which marks the worker methods the driver calls."""

LOSS_CLASSES: dict[str, dict[str, str]] = {
    "roll.pipeline.rlvr.actor_worker": {"ActorWorker": "rlvr"},
    "roll.pipeline.agentic.agentic_actor_worker": {"ActorWorker": "agentic"},
    "roll.pipeline.base_worker": {"CriticWorker": "critic"},
}
"""module -> class -> kind, of the ``loss_func`` methods the hook wraps."""

MODEL_UPDATE_CLASSES: dict[str, tuple[str, ...]] = {
    "roll.distributed.executor.worker": ("Worker",),
    "roll.pipeline.base_worker": ("InferWorker",),
}
"""Classes defining ``start_model_update``, the one worker call the driver makes outside
``register`` (the weight update, which ROLL times as ``{cluster}/model_update``)."""

PHASE_NAMES = {"start_model_update": "model_update"}
"""Worker methods whose phase takes ROLL's own name of it."""

RLVR_PIPELINE = "roll.pipeline.rlvr.rlvr_pipeline"
METRICS_MANAGER = "roll.utils.metrics.metrics_manager"

SAMPLES_HOOKS: dict[str, tuple[tuple[str, str, str], ...]] = {
    METRICS_MANAGER: (("MetricsManager", "add_all_metrics", "trained"),),
    RLVR_PIPELINE: (("RLVRPipeline", "__init__", "built"), ("RLVRPipeline", "val", "validating")),
    "roll.pipeline.rlvr.rlvr_vlm_pipeline": (
        ("RLVRVLMPipeline", "__init__", "built"),
        ("RLVRVLMPipeline", "val", "validating"),
    ),
    "roll.pipeline.agentic.agentic_pipeline": (
        ("AgenticPipeline", "__init__", "built"),
        ("AgenticPipeline", "val", "validating"),
        ("", "compute_train_data_metrics", "trained_agentic"),
        ("", "dump_rollout_trajectories", "dumped"),
    ),
    "roll.distributed.scheduler.protocol": (("DataProto", "pop", "popped"),),
}
"""module -> ``(class or "" for the module, function, wrapper)`` of the driver's functions
that hold ROLL's batches (``roll_samples.SamplesHooks``)."""

_SAMPLES_PARAMS = {
    "validating": ("self", "global_step"),
    "trained": ("self", "global_step", "batch"),
    "trained_agentic": ("batch",),
    "popped": ("self", "batch_keys"),
    "dumped": ("path", "global_step", "data"),
}


def check_samples_hook(function: Any, how: str) -> str | None:
    """What makes ``function`` unfit for the samples wrapper ``how`` (its leading parameters
    differ from what it reads), None when it fits."""
    expected = _SAMPLES_PARAMS.get(how)
    if expected is None:
        return None
    try:
        params = tuple(inspect.signature(function).parameters)[: len(expected)]
    except (TypeError, ValueError):
        return "has no signature to check"
    return None if params == expected else f"takes {params} first, not {expected}"


EXACT_VAR = "RLPULSE_ROLL_EXACT"
"""``0`` in ``system_envs``: the workers' loss functions are left alone (ROLL's values are sent)."""

_LOSS_PARAMS = ("self", "data", "output_tensor")
_ACTOR_NEEDS = ("get_old_log_probs_with_cache", "compute_sample_weights")


def _problem(where: str, what: str) -> ConfigError:
    return ConfigError(
        "rlpulse.producer.integrations.roll",
        f"ROLL's {where} is not what the exact hook wraps ({what}; tested with ROLL "
        f"{TESTED_ROLL[:7]}); set {EXACT_VAR}: '0' in system_envs to send ROLL's own values",
        where,
    )


def check_loss(cls: type, module: str) -> None:
    """ConfigError unless ``cls.loss_func`` takes ``(self, data, output_tensor)`` and an actor
    class has the methods the hook reads the old log-probabilities and sample weights from."""
    where = f"{module}.{cls.__name__}"
    params = tuple(inspect.signature(vars(cls)["loss_func"]).parameters)
    if params != _LOSS_PARAMS:
        raise _problem(f"{where}.loss_func", f"parameters {params}, expected {_LOSS_PARAMS}")
    if cls.__name__ == "ActorWorker":
        missing = [m for m in _ACTOR_NEEDS if not callable(getattr(cls, m, None))]
        if "agentic" in module:
            missing = [m for m in missing if m != "compute_sample_weights"]
        if missing:
            raise _problem(where, f"no {', '.join(missing)}")


def check_tracking(tracking: Any) -> None:
    """ConfigError unless ROLL's tracking module has the registry the tracker joins."""
    registry = getattr(tracking, "tracker_registry", None)
    create = getattr(tracking, "create_tracker", None)
    if not isinstance(registry, dict) or not callable(create):
        raise _problem(TRACKING, "no tracker_registry dict or create_tracker")
