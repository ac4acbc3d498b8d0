"""The engine's metrics per step when the engine is a server: a real vLLM server (the CPU
build) on loopback serving a 3-step run, watched by ``EngineWatch`` in the process that
sends the requests, logged through a real producer to a real collector (jsonl). Each step's
``rollout/engine/...`` must equal what the step's requests received, counted from the
responses; requests sent between two windows count in neither.

One server per module (20-25 s to start on two idle cores, minutes on a loaded machine); the
merge of two real servers runs in the slow test (``make test-slow``), and on recorded real
scrapes in tests/producer/test_engines.py.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from rlpulse.producer import ADDRESS_VAR, Producer, ProducerConfig
from rlpulse.producer.enginewatch import EngineWatch, EngineWatchConfig
from rlpulse.producer.env import ENGINES_TIMEOUT_VAR, ENGINES_VAR
from rlpulse.schemas import engine as E
from tests.docs import doc_block
from tests.frameworks.helpers import jsonl_collector, records
from tests.support.net import free_port
from tests.support.vllm import Answered, Server, build_model, complete, servers, vllm_missing

pytestmark = pytest.mark.timeout(900)
STEPS = {
    1: [([[5, 6, 7, 8]] * 4, 8)],
    2: [([[9 + i, 10] for i in range(3)], 12), ([[40, 41, 42, 43, 44]], 6), ([[7]] * 2, 16)],
    3: [([[3 + i, 4, 5] for i in range(6)], 10), ([[30, 31]] * 2, 4)],
}
"""Per step, the completions requests its rollout sends at once: (token-id prompts,
max_tokens); a request's prompts are that many requests to the engine."""


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    missing = vllm_missing()
    if missing:
        pytest.skip(missing)
    return build_model(tmp_path_factory.mktemp("policy"))


@pytest.fixture(scope="module")
def server(model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with servers(model, tmp_path_factory.mktemp("vllm")) as (one,):
        yield one


def rollout(targets: list[Server], requests: list) -> list[Answered]:
    """Send ``requests`` to every server of ``targets`` at once (one thread per request and
    server); what each server's responses said."""
    answered = [Answered() for _ in targets]
    lock = threading.Lock()

    def send(i: int, prompts: list, max_tokens: int) -> None:
        response = complete(targets[i], prompts, max_tokens)
        with lock:
            answered[i].add(response)

    threads = [
        threading.Thread(target=send, args=(i, prompts, max_tokens))
        for i in range(len(targets))
        for prompts, max_tokens in requests
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return answered


def run_steps(targets: list[Server], urls: list[str], tmp_path: Path) -> tuple[dict, dict, dict]:
    """Three steps, each a window around its rollout, and a request to every server between
    two windows; the jsonl records, what each step's requests received (summed over the
    servers) and the watch's stats."""
    truth: dict[int, Answered] = {}
    with jsonl_collector(tmp_path) as (collector, out):
        producer = Producer(
            collector.address,
            run="engines",
            role="driver",
            config=ProducerConfig(close_timeout_s=10.0),
        )
        watch = EngineWatch(
            producer, urls, config=EngineWatchConfig(timeout_s=60.0, poll_s=0.2), environ={}
        )
        try:
            for step, requests in STEPS.items():
                with watch.window(step):
                    answered = rollout(targets, requests)
                truth[step] = Answered()
                for a in answered:
                    truth[step] += a
                rollout(targets, [([[11, 12]] * 3, 5)])  # outside every window
                producer.step_done(step)
        finally:
            watch.close()
            producer.close()
    return records(out), {s: a for s, a in truth.items()}, watch.stats()


def check_step(metrics: dict, answered: Answered, servers_read: int) -> None:
    """A step's engine metrics against what its requests received."""
    assert metrics[E.ENGINE_GENERATION_TOKENS.name] == answered.completion_tokens
    assert metrics[E.ENGINE_PROMPT_TOKENS.name] == answered.prompt_tokens
    assert metrics[E.ENGINE_REQUESTS.name] == answered.requests
    for reason in ("stop", "length", "abort", "error", "repetition"):
        assert metrics[E.ENGINE_FINISHED.format(reason=reason)] == answered.reasons[reason]
    for histogram in (E.ENGINE_TTFT, E.ENGINE_E2E_LATENCY, E.ENGINE_QUEUE_TIME):
        count = sum(metrics.get(b, 0) for b in histogram.bucket_names)
        assert count == answered.requests, histogram.name
        assert metrics[f"{histogram.name}/p50"] <= metrics[f"{histogram.name}/p99"]
    itl = sum(metrics.get(b, 0) for b in E.ENGINE_ITL.bucket_names)
    assert itl == answered.completion_tokens - answered.requests
    assert metrics[f"{E.ENGINE_E2E_LATENCY.name}/mean"] >= metrics[f"{E.ENGINE_TTFT.name}/mean"]
    assert 0.0 <= metrics[E.ENGINE_KV_CACHE_USAGE.name] <= 1.0
    assert metrics[E.ENGINE_REQUESTS_WAITING.name] >= 0
    assert metrics[E.ENGINE_SERVERS.name] == servers_read
    assert metrics[E.ENGINE_PREEMPTIONS.name] == 0


def test_a_real_server_over_three_steps(server: Server, tmp_path: Path) -> None:
    dead = f"http://127.0.0.1:{free_port()}/metrics"  # nothing listens: left out, counted
    got, truth, stats = run_steps([server], [server.metrics_url, dead], tmp_path)
    assert sorted(got) == [1, 2, 3]
    for step, record in got.items():
        check_step(record["metrics"], truth[step], servers_read=1)
        assert record["metrics"][E.ENGINE_SERVERS_UNREAD.name] == 1
    assert stats["windows"] == stats["logged"] == 3
    assert stats["scrape_failures"] >= 1 and stats["errors"] == stats["misuse"] == 0


@pytest.mark.slow
def test_two_real_servers_merge_exactly(model: Path, tmp_path: Path) -> None:
    """Two servers, each step's requests sent to both: the step's numbers are both servers'
    responses together (counts and bucket counts add, the latency means pool)."""
    with servers(model, tmp_path, count=2) as pair:
        got, truth, stats = run_steps(pair, [s.metrics_url for s in pair], tmp_path)
    assert sorted(got) == [1, 2, 3]
    for step, record in got.items():
        check_step(record["metrics"], truth[step], servers_read=2)
        assert record["metrics"][E.ENGINE_SERVERS_UNREAD.name] == 0
    assert stats["scrape_failures"] == stats["errors"] == 0


def test_the_documented_driver(
    server: Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """docs/integrations.md's driver of one's own, as written: the engine from RLPULSE_ENGINES,
    a window around each step's rollout."""
    block = doc_block(
        "docs/integrations.md",
        "### The rollout engine's metrics per step, from its servers",
        "python",
    )
    sent: dict[int, Answered] = {}

    def generate(prompts: list) -> dict:
        response = complete(server, prompts, 8)
        sent.setdefault(len(sent) + 1, Answered()).add(response)
        return response

    with jsonl_collector(tmp_path) as (collector, out):
        monkeypatch.setenv(ADDRESS_VAR, collector.address)
        monkeypatch.setenv(ENGINES_VAR, server.metrics_url)
        monkeypatch.setenv(ENGINES_TIMEOUT_VAR, "60")
        exec(block, {"run": "doc", "steps": 2, "prompts": [[5, 6, 7]] * 3, "generate": generate})
    got = records(out)
    assert sorted(got) == sorted(sent) == [1, 2]
    for step, record in got.items():
        check_step(record["metrics"], sent[step], servers_read=1)
