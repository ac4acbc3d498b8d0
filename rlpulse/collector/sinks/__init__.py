"""Sinks by tracker name. Each is imported only when configured, so a missing optional
library fails at start-up of the collector that asks for it, with its install hint."""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Mapping
from typing import Any, ClassVar, Protocol

from rlpulse.collector.env import sink_defaults
from rlpulse.collector.sinks.base import Sink, SinkContext
from rlpulse.schemas.errors import ConfigError

SINKS: dict[str, str] = {
    "stdout": "rlpulse.collector.sinks.stdout:StdoutSink",
    "jsonl": "rlpulse.collector.sinks.jsonl:JsonlSink",
    "tensorboard": "rlpulse.collector.sinks.tensorboard:TensorBoardSink",
    "wandb": "rlpulse.collector.sinks.wandb:WandbSink",
    "swanlab": "rlpulse.collector.sinks.swanlab:SwanLabSink",
    "prometheus": "rlpulse.collector.sinks.prometheus:PrometheusSink",
    "trace": "rlpulse.collector.sinks.trace:TraceSink",
    "otlp": "rlpulse.collector.sinks.otlp:OtlpSink",
}


class SinkClass(Protocol):
    """What a sink class offers the map: its ``ENV`` and its validating constructor."""

    ENV: ClassVar[Mapping[str, str]]
    PATHS: ClassVar[tuple[str, ...]]

    def from_kwargs(self, kwargs: Mapping[str, Any], ctx: SinkContext) -> Sink: ...


def sink_class(name: str) -> SinkClass:
    """The class registered as ``name``; raise ConfigError for unknown names."""
    target = SINKS.get(name)
    if target is None:
        raise ConfigError(
            "track_with", f"unknown tracker; choose from {', '.join(sorted(SINKS))}", name
        )
    module_name, _, class_name = target.partition(":")
    return getattr(importlib.import_module(module_name), class_name)


def build_sink(
    name: str, kwargs: Mapping[str, Any], ctx: SinkContext, environ: Mapping[str, str] | None = None
) -> Sink:
    """Construct the sink registered as ``name``, with the settings its ``ENV`` variables give
    in ``environ``; raise ConfigError for unknown names and bad kwargs."""
    cls = sink_class(name)
    defaults = sink_defaults(cls.ENV, environ or {})
    return cls.from_kwargs(kwargs, dataclasses.replace(ctx, defaults=defaults))


__all__ = ["SINKS", "Sink", "SinkContext", "build_sink", "sink_class"]
