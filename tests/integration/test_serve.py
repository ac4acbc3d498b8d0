"""The real policy server: ``python -m rlpulse.trainer.serve`` on a loopback port with a demo-size
checkpoint (built from a config, nothing downloaded), streaming its metrics to a real
collector. Answers, concurrency, every bad input, and the metrics the collector emits.

The tests of this module share one server and run in order: the last one stops the server
and checks that the collector counted exactly the requests the others sent."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import pytest
from prometheus_client.parser import text_string_to_metric_families
from transformers import AutoModelForCausalLM, AutoTokenizer

from rlpulse.collector.launch import CollectorProcess, start_collector
from rlpulse.schemas import metrics as M, serving as S
from rlpulse.schemas.reductions import Stat
from rlpulse.schemas.topology import SERVE
from rlpulse.trainer.rollout import generate_hf
from tests.servemodel import PROMPTS, make_checkpoint
from tests.support.net import free_port

ROOT = Path(__file__).resolve().parents[2]
RUN = "serve-test"


@dataclass
class Served:
    """The running server, its collector, and what the tests sent it."""

    url: str
    proc: subprocess.Popen
    collector: CollectorProcess
    jsonl: Path
    metrics_url: str
    """The collector's Prometheus sink."""
    checkpoint: Path
    log: Path
    sent: Counter[str] = field(default_factory=Counter)
    """POST /generate requests by outcome: "ok" or the error kind."""

    def post(self, body: bytes | dict[str, Any], path: str = "/generate") -> tuple[int, dict]:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method="POST")
        req.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(req, timeout=60) as resp:
                status, answer = resp.status, json.loads(resp.read())
        except urllib.error.HTTPError as err:
            status, answer = err.code, json.loads(err.read() or b"{}")
        if path == "/generate":
            self.sent["ok" if status == 200 else answer.get("error", f"http {status}")] += 1
        return status, answer

    def health(self) -> tuple[int, dict]:
        try:
            with urllib.request.urlopen(self.url + "/healthz", timeout=10) as resp:
                return resp.status, json.loads(resp.read())
        except urllib.error.HTTPError as err:
            return err.code, json.loads(err.read())


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    tmp = tmp_path_factory.mktemp("serve")
    checkpoint = make_checkpoint(tmp / "actor")
    jsonl = tmp / "metrics.jsonl"
    prom_port = free_port()
    collector = start_collector(
        {
            "track_with": ["jsonl", "prometheus"],
            "tracker_kwargs": {
                "jsonl": {"path": str(jsonl)},
                "prometheus": {"host": "127.0.0.1", "port": prom_port},
            },
            "grace_s": 30,
        },
        stdout=subprocess.DEVNULL,
        stderr=(tmp / "collector.log").open("w"),
    )
    port = free_port()
    log = tmp / "server.log"
    cmd = [
        sys.executable,
        "-m",
        "rlpulse.trainer.serve",
        *("--model", str(checkpoint), "--port", str(port), "--device", "cpu"),
        *("--collector", collector.address, "--run", RUN, "--report-interval-s", "0.2"),
        *("--batch-wait-ms", "20", "--torch-threads", "1"),
    ]
    proc = subprocess.Popen(
        cmd, cwd=ROOT, stdout=log.open("w"), stderr=subprocess.STDOUT, env={**os.environ}
    )
    metrics_url = f"http://127.0.0.1:{prom_port}/metrics"
    server = Served(
        f"http://127.0.0.1:{port}", proc, collector, jsonl, metrics_url, checkpoint, log
    )
    deadline = time.monotonic() + 120
    while True:
        assert proc.poll() is None, log.read_text()
        try:
            if server.health()[0] == 200:
                break
        except OSError:
            pass
        assert time.monotonic() < deadline, log.read_text()
        time.sleep(0.2)
    try:
        yield server
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        collector.stop()


