"""The policy server's parts, in process: request checks, the engine's batched generation,
dynamic batching and the server's metrics windows. The real server (uvicorn on a loopback
port) is tested in tests/integration/test_serve.py."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from rlpulse.schemas import serving as S
from rlpulse.schemas.errors import ConfigError
from rlpulse.schemas.histogram import bucket_counts
from rlpulse.trainer.rollout import generate_hf
from rlpulse.trainer.serve.batcher import PHASE, Batcher
from rlpulse.trainer.serve.config import ServeConfig
from rlpulse.trainer.serve.engine import Answer, Engine, Job, RowTemperature
from rlpulse.trainer.serve.requests import (
    STATUS,
    GenerateRequest,
    Limits,
    RequestError,
    error_body,
    parse_request,
)
from rlpulse.trainer.serve.telemetry import Reporter, ServeMetrics
from rlpulse.trainer.tokenizer import build_tokenizer
from tests.servemodel import PROMPTS, make_checkpoint

LIMITS = Limits(
    max_new_tokens=63, max_temperature=10.0, default_max_new_tokens=16, default_temperature=1.0
)


# --------------------------------------------------------------------------- requests


def test_every_error_kind_has_a_status_and_client_errors_are_4xx() -> None:
    assert set(STATUS) == set(S.ERROR_KINDS)
    assert {k for k, v in STATUS.items() if v >= 500} == {S.OVERLOADED, S.INTERNAL}
    assert all(400 <= v < 500 for k, v in STATUS.items() if k not in (S.OVERLOADED, S.INTERNAL))


def test_a_valid_request_gets_its_defaults() -> None:
    assert parse_request(b'{"prompt": "ab>"}', LIMITS) == GenerateRequest("ab>", 16, 1.0)
    assert parse_request(
        b'{"prompt": "ab>", "max_new_tokens": 63, "temperature": 10}', LIMITS
    ) == GenerateRequest("ab>", 63, 10.0)


BAD = [
    (b"", S.INVALID_JSON, None, "not valid JSON"),
    (b"{prompt: 1}", S.INVALID_JSON, None, "not valid JSON"),
    (b"\xff\xfe", S.INVALID_JSON, None, "not valid JSON"),
    (b'["abc>"]', S.INVALID_JSON, None, "must be a JSON object, got an array"),
    (b'"abc>"', S.INVALID_JSON, None, "must be a JSON object, got a string"),
    (b'{"prompt": "a", "max_tokens": 3}', S.UNKNOWN_FIELD, "max_tokens", "'max_tokens'"),
    (b'{"max_new_tokens": 3}', S.MISSING_FIELD, "prompt", "prompt is required"),
    (b'{"prompt": 5}', S.WRONG_TYPE, "prompt", "prompt must be a string, got an integer"),
    (b'{"prompt": null}', S.WRONG_TYPE, "prompt", "got null"),
    (b'{"prompt": ["a"]}', S.WRONG_TYPE, "prompt", "got an array"),
    (b'{"prompt": ""}', S.EMPTY_PROMPT, "prompt", "prompt is empty"),
    (b'{"prompt": "a", "max_new_tokens": "8"}', S.WRONG_TYPE, "max_new_tokens", "a string"),
    (b'{"prompt": "a", "max_new_tokens": 8.5}', S.WRONG_TYPE, "max_new_tokens", "a number"),
    (b'{"prompt": "a", "max_new_tokens": true}', S.WRONG_TYPE, "max_new_tokens", "a boolean"),
    (b'{"prompt": "a", "max_new_tokens": 0}', S.OUT_OF_RANGE, "max_new_tokens", "from 1 to 63"),
    (b'{"prompt": "a", "max_new_tokens": -3}', S.OUT_OF_RANGE, "max_new_tokens", "got -3"),
    (
        b'{"prompt": "a", "max_new_tokens": 1000000000000}',
        S.OUT_OF_RANGE,
        "max_new_tokens",
        "1000000000000",
    ),
    (
        b'{"prompt": "a", "temperature": "hot"}',
        S.WRONG_TYPE,
        "temperature",
        "a number, got a string",
    ),
    (
        b'{"prompt": "a", "temperature": -0.1}',
        S.OUT_OF_RANGE,
        "temperature",
        "from 0 (greedy) to 10",
    ),
    (b'{"prompt": "a", "temperature": 1e9}', S.OUT_OF_RANGE, "temperature", "1000000000.0"),
    (b'{"prompt": "a", "temperature": NaN}', S.OUT_OF_RANGE, "temperature", "nan"),
    (b'{"prompt": "a", "temperature": Infinity}', S.OUT_OF_RANGE, "temperature", "inf"),
]


@pytest.mark.parametrize(("body", "kind", "field", "says"), BAD)
def test_bad_requests_are_refused_naming_the_problem(
    body: bytes, kind: str, field: str | None, says: str
) -> None:
    with pytest.raises(RequestError) as caught:
        parse_request(body, LIMITS)
    exc = caught.value
    assert (exc.kind, exc.field) == (kind, field)
    assert says in str(exc)
    assert 400 <= exc.status < 500
    assert error_body(exc) == {"error": kind, "field": field, "message": str(exc)}


def test_an_unknown_error_kind_is_a_bug_not_a_new_kind() -> None:
    with pytest.raises(ValueError, match="unknown error kind 'oops'"):
        RequestError("oops", "x")


def test_config_errors_name_the_field() -> None:
    with pytest.raises(ConfigError, match="port: must be an integer from 0 to 65535"):
        ServeConfig(model="m", port=70000)
    with pytest.raises(ConfigError, match="rank: must be an integer from 0 to replicas - 1"):
        ServeConfig(model="m", rank=2, replicas=2)
    with pytest.raises(ConfigError, match="default_max_new_tokens: must be at most"):
        ServeConfig(model="m", default_max_new_tokens=300)
    with pytest.raises(ConfigError, match="collector: must be a ZeroMQ address"):
        ServeConfig(model="m", collector="localhost:5555")
    assert ServeConfig(model="m").host == "127.0.0.1"


# --------------------------------------------------------------------------- the engine


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_checkpoint(tmp_path_factory.mktemp("policy"))


@pytest.fixture(scope="module")
def engine(checkpoint: Path) -> Engine:
    return Engine.load(checkpoint, device="cpu")


def job(prompt: str, max_new_tokens: int = 12, temperature: float = 0.0) -> Job:
    return Job(GenerateRequest(prompt, max_new_tokens, temperature), len(prompt))


def test_the_exported_tokenizer_round_trips_through_autotokenizer(checkpoint: Path) -> None:
    built, loaded = build_tokenizer(), AutoTokenizer.from_pretrained(checkpoint)
    for text in (*PROMPTS, "the quick brown fox 0123456789+-*="):
        ids = built(text, add_special_tokens=False).input_ids
        assert loaded(text, add_special_tokens=False).input_ids == ids
        assert loaded.decode(ids) == built.decode(ids)
        if ">" not in text:  # outside the alphabet: <unk>, as in the trainer's own prompts
            assert loaded.decode(ids) == text
    assert loaded("abc>", add_special_tokens=False).input_ids[-1] == loaded.unk_token_id
    assert (loaded.pad_token_id, loaded.eos_token_id) == (built.pad_token_id, built.eos_token_id)


def test_greedy_answers_are_the_models_own_alone_and_in_a_mixed_batch(
    engine: Engine, checkpoint: Path
) -> None:
    model = AutoModelForCausalLM.from_pretrained(checkpoint)
    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    expected = [
        generate_hf(
            model, tokenizer, [p], max_new_tokens=12, temperature=1.0, top_p=1.0, greedy=True
        ).responses[0]
        for p in PROMPTS
    ]
    assert len(set(expected)) > 4  # a model that says one thing would prove nothing
    alone = [engine.generate([job(p)])[0].text for p in PROMPTS]
    # one batch: every prompt length, some rows sampling hot, some with fewer tokens
    mixed = [job(p) for p in PROMPTS] + [job(p, 5, temperature=2.0) for p in PROMPTS]
    batched = engine.generate(mixed)
    assert alone == expected
    assert [a.text for a in batched[: len(PROMPTS)]] == expected
    for answer in batched[len(PROMPTS) :]:
        assert answer.tokens <= 5 and len(answer.text) <= 5


def test_each_row_stops_at_its_own_limit_or_eos(engine: Engine) -> None:
    answers = engine.generate([job("abc>", 1), job("abc>", 3), job("abc>", 40)])
    assert [a.tokens for a in answers[:2]] == [1, 3]
    assert [a.finish_reason for a in answers[:2]] == ["length", "length"]
    long = answers[2]
    assert long.text.startswith(answers[1].text)
    assert long.finish_reason == "eos" or long.tokens == 40
    assert engine.generate([]) == []


def test_row_temperature_keeps_only_the_best_token_of_greedy_rows() -> None:
    scores = torch.tensor([[1.0, 3.0, 2.0], [1.0, 3.0, 2.0]])
    out = RowTemperature(torch.tensor([0.0, 2.0]))(torch.zeros(2, 1, dtype=torch.long), scores)
    assert out[0].tolist() == [float("-inf"), 0.0, float("-inf")]
    assert out[1].tolist() == [0.5, 1.5, 1.0]


def test_a_directory_without_a_checkpoint_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="model: is not a HuggingFace checkpoint directory"):
        Engine.load(tmp_path)


# --------------------------------------------------------------------------- batching


class RecordingProducer:
    """Records log() calls and phases; the NullProducer's interface."""

    def __init__(self) -> None:
        self.logged: list[tuple[int, dict[str, Any]]] = []
        self.phases: list[tuple[str, int]] = []
        self.closed = 0

    def log(self, data: dict[str, Any], step: int) -> None:
        self.logged.append((step, data))

    def phase(self, infix: str, *, step: int) -> Any:
        self.phases.append((infix, step))
        return _NullContext()

    def close(self, timeout: float | None = None) -> None:
        self.closed += 1


