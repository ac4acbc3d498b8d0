"""What rides with a batch from verl's driver to its workers: the step, the run, the collector
and the phase a worker call is (:func:`batch_meta`), under :data:`META_KEY` of the batch's meta
data, which verl turns into the non-tensor data of every shard and micro-batch the workers get
(:func:`non_tensor` reads it back there).

>>> batch_meta({"trainer": {"logger": ["console"]}}, step=3)
{'rlpulse': {'step': None}}
"""

from __future__ import annotations

from typing import Any

from rlpulse.producer.integrations.verl_settings import logging_settings

STEP_KEY = "global_steps"
"""The batch meta data key the driver's step also travels under (verl's own name for it), for
loss code of your own."""
META_KEY = "rlpulse"
"""The batch meta data key of what the hooked workers read: ``{"step", "run", "address",
"phase"}``; ``step`` None when the driver has no ``rlpulse`` backend (the workers then log
nothing); ``phase`` (``{role}/{phase}``) names the phase a worker call is, when it is one."""


def batch_meta(config: Any, step: int, phase: str | None = None) -> dict[str, Any]:
    """The meta data verl's driver adds to a batch it sends its workers, from its whole config
    (``trainer.config``) and its ``global_steps``: the step, the run and the collector's
    address when the ``rlpulse`` backend is one of ``trainer.logger`` (else only that it is
    not), and ``phase`` when the worker call is one."""
    settings = logging_settings(config)
    if settings is None:
        return {META_KEY: {"step": None}}
    meta: dict[str, Any] = {"step": int(step), "run": settings.run, "address": settings.address}
    if phase is not None:
        meta["phase"] = phase
    return {STEP_KEY: int(step), META_KEY: meta}


def non_tensor(data: Any, key: str) -> Any:
    """``key`` of the non-tensor data of a batch a worker got (verl's ``TensorDict``), or None."""
    from verl.utils import tensordict_utils as tu

    return tu.get_non_tensor_data(data=data, key=key, default=None)