@pytest.fixture(scope="module")
def expected(served: Served) -> dict[str, str]:
    """Greedy answers of the checkpoint, computed by transformers directly."""
    model = AutoModelForCausalLM.from_pretrained(served.checkpoint)
    tokenizer = AutoTokenizer.from_pretrained(served.checkpoint)
    return {
        p: generate_hf(
            model, tokenizer, [p], max_new_tokens=12, temperature=1.0, top_p=1.0, greedy=True
        ).responses[0]
        for p in PROMPTS
    }


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--model", "/nonexistent/actor"], "model: is not a HuggingFace checkpoint directory"),
        (["--model", "m", "--max-batch-size", "0"], "max_batch_size: must be an integer >= 1"),
        (["--model", "m", "--collector", "localhost"], "collector: must be a ZeroMQ address"),
    ],
)
def test_bad_options_exit_2_naming_the_field(args: list[str], says: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "rlpulse.trainer.serve", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    assert says in done.stderr


def test_it_listens_on_loopback_only(served: Served) -> None:
    listening = [
        c.laddr
        for c in psutil.Process(served.proc.pid).net_connections(kind="inet")
        if c.status == psutil.CONN_LISTEN
    ]
    assert listening and {a.ip for a in listening} == {"127.0.0.1"}
    status, health = served.health()
    assert status == 200 and health["device"] == "cpu" and health["context"] == 64


def test_answers_are_the_models_greedy_answers(served: Served, expected: dict[str, str]) -> None:
    for prompt in PROMPTS:
        status, answer = served.post({"prompt": prompt, "max_new_tokens": 12, "temperature": 0})
        assert status == 200, answer
        assert answer["response"] == expected[prompt]
        assert answer["finish_reason"] in ("eos", "length") and 1 <= answer["tokens"] <= 12
    status, sampled = served.post({"prompt": "abc>", "max_new_tokens": 3})
    assert status == 200 and sampled["tokens"] <= 3


def test_concurrent_requests_are_batched_and_each_gets_its_own_answer(
    served: Served, expected: dict[str, str]
) -> None:
    batches_before = served.health()[1]["batches"]
    bodies = [
        {"prompt": p, "max_new_tokens": 12, "temperature": 0.0 if i % 2 == 0 else 1.5}
        for i, p in enumerate(PROMPTS * 4)
    ]
    with ThreadPoolExecutor(len(bodies)) as pool:
        results = list(pool.map(served.post, bodies))
    assert [status for status, _ in results] == [200] * len(bodies)
    for body, (_, answer) in zip(bodies, results, strict=True):
        if body["temperature"] == 0:
            assert answer["response"] == expected[body["prompt"]], body
    batches = served.health()[1]["batches"] - batches_before
    assert batches < len(bodies), "32 concurrent requests, each generated alone"


BAD: list[tuple[bytes | dict[str, Any], int, str, str]] = [
    ({"prompt": ""}, 422, S.EMPTY_PROMPT, "prompt is empty"),
    ({"prompt": "ab" * 40}, 422, S.PROMPT_TOO_LONG, "context of 64 tokens"),
    ({"prompt": "abcd>", "max_new_tokens": 62}, 422, S.PROMPT_TOO_LONG, "67 do not fit"),
    ({"prompt": 42}, 422, S.WRONG_TYPE, "prompt must be a string"),
    ({"prompt": "ab>", "max_new_tokens": "5"}, 422, S.WRONG_TYPE, "must be an integer"),
    ({"prompt": "ab>", "temperature": [1]}, 422, S.WRONG_TYPE, "must be a number"),
    ({"prompt": "ab>", "max_new_tokens": 10**9}, 422, S.OUT_OF_RANGE, "from 1 to 63"),
    ({"prompt": "ab>", "max_new_tokens": 0}, 422, S.OUT_OF_RANGE, "from 1 to 63"),
    ({"prompt": "ab>", "temperature": 1e6}, 422, S.OUT_OF_RANGE, "from 0 (greedy) to 10"),
    ({"prompt": "ab>", "max_tokens": 5}, 422, S.UNKNOWN_FIELD, "'max_tokens'"),
    ({"max_new_tokens": 5}, 422, S.MISSING_FIELD, "prompt is required"),
    (b"{not json", 400, S.INVALID_JSON, "not valid JSON"),
    (b"[1, 2]", 400, S.INVALID_JSON, "must be a JSON object"),
    (b'{"prompt": "' + b"a" * 70_000 + b'"}', 413, S.BODY_TOO_LARGE, "at most 65536"),
]


@pytest.mark.parametrize(("body", "status", "kind", "says"), BAD)
def test_bad_input_gets_a_4xx_naming_the_problem_and_the_server_lives_on(
    served: Served, body: bytes | dict[str, Any], status: int, kind: str, says: str
) -> None:
    got, answer = served.post(body)
    assert (got, answer.get("error")) == (status, kind), answer
    assert says in answer["message"]
    assert served.health()[0] == 200
    assert served.post({"prompt": "ab>", "max_new_tokens": 2, "temperature": 0})[0] == 200


def test_other_paths_and_methods_are_not_generate_requests(served: Served) -> None:
    assert served.post({"prompt": "a"}, path="/nope")[0] == 404
    with pytest.raises(urllib.error.HTTPError) as caught:
        urllib.request.urlopen(served.url + "/generate", timeout=10)
    assert caught.value.code == 405


def test_the_collector_counted_every_request_the_tests_sent(served: Served) -> None:
    served.proc.send_signal(signal.SIGTERM)  # uvicorn shuts down: the last window is reported
    assert served.proc.wait(60) == 0, served.log.read_text()
    scraped = _scrape_when(served, lambda s: s.get(("count", "")) == sum(served.sent.values()))
    assert served.collector.stop() == 0
    records = [json.loads(line) for line in served.jsonl.read_text().splitlines()]
    steps = [r for r in records if r["run"] == RUN]
    assert steps and not any(r["partial"] for r in steps)
    assert [r["step"] for r in steps] == list(range(len(steps)))  # a step per window
    metrics = [r["metrics"] for r in steps]

    def total(name: str) -> float:
        return sum(m.get(name, 0.0) for m in metrics)

    assert total(S.SERVE_REQUESTS.name) == sum(served.sent.values())
    for kind in S.ERROR_KINDS:
        assert total(S.SERVE_ERRORS.format(kind=kind)) == served.sent[kind], kind
    assert served.sent[S.EMPTY_PROMPT] == 1 and served.sent["ok"] > 40
    last = metrics[-1]
    assert last[S.SERVE_REQUESTS_TOTAL.name] == sum(served.sent.values())
    assert last[S.SERVE_ERRORS_TOTAL.name] == sum(n for k, n in served.sent.items() if k != "ok")
    assert total(S.SERVE_TOKENS_GENERATED.name) == last[S.SERVE_TOKENS_GENERATED_TOTAL.name] > 0
    # latency: every window with requests has its quantiles, between its min and max
    summary = M.SERVE_LATENCY_SUMMARY.output_names()
    busy = [m for m in metrics if m[S.SERVE_REQUESTS.name] > 0]
    for m in busy:
        p50, p99 = m[M.SERVE_LATENCY_P50.name], m[M.SERVE_LATENCY_P99.name]
        assert m[summary[Stat.MIN]] <= p50 <= m[M.SERVE_LATENCY_P95.name] <= p99
        assert p99 <= m[summary[Stat.MAX]]
    # the concurrent test's requests were batched, and the batches ran in serve phases
    assert max(m.get(M.SERVE_BATCH_SIZE.output_names()[Stat.MAX], 0) for m in metrics) > 1
    phase = M.TIME_PHASE.format(cluster=SERVE, phase="generate", part="execute")
    assert any(phase in m for m in metrics)
    assert any(
        M.MEMORY_CPU.format(cluster=SERVE, phase="generate", when="end", kind="rss") in m
        for m in metrics
    )
    assert {r["roles"].get(S.SERVE_REQUESTS.name) for r in steps} == {SERVE}
    # Prometheus: the latency is one cumulative histogram over every window, errors are
    # counters by kind; no gauge of one window's buckets or errors is left on /metrics
    answered = sum(served.sent.values())
    assert scraped[("bucket", "+Inf")] == scraped[("count", "")] == answered
    les = sorted((float(le), v) for (part, le), v in scraped.items() if part == "bucket")
    assert [v for _, v in les] == sorted(v for _, v in les)  # cumulative
    assert scraped[("sum", "")] == pytest.approx(
        sum(m[summary[Stat.MEAN]] * m[S.SERVE_REQUESTS.name] for m in busy), rel=1e-6
    )
    for kind in S.ERROR_KINDS:
        assert scraped[("errors", kind)] == served.sent[kind], kind
    assert not any(part == "stale" for part, _ in scraped)


def _scrape_when(served: Served, done: Callable[[dict], bool]) -> dict[tuple[str, str], float]:
    """The run's serve latency histogram and errors on the collector's /metrics, once
    ``done`` says they are complete: ``(part, le or kind) -> value``."""
    deadline = time.monotonic() + 30
    while True:
        with urllib.request.urlopen(served.metrics_url, timeout=10) as resp:
            text = resp.read().decode()
        got: dict[tuple[str, str], float] = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.labels.get("run") != RUN:
                    continue
                name = sample.name
                if name.startswith("rlpulse_serve_latency_seconds_"):
                    part = name.rsplit("_", 1)[1]
                    got[(part, sample.labels.get("le", ""))] = sample.value
                elif name == "rlpulse_serve_errors_total":
                    got[("errors", sample.labels["kind"])] = sample.value
                elif name.startswith(("rlpulse_serve_latency_bucket", "rlpulse_serve_errors_")):
                    got[("stale", name)] = sample.value
        if done(got):
            return got
        assert time.monotonic() < deadline, sorted(got.items())
        time.sleep(0.2)
