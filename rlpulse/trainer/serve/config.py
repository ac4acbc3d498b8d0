"""The policy server's configuration: one frozen dataclass, validated when it is made.

Every default is spelled here once; the command line (``rlpulse.trainer.serve.__main__``) only
overrides fields.

>>> ServeConfig(model="runs/demo/checkpoint-29/actor").host
'127.0.0.1'
>>> ServeConfig(model="m", max_batch_size=0)
Traceback (most recent call last):
...
schemas.errors.ConfigError: max_batch_size: must be an integer >= 1 (got 0)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

from rlpulse.schemas.errors import ConfigError

DEVICES = ("auto", "cpu", "cuda")


@dataclass(frozen=True)
class ServeConfig:
    """What ``python -m rlpulse.trainer.serve`` runs: the model, the address, batching, request
    limits and where metrics go."""

    model: str
    """Directory of a HuggingFace checkpoint (``runs/<run>/checkpoint-<step>/actor``)."""
    host: str = "127.0.0.1"
    """Loopback unless told otherwise: other machines reach the server only when this says so."""
    port: int = 8000
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """``auto``: the GPU when torch sees one, else the CPU."""
    max_batch_size: int = 32
    """Requests generated together in one model call at most."""
    batch_wait_ms: float = 0.0
    """How long a batch waits for more requests after its first; 0 takes what is queued (the
    requests that arrived while the model was busy), adding no latency at low load."""
    max_queue: int = 256
    """Requests waiting for the model at most; beyond it the server answers 503 overloaded."""
    max_new_tokens_limit: int = 256
    """The largest max_new_tokens a request may ask for (the model's context caps it too)."""
    default_max_new_tokens: int = 16
    default_temperature: float = 1.0
    """The policy's own sampling distribution, as it was trained; 0 decodes greedily."""
    max_temperature: float = 10.0
    max_body_bytes: int = 65536
    """Larger request bodies are refused (413) before they are parsed."""
    request_timeout_s: float = 30.0
    """A connection must deliver each request whole (headers and body) within this many
    seconds of opening, or of its first byte after the previous answer; else it is closed
    (half-open and slow-loris connections). Generating the answer is not limited by it."""
    max_connections: int = 256
    """Connections open at once at most (each half-open or slow one holds its place until
    ``request_timeout_s``); one beyond is answered 503 ``overloaded`` and closed at once, so
    a flood of them costs a socket for a moment, not memory for ever."""
    collector: str | None = None
    """Collector address (``tcp://host:5555``) to stream serving metrics to; None: no metrics."""
    run: str = "serve"
    """The run name the metrics carry (the ``run`` label on Prometheus)."""
    rank: int = 0
    """This replica's index among ``replicas`` (the collector merges replicas exactly)."""
    replicas: int = 1
    report_interval_s: float = 1.0
    """Length of a reporting window: one metrics step each."""
    torch_threads: int | None = None
    """CPU threads for torch (None: torch's default)."""

    def __post_init__(self) -> None:
        _require(
            isinstance(self.model, str) and bool(self.model), "model", "is required", self.model
        )
        _require(
            isinstance(self.host, str) and bool(self.host),
            "host",
            "must be a host name or address",
            self.host,
        )
        _require(
            _int(self.port) and 0 <= self.port <= 65535,
            "port",
            "must be an integer from 0 to 65535",
            self.port,
        )
        _require(
            self.device in DEVICES, "device", f"must be one of {', '.join(DEVICES)}", self.device
        )
        for name in (
            "max_batch_size",
            "max_queue",
            "max_new_tokens_limit",
            "default_max_new_tokens",
            "max_body_bytes",
            "max_connections",
            "replicas",
        ):
            _require(
                _int(getattr(self, name)) and getattr(self, name) >= 1,
                name,
                "must be an integer >= 1",
                getattr(self, name),
            )
        _require(
            _number(self.batch_wait_ms) and 0 <= self.batch_wait_ms <= 1000,
            "batch_wait_ms",
            "must be a number from 0 to 1000",
            self.batch_wait_ms,
        )
        _require(
            _number(self.max_temperature) and self.max_temperature > 0,
            "max_temperature",
            "must be a positive number",
            self.max_temperature,
        )
        _require(
            _number(self.default_temperature)
            and 0 <= self.default_temperature <= self.max_temperature,
            "default_temperature",
            f"must be a number from 0 to max_temperature ({self.max_temperature})",
            self.default_temperature,
        )
        _require(
            self.default_max_new_tokens <= self.max_new_tokens_limit,
            "default_max_new_tokens",
            f"must be at most max_new_tokens_limit ({self.max_new_tokens_limit})",
            self.default_max_new_tokens,
        )
        _require(
            _int(self.rank) and 0 <= self.rank < self.replicas,
            "rank",
            f"must be an integer from 0 to replicas - 1 ({self.replicas - 1})",
            self.rank,
        )
        _require(
            isinstance(self.run, str) and bool(self.run),
            "run",
            "must be a non-empty string",
            self.run,
        )
        _require(
            _number(self.request_timeout_s) and 0.05 <= self.request_timeout_s <= 3600,
            "request_timeout_s",
            "must be a number of seconds from 0.05 to 3600",
            self.request_timeout_s,
        )
        _require(
            _number(self.report_interval_s) and 0.05 <= self.report_interval_s <= 3600,
            "report_interval_s",
            "must be a number of seconds from 0.05 to 3600",
            self.report_interval_s,
        )
        _require(
            self.collector is None or (isinstance(self.collector, str) and "://" in self.collector),
            "collector",
            "must be a ZeroMQ address such as tcp://127.0.0.1:5555",
            self.collector,
        )
        _require(
            self.torch_threads is None or (_int(self.torch_threads) and self.torch_threads >= 1),
            "torch_threads",
            "must be an integer >= 1",
            self.torch_threads,
        )


def _int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _require(ok: bool, name: str, problem: str, value: Any) -> None:
    if not ok:
        raise ConfigError(name, problem, value)
