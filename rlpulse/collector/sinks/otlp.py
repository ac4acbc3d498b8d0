"""``otlp``: every rank's phases as OpenTelemetry traces over OTLP/HTTP (Tempo, Jaeger, an
OpenTelemetry Collector).

Each emitted step is one trace: a root span ``{run} step {n}`` from the step's first phase
start to its last phase end, and a child span per rank and phase (``rlpulse.schemas.spans``) named
``{cluster}/{phase}``, with attributes ``rlpulse.run``, ``rlpulse.step``, ``rlpulse.role``,
``rlpulse.rank``, ``host.name`` and, when measured, ``rlpulse.execute_s`` and ``rlpulse.gpu_s``.
Spans are built with the OpenTelemetry SDK and sent with its own OTLP/HTTP protobuf exporter,
synchronously, one request per step: a refused export raises, so the fan-out retries it and,
with ``state_dir``, a step reaches the endpoint even after the collector restarts.

kwargs: ``endpoint`` (default ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``, else
``http://127.0.0.1:4318/v1/traces``), ``headers`` (a map, e.g. an auth token), ``timeout_s``
(default 10), ``service_name`` (default ``rlpulse``). Needs ``opentelemetry-sdk`` and
``opentelemetry-exporter-otlp-proto-http`` (the ``otlp`` extra).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, ClassVar

from rlpulse.collector.sinks.base import Sink, SinkContext, reject_unknown
from rlpulse.schemas.errors import ConfigError
from rlpulse.schemas.record import StepRecord

DEFAULT_ENDPOINT = "http://127.0.0.1:4318/v1/traces"
DEFAULT_TIMEOUT_S = 10.0
_KWARGS = ("endpoint", "headers", "timeout_s", "service_name")


def _ns(seconds: float) -> int:
    """Epoch seconds to nanoseconds, exact to the nanosecond (``seconds * 1e9`` is not: it
    exceeds a double's 53 bits)."""
    whole = math.floor(seconds)
    return whole * 1_000_000_000 + round((seconds - whole) * 1e9)


class OtlpSink(Sink):
    """Sends each step's spans as one trace (see the module docstring)."""

    name = "otlp"
    ENV: ClassVar[Mapping[str, str]] = {"endpoint": "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"}

    def __init__(
        self,
        endpoint: str = DEFAULT_ENDPOINT,
        headers: Mapping[str, str] | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        service_name: str = "rlpulse",
    ) -> None:
        self.endpoint = endpoint
        self.headers = dict(headers or {})
        self.timeout_s = timeout_s
        self.service_name = service_name
        self._tracer: Any = None

    @classmethod
    def from_kwargs(cls, kwargs: Mapping[str, Any], ctx: SinkContext) -> OtlpSink:
        reject_unknown(kwargs, _KWARGS, "tracker_kwargs.otlp")
        try:
            import opentelemetry.exporter.otlp.proto.http.trace_exporter
            import opentelemetry.sdk.trace  # noqa: F401
        except ImportError:
            raise ConfigError(
                "track_with",
                "otlp needs opentelemetry-sdk and opentelemetry-exporter-otlp-proto-http: "
                "pip install 'rlpulse[otlp]'",
                "otlp",
            ) from None
        default = ctx.defaults.get("endpoint")
        endpoint = kwargs.get("endpoint", default.value if default else DEFAULT_ENDPOINT)
        if not isinstance(endpoint, str) or not endpoint.startswith(("http://", "https://")):
            raise ConfigError("tracker_kwargs.otlp.endpoint", "must be an http(s):// URL", endpoint)
        headers = kwargs.get("headers", {})
        if not isinstance(headers, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in headers.items()
        ):
            raise ConfigError(
                "tracker_kwargs.otlp.headers", "must map header names to strings", headers
            )
        timeout = kwargs.get("timeout_s", DEFAULT_TIMEOUT_S)
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0:
            raise ConfigError("tracker_kwargs.otlp.timeout_s", "must be a positive number", timeout)
        service = kwargs.get("service_name", "rlpulse")
        if not isinstance(service, str) or not service:
            raise ConfigError("tracker_kwargs.otlp.service_name", "must be a name", service)
        return cls(endpoint, headers, float(timeout), service)

    def open(self) -> None:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

        self._exporter = OTLPSpanExporter(
            endpoint=self.endpoint, headers=self.headers, timeout=self.timeout_s
        )
        self._finished = InMemorySpanExporter()
        self._provider = TracerProvider(
            resource=Resource.create({"service.name": self.service_name})
        )
        self._provider.add_span_processor(SimpleSpanProcessor(self._finished))
        self._tracer = self._provider.get_tracer("rlpulse.collector")

    def write(self, record: StepRecord) -> None:
        if not record.spans:
            return
        if self._tracer is None:
            self.open()
        from opentelemetry import trace
        from opentelemetry.sdk.trace.export import SpanExportResult

        start = min(s.start for s in record.spans)
        end = max(s.end for s in record.spans)
        base = {"rlpulse.run": record.run, "rlpulse.step": record.step}
        root = self._tracer.start_span(
            f"{record.run} step {record.step}",
            context=trace.set_span_in_context(trace.INVALID_SPAN),
            start_time=_ns(start),
            attributes={**base, "rlpulse.partial": record.partial, "rlpulse.ranks": record.ranks},
        )
        parent = trace.set_span_in_context(root)
        for s in record.spans:
            attributes: dict[str, Any] = {
                **base,
                "rlpulse.role": s.role,
                "rlpulse.rank": s.rank,
                "host.name": s.host,
            }
            if s.execute is not None:
                attributes["rlpulse.execute_s"] = s.execute
            if s.gpu is not None:
                attributes["rlpulse.gpu_s"] = s.gpu
            child = self._tracer.start_span(
                f"{s.cluster}/{s.phase}",
                context=parent,
                start_time=_ns(s.start),
                attributes=attributes,
            )
            child.end(end_time=_ns(s.end))
        root.end(end_time=_ns(end))
        spans = self._finished.get_finished_spans()
        self._finished.clear()
        if self._exporter.export(spans) is not SpanExportResult.SUCCESS:
            raise ConnectionError(f"the OTLP endpoint {self.endpoint} refused step {record.step}")

    def close(self) -> None:
        if self._tracer is not None:
            self._provider.shutdown()
            self._exporter.shutdown()
            self._tracer = None
