"""The collector's environment variables, read in this one place.

Sinks never read the environment: each lists in ``ENV`` the variables that stand in for its
kwargs (``WANDB_MODE`` for wandb's ``mode``), and :func:`sink_defaults` reads them at start-up
into the sink's :class:`~rlpulse.collector.sinks.base.SinkContext`.

>>> sink_defaults({"mode": "WANDB_MODE"}, {"WANDB_MODE": "offline"})["mode"]
Setting(value='offline', source='WANDB_MODE')
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class Setting:
    """A sink setting that did not come from its kwargs, and where it came from (for error
    messages: ``WANDB_MODE``)."""

    value: str
    source: str


def sink_defaults(variables: Mapping[str, str], environ: Mapping[str, str]) -> dict[str, Setting]:
    """The kwargs ``variables`` (kwarg -> variable) set in ``environ``, with their source."""
    return {
        kwarg: Setting(environ[var], var) for kwarg, var in variables.items() if environ.get(var)
    }
