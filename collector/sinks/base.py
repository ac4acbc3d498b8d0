"""The protocol every sink implements, and what the collector hands a sink at start-up.

A sink is one class in one file under ``collector/sinks/``. The collector builds it with
``from_kwargs(kwargs, ctx)`` at start-up (where bad kwargs raise :class:`ConfigError` naming the
field, and a missing optional library raises one with the install hint), calls ``open()`` once,
``write(record)`` for every emitted step in order, and ``close()`` once. Each sink runs on its
own worker thread (``collector.fanout``), so a slow sink delays nobody else; a sink may block
and may raise, and the fan-out retries and counts its failures.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from collector.errors import ConfigError
from schemas.catalog import Catalog
from schemas.metrics import CATALOG
from schemas.record import StepRecord


def _no_health() -> Mapping[str, float]:
    return {}


@dataclass(frozen=True)
class SinkContext:
    """What a sink may use besides its kwargs.

    ``health`` returns a snapshot of the collector's own counters; ``environ`` is the process
    environment (API keys come from here, read by the sink that needs them).
    """

    catalog: Catalog = CATALOG
    health: Callable[[], Mapping[str, Any]] = _no_health
    environ: Mapping[str, str] = field(default_factory=dict)


def reject_unknown(kwargs: Mapping[str, Any], allowed: tuple[str, ...], field: str) -> None:
    """Fail at start-up on a tracker kwarg the sink does not take, naming it."""
    unknown = sorted(set(kwargs) - set(allowed))
    if unknown:
        raise ConfigError(
            f"{field}.{unknown[0]}", f"unknown option; expected one of {', '.join(allowed)}"
        )


class Sink(Protocol):
    """A destination for aggregated steps."""

    name: str

    def open(self) -> None: ...

    def write(self, record: StepRecord) -> None: ...

    def close(self) -> None: ...


class SinkFactory(Protocol):
    def from_kwargs(self, kwargs: Mapping[str, Any], ctx: SinkContext) -> Sink: ...