class _NullContext:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


class GatedEngine:
    """Generates only when the test lets it: the first batch blocks until ``gate`` is set,
    so requests submitted meanwhile are queued, deterministically."""

    def __init__(self, fail: bool = False) -> None:
        self.gate = threading.Event()
        self.entered = threading.Event()
        self.batches: list[list[str]] = []
        self.fail = fail

    def generate(self, jobs: list[Job]) -> list[Answer]:
        self.entered.set()
        assert self.gate.wait(30)
        self.batches.append([j.request.prompt for j in jobs])
        if self.fail and len(self.batches) == 1:
            raise RuntimeError("device on fire")
        return [Answer(j.request.prompt[::-1], 2, "eos") for j in jobs]


def make_batcher(engine: GatedEngine, **kw: Any) -> tuple[Batcher, RecordingProducer]:
    producer = RecordingProducer()
    reporter = Reporter(ServeMetrics(), producer, interval_s=3600)
    batcher = Batcher(engine, reporter, **{"max_batch_size": 8, "max_queue": 16, **kw})
    return batcher, producer


def test_requests_queued_while_the_model_works_go_in_one_batch() -> None:
    engine = GatedEngine()
    batcher, producer = make_batcher(engine)
    batcher.start()
    try:
        first = batcher.submit(job("first"))
        assert engine.entered.wait(30)  # the first batch is in the model, holding the gate
        rest = [batcher.submit(job(f"p{i}")) for i in range(11)]
        assert batcher.depth() == 11
        engine.gate.set()
        answers = [f.result(30) for f in (first, *rest)]
    finally:
        batcher.close()
    assert engine.batches == [
        ["first"],
        [f"p{i}" for i in range(8)],
        [f"p{i}" for i in range(8, 11)],
    ]
    assert [a.text for a in answers] == ["tsrif", *[f"p{i}"[::-1] for i in range(11)]]
    assert producer.phases == [(PHASE, 0)] * 3 and PHASE == "serve/generate"
    payload = batcher.reporter.metrics.close_window()
    assert payload[S.SERVE_QUEUE_DEPTH.name] == 11
    assert sorted(payload[S.SERVE_BATCH_SIZE.name].tolist()) == [1.0, 3.0, 8.0]


