"""Sinks by tracker name. Each is imported only when configured, so a missing optional
library fails at start-up of the collector that asks for it, with its install hint."""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

from collector.errors import ConfigError
from collector.sinks.base import Sink, SinkContext

SINKS: dict[str, str] = {
    "stdout": "collector.sinks.stdout:StdoutSink",
    "jsonl": "collector.sinks.jsonl:JsonlSink",
    "tensorboard": "collector.sinks.tensorboard:TensorBoardSink",
    "wandb": "collector.sinks.wandb:WandbSink",
    "swanlab": "collector.sinks.swanlab:SwanLabSink",
    "prometheus": "collector.sinks.prometheus:PrometheusSink",
}


def build_sink(name: str, kwargs: Mapping[str, Any], ctx: SinkContext) -> Sink:
    """Construct the sink registered as ``name``; raise ConfigError for unknown names."""
    target = SINKS.get(name)
    if target is None:
        raise ConfigError(
            "track_with", f"unknown tracker; choose from {', '.join(sorted(SINKS))}", name
        )
    module_name, _, class_name = target.partition(":")
    module = importlib.import_module(module_name)
    return getattr(module, class_name).from_kwargs(kwargs, ctx)


__all__ = ["SINKS", "Sink", "SinkContext", "build_sink"]
