"""The ``rlpulse`` tracker's settings in a ROLL YAML: ``tracker_kwargs`` (with ``track_with:
rlpulse``), read alike by the driver's tracker and by every hooked worker, which both hold
ROLL's pipeline config.

>>> RollSettings.from_config({"exp_name": "grpo", "track_with": "rlpulse"}, {}).run
'grpo'
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from rlpulse.producer.config import ProducerConfig
from rlpulse.producer.integrations import section as section_fields
from rlpulse.schemas.errors import ConfigError

TRACKER = "rlpulse"
"""The name ``track_with`` takes."""
SECTION = "tracker_kwargs"


@dataclass(frozen=True)
class RollSettings:
    """``tracker_kwargs`` of a ROLL config whose ``track_with`` is ``rlpulse``; every key is
    optional.

    * ``address``: the collector (default: ``RLPULSE_ADDRESS``, then ``tcp://127.0.0.1:5555``).
    * ``run``: the run name (default: ROLL's ``exp_name``).
    * ``role``: the driver's role (default ``driver``); each worker logs as its cluster
      (``actor_train``, ``critic``...), rank ``RANK`` of ``WORLD_SIZE``.
    * ``exact``: the workers log ROLL's loss metrics exactly (default true); false: the driver
      sends ROLL's values of them.
    * ``phases``: every ROLL worker call is a phase of its rank (default true).
    * ``samples``: the driver logs each step's trained generations as ``rollout/samples`` and
      each validation's as ``val/samples`` (default true; ``roll_samples``).
    * ``worker_side``: more names the workers log exactly themselves (the driver leaves ROLL's
      value of them out).
    * ``config_dir``: where ROLL's resolved config is saved as ``config.yaml``, ``{run}``
      filled in (default ``runs/{run}``; null: not saved).
    * ``producer``: :class:`~rlpulse.producer.config.ProducerConfig` fields.
    """

    run: str
    address: str | None = None
    role: str = "driver"
    exact: bool = True
    phases: bool = True
    samples: bool = True
    worker_side: tuple[str, ...] = ()
    config_dir: str | None = "runs/{run}"
    producer: ProducerConfig = field(default_factory=ProducerConfig)

    @classmethod
    def from_config(cls, config: Any, kwargs: Mapping[str, Any] | None) -> RollSettings:
        """Read ``kwargs`` (ROLL's ``tracker_kwargs``) for the run of ``config`` (ROLL's
        pipeline config, an object or its ``to_dict()``); ConfigError naming the field."""
        section = dict(kwargs or {})
        known = {f.name for f in fields(cls)}
        for key in section:
            if key not in known:
                raise ConfigError(
                    f"{SECTION}.{key}", f"unknown setting; expected one of {sorted(known)}"
                )
        exp_name = config.get("exp_name") if isinstance(config, Mapping) else None
        if exp_name is None:
            exp_name = getattr(config, "exp_name", None)
        run = section.get("run", exp_name)
        for key, value in (("run", run), ("role", section.get("role", "driver"))):
            if not isinstance(value, str) or not value:
                raise ConfigError(f"{SECTION}.{key}", "must be a non-empty string", value)
        address = section.get("address")
        if address is not None and (not isinstance(address, str) or not address):
            raise ConfigError(f"{SECTION}.address", "must be a collector address", address)
        flags = {}
        for key in ("exact", "phases", "samples"):
            value = section.get(key, True)
            if not isinstance(value, bool):
                raise ConfigError(f"{SECTION}.{key}", "must be true or false", value)
            flags[key] = value
        names = section_fields.worker_side(section, SECTION)
        config_dir = section_fields.config_dir(section, SECTION, cls.config_dir)
        producer_config = section_fields.producer_config(section, SECTION)
        return cls(
            run=str(run),
            address=address,
            role=section.get("role", "driver"),
            worker_side=names,
            config_dir=config_dir,
            producer=producer_config,
            **flags,
        )


def tracked(config: Any) -> bool:
    """Whether ROLL's pipeline ``config`` (object or mapping) tracks with rlpulse."""
    value = (
        config.get("track_with")
        if isinstance(config, Mapping)
        else getattr(config, "track_with", None)
    )
    return value == TRACKER


def tracker_kwargs(config: Any) -> Mapping[str, Any]:
    value = config.get(SECTION) if isinstance(config, Mapping) else getattr(config, SECTION, None)
    return value or {}


def resumes(config: Any) -> bool:
    """Whether ROLL resumes this run from a checkpoint (``resume_from_checkpoint``)."""
    value = (
        config.get("resume_from_checkpoint")
        if isinstance(config, Mapping)
        else getattr(config, "resume_from_checkpoint", None)
    )
    return bool(value)