def test_a_full_queue_refuses_with_overloaded() -> None:
    engine = GatedEngine()
    batcher, _ = make_batcher(engine, max_queue=2)
    batcher.start()
    try:
        batcher.submit(job("busy"))
        assert engine.entered.wait(30)
        waiting = [batcher.submit(job("a")), batcher.submit(job("b"))]
        with pytest.raises(RequestError) as caught:
            batcher.submit(job("c"))
        assert caught.value.kind == S.OVERLOADED and caught.value.status == 503
        engine.gate.set()
        assert [f.result(30).text for f in waiting] == ["a", "b"]
    finally:
        batcher.close()


def test_a_failing_batch_fails_its_requests_and_the_next_batch_is_served() -> None:
    engine = GatedEngine(fail=True)
    batcher, _ = make_batcher(engine)
    engine.gate.set()
    batcher.start()
    try:
        with pytest.raises(RequestError) as caught:
            batcher.submit(job("x")).result(30)
        assert caught.value.kind == S.INTERNAL and "device on fire" in str(caught.value)
        assert batcher.submit(job("yz")).result(30).text == "zy"
        assert batcher.alive()
    finally:
        batcher.close()


def test_close_refuses_what_is_still_queued() -> None:
    engine = GatedEngine()
    batcher, _ = make_batcher(engine)
    batcher.start()
    batcher.submit(job("busy"))
    assert engine.entered.wait(30)
    queued = batcher.submit(job("late"))
    engine.gate.set()
    batcher.close()
    assert queued.done()  # answered, or refused: never left waiting
    if queued.exception() is None:
        assert queued.result().text == "etal"
    else:
        assert isinstance(queued.exception(), RequestError)
        assert queued.exception().kind == S.OVERLOADED  # type: ignore[union-attr]
    with pytest.raises(RequestError, match="shutting down"):
        batcher.submit(job("after"))


