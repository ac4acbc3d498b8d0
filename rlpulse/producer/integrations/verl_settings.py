"""The ``rlpulse.trainer.rlpulse`` section of verl's config: the settings of the ``rlpulse``
tracking backend (:class:`VerlSettings`), read alike by the driver's backend and by the hooks
that tell verl's workers where to log (:func:`logging_settings`).

>>> logging_settings({"trainer": {"logger": ["console"]}}) is None
True
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from rlpulse.producer.config import ProducerConfig
from rlpulse.producer.integrations import section as section_fields
from rlpulse.schemas.errors import ConfigError

BACKEND = "rlpulse"
"""The name to put in ``rlpulse.trainer.logger``."""
SECTION = "rlpulse.trainer.rlpulse"
"""Where verl's config holds this backend's settings."""


@dataclass(frozen=True)
class VerlSettings:
    """The ``rlpulse.trainer.rlpulse`` section of verl's config; every key is optional.

    * ``address``: the collector (default: ``RLPULSE_ADDRESS``, then ``tcp://127.0.0.1:5555``).
    * ``run``: the run name (default: ``rlpulse.trainer.experiment_name``).
    * ``role``: the driver's role (default ``driver``).
    * ``expected_roles``: role -> world size of the roles whose workers log too
      (``{actor_train: 8}``); the collector then waits for them at every step.
    * ``worker_side``: metrics the workers log exactly; the driver leaves its own value of
      them out (a catalog family such as ``critic/advantages`` covers its ``/mean``, ``/max``,
      ``/min``). The loss metrics the setup hook makes exact are added by themselves.
    * ``config_dir``: where verl's resolved config is saved as ``config.yaml`` (it is sent to
      the collector too, ``Producer.run_config``, whose sinks record it), with ``{run}``
      filled in (default ``runs/{run}``, relative to the driver's working directory; null: not
      saved).
    * ``producer``: :class:`~rlpulse.producer.config.ProducerConfig` fields (``{close_timeout_s: 5}``).

    >>> VerlSettings.from_config({"trainer": {"rlpulse": {"role": "ppo_driver"}}}, "exp").run
    'exp'
    """

    run: str
    address: str | None = None
    role: str = "driver"
    expected_roles: Mapping[str, int] = field(default_factory=dict)
    worker_side: tuple[str, ...] = ()
    config_dir: str | None = "runs/{run}"
    producer: ProducerConfig = field(default_factory=ProducerConfig)

    @classmethod
    def from_config(cls, config: Mapping[str, Any] | None, experiment_name: str) -> VerlSettings:
        """Read and check ``rlpulse.trainer.rlpulse``; ConfigError naming the field if it is wrong."""
        trainer = (config or {}).get("trainer") or {}
        section = trainer.get("rlpulse") if isinstance(trainer, Mapping) else None
        section = {} if section is None else section
        if not isinstance(section, Mapping):
            raise ConfigError(SECTION, "must be a mapping of settings", section)
        known = {f.name for f in fields(cls)}
        for key in section:
            if key not in known:
                raise ConfigError(
                    f"{SECTION}.{key}", f"unknown setting; expected one of {sorted(known)}"
                )
        run = section.get("run", experiment_name)
        for key in ("run", "role"):
            value = run if key == "run" else section.get(key, "driver")
            if not isinstance(value, str) or not value:
                raise ConfigError(f"{SECTION}.{key}", "must be a non-empty string", value)
        address = section.get("address")
        if address is not None and (not isinstance(address, str) or not address):
            raise ConfigError(f"{SECTION}.address", "must be a collector address", address)
        expected = section.get("expected_roles") or {}
        if not isinstance(expected, Mapping) or not all(
            isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool) and v >= 1
            for k, v in expected.items()
        ):
            raise ConfigError(
                f"{SECTION}.expected_roles", "must map role names to world sizes >= 1", expected
            )
        names = section_fields.worker_side(section, SECTION)
        config_dir = section_fields.config_dir(section, SECTION, cls.config_dir)
        producer_config = section_fields.producer_config(section, SECTION)
        return cls(
            run=run,
            address=address,
            role=section.get("role", "driver"),
            expected_roles=dict(expected),
            worker_side=names,
            config_dir=config_dir,
            producer=producer_config,
        )


def named(loggers: Any) -> bool:
    """Whether verl's ``trainer.logger`` (a name or a list of names) names the ``rlpulse``
    backend."""
    return BACKEND in ([loggers] if isinstance(loggers, str) else list(loggers or ()))


def logging_settings(config: Any) -> VerlSettings | None:
    """The settings of a verl config (a mapping or an OmegaConf config, whole) whose driver
    logs to the ``rlpulse`` backend; None when ``trainer.logger`` does not name it (then
    nothing is logged worker-side either)."""
    trainer = config.get("trainer") or {}
    if not named(trainer.get("logger")):
        return None
    section = trainer.get("rlpulse")
    try:
        from omegaconf import OmegaConf

        if OmegaConf.is_config(section):
            section = OmegaConf.to_container(section, resolve=True)
    except ImportError:  # a plain mapping
        pass
    return VerlSettings.from_config(
        {"trainer": {"rlpulse": section}}, str(trainer.get("experiment_name"))
    )
