"""The ``otlp`` sink against a loopback HTTP receiver that decodes the real OTLP protobuf
request (``opentelemetry-proto``): a trace per step, a child span per rank and phase, exact
times and attributes; a refused request raises so the fan-out retries it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

pytest.importorskip("opentelemetry.exporter.otlp.proto.http.trace_exporter")

from rlpulse.collector.sinks.base import SinkContext
from rlpulse.collector.sinks.otlp import OtlpSink, _ns
from rlpulse.schemas.errors import ConfigError
from rlpulse.schemas.record import StepRecord
from rlpulse.schemas.spans import Span
from tests.collector.sinks.otlp_receiver import Receiver


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.server.shutdown()


def attrs(span) -> dict:
    out = {}
    for kv in span.attributes:
        v = kv.value
        out[kv.key] = getattr(v, v.WhichOneof("value"))
    return out


SPANS = (
    Span("actor_train", 0, "n0", "actor_train", "train_step", 1700000000.25, 1700000002.5, 2.0),
    Span(
        "actor_train", 1, "n1", "actor_train", "train_step", 1700000000.5, 1700000003.75, 3.0, 3.5
    ),
)


def test_each_step_is_one_trace_with_a_span_per_rank_phase(receiver: Receiver) -> None:
    sink = OtlpSink.from_kwargs(
        {"endpoint": receiver.url, "headers": {"x-token": "t"}, "service_name": "ppo"},
        SinkContext(),
    )
    sink.open()
    sink.write(StepRecord(run="r", step=7, metrics={}, ranks=2, spans=SPANS))
    sink.write(StepRecord(run="r", step=8, metrics={}))  # no spans: nothing sent
    sink.close()
    assert len(receiver.requests) == 1 and receiver.headers[0]["x-token"] == "t"
    resource = receiver.requests[0].resource_spans[0].resource
    assert {kv.key: kv.value.string_value for kv in resource.attributes}["service.name"] == "ppo"
    spans = receiver.spans()
    root = next(s for s in spans if s.name == "r step 7")
    children = sorted((s for s in spans if s is not root), key=lambda s: attrs(s)["rlpulse.rank"])
    assert len(children) == 2
    assert {s.trace_id for s in spans} == {root.trace_id}
    assert all(s.parent_span_id == root.span_id for s in children)
    assert root.start_time_unix_nano == 1700000000250000000
    assert root.end_time_unix_nano == 1700000003750000000
    for span, want in zip(children, SPANS, strict=True):
        assert span.name == "actor_train/train_step"
        assert span.start_time_unix_nano == _ns(want.start)
        assert span.end_time_unix_nano == _ns(want.end)
        got = attrs(span)
        assert got["rlpulse.run"] == "r" and got["rlpulse.step"] == 7
        assert (got["rlpulse.role"], got["rlpulse.rank"], got["host.name"]) == (
            "actor_train",
            want.rank,
            want.host,
        )
        assert got["rlpulse.execute_s"] == want.execute
        assert ("rlpulse.gpu_s" in got) == (want.gpu is not None)


def test_a_refused_export_raises_for_the_fan_out_to_retry(receiver: Receiver) -> None:
    receiver.status = 400
    sink = OtlpSink(receiver.url, timeout_s=2)
    sink.open()
    with pytest.raises(ConnectionError, match="refused step 3"):
        sink.write(StepRecord(run="r", step=3, metrics={}, spans=SPANS))
    sink.close()


def test_bad_settings_are_named() -> None:
    with pytest.raises(ConfigError, match="endpoint"):
        OtlpSink.from_kwargs({"endpoint": "grpc://x:4317"}, SinkContext())
    with pytest.raises(ConfigError, match="headers"):
        OtlpSink.from_kwargs({"headers": {"a": 1}}, SinkContext())
    with pytest.raises(ConfigError, match="unknown option"):
        OtlpSink.from_kwargs({"url": "http://x"}, SinkContext())