# --------------------------------------------------------------------------- metrics windows


def test_a_window_reports_counts_errors_and_the_latency_histogram() -> None:
    m = ServeMetrics()
    latencies = [0.004, 0.011, 0.012, 0.3]
    for lat in latencies[:3]:
        m.answered(lat, tokens=5)
    m.answered(latencies[3], error=S.PROMPT_TOO_LONG)
    m.queue_depth(3)
    m.batched(2)
    m.batched(1)
    payload = m.close_window(depth_now=1)
    assert payload[S.SERVE_REQUESTS.name] == 4
    assert payload[S.SERVE_TOKENS_GENERATED.name] == 15
    assert payload[S.SERVE_QUEUE_DEPTH.name] == 3
    errors = {k: payload[S.SERVE_ERRORS.format(kind=k)] for k in S.ERROR_KINDS}
    assert errors == {**dict.fromkeys(S.ERROR_KINDS, 0), S.PROMPT_TOO_LONG: 1}
    np.testing.assert_array_equal(payload[S.SERVE_LATENCY.name], latencies)
    counts = bucket_counts(latencies)
    for i, name in enumerate(S.SERVE_LATENCY.bucket_names):
        assert payload.get(name, 0) == counts[i]
    # the next window starts empty, and an idle window still reports (zeros, no histogram)
    idle = m.close_window(depth_now=2)
    assert idle[S.SERVE_REQUESTS.name] == 0 and idle[S.SERVE_QUEUE_DEPTH.name] == 2
    assert S.SERVE_LATENCY.name not in idle and S.SERVE_BATCH_SIZE.name not in idle
    assert m.totals == {"requests": 4, S.PROMPT_TOO_LONG: 1}


def test_the_reporter_logs_one_step_per_window_and_closes_once() -> None:
    producer = RecordingProducer()
    metrics = ServeMetrics()
    reporter = Reporter(metrics, producer, interval_s=3600, depth=lambda: 7)
    metrics.answered(0.01, tokens=1)
    reporter.report()
    reporter.report()
    reporter.close()
    reporter.close()
    assert [step for step, _ in producer.logged] == [0, 1, 2]
    assert [d[S.SERVE_REQUESTS.name] for _, d in producer.logged] == [1, 0, 0]
    assert all(d[S.SERVE_QUEUE_DEPTH.name] == 7 for _, d in producer.logged)
    assert producer.closed == 1
