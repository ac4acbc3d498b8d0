"""rlpulse.producer.enginewatch: windows around a step's rollout, scrapes off the caller's
thread, faults counted and never raised. Engines here are texts a test serves through the
watch's ``fetch`` (the real server is tests/integration/test_engine_servers.py's)."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

import pytest

from rlpulse.producer.enginescrape import checked_urls
from rlpulse.producer.enginewatch import EngineWatch, EngineWatchConfig
from rlpulse.producer.env import ENGINES_TIMEOUT_VAR, ENGINES_VAR
from rlpulse.schemas import engine as E
from rlpulse.schemas.errors import ConfigError
from tests.support.waiting import until

A, B = "http://127.0.0.1:9001/metrics", "http://127.0.0.1:9002/metrics"
FAST = EngineWatchConfig(timeout_s=0.5, poll_s=0.01)


def text(tokens: float, running: float = 0.0, ttft: tuple[float, float] = (0.0, 0.0)) -> str:
    """A vLLM /metrics text: ``tokens`` generated, ``running`` requests, ``ttft`` = (requests
    whose first token took at most 10 ms, all requests)."""
    fast, total = ttft
    return (
        "# TYPE vllm:generation_tokens counter\n"
        f'vllm:generation_tokens_total{{engine="0"}} {tokens}\n'
        f'vllm:num_requests_running{{engine="0"}} {running}\n'
        f'vllm:time_to_first_token_seconds_bucket{{le="0.01"}} {fast}\n'
        f'vllm:time_to_first_token_seconds_bucket{{le="+Inf"}} {total}\n'
        f"vllm:time_to_first_token_seconds_count {total}\n"
        f"vllm:time_to_first_token_seconds_sum {0.005 * total}\n"
    )


class Engines:
    """The texts each URL serves now (set them between calls), or an exception to raise; a
    URL may be made to hang until ``release``; ``before`` runs before each answer."""

    def __init__(self, served: Mapping[str, Any]) -> None:
        self.served = dict(served)
        self.calls: dict[str, int] = {}
        self.hang: set[str] = set()
        self.release = threading.Event()

    def __call__(self, url: str, timeout_s: float, max_bytes: int) -> str:
        self.calls[url] = self.calls.get(url, 0) + 1
        if url in self.hang:
            self.release.wait(30)
        answer = self.served[url]
        if isinstance(answer, BaseException):
            raise answer
        return str(answer)


class Recorder:
    def __init__(self) -> None:
        self.logged: list[tuple[int, dict[str, Any]]] = []

    def log(self, data: Mapping[str, Any], step: int) -> None:
        self.logged.append((step, dict(data)))


def watch_of(engines: Engines, urls: list[str], config: EngineWatchConfig = FAST) -> tuple:
    producer = Recorder()
    return producer, EngineWatch(producer, urls, config=config, environ={}, fetch=engines)


def test_a_step_logs_the_change_between_its_two_scrapes_merged_over_engines() -> None:
    engines = Engines({A: text(100, ttft=(2, 3)), B: text(7)})
    producer, watch = watch_of(engines, [A, B])
    try:
        watch.begin(1)
        engines.served = {A: text(130, ttft=(4, 6)), B: text(17, ttft=(1, 1))}
        logged = watch.end(1)
    finally:
        watch.close()
    assert producer.logged == [(1, logged)]
    assert logged[E.ENGINE_GENERATION_TOKENS.name] == 30 + 10
    assert logged[E.ENGINE_TTFT.buckets.format(le="0.01")] == 2 + 1
    assert logged[E.ENGINE_TTFT.buckets.format(le="inf")] == 1
    assert logged[E.ENGINE_SERVERS.name] == 2 and logged[E.ENGINE_SERVERS_UNREAD.name] == 0
    assert watch.stats()["windows"] == 1 and watch.stats()["logged"] == 1


def test_gauges_peak_over_the_scrapes_inside_the_window() -> None:
    """The background thread scrapes every poll_s while the window is open: a peak neither
    end sees is still the step's maximum."""
    engines = Engines({A: text(0, running=1)})
    _producer, watch = watch_of(engines, [A])
    try:
        watch.begin(3)
        calls = engines.calls[A]
        engines.served[A] = text(0, running=9)
        assert until(lambda: engines.calls[A] >= calls + 2, timeout_s=10)  # polled twice
        engines.served[A] = text(5, running=2)
        logged = watch.end(3)
    finally:
        watch.close()
    assert logged[E.ENGINE_REQUESTS_RUNNING.name] == 9


def test_an_engine_that_refuses_is_left_out_counted_and_retried() -> None:
    engines = Engines({A: text(10), B: ConnectionRefusedError(111, "refused")})
    producer, watch = watch_of(engines, [A, B])
    try:
        with watch.window(1):
            engines.served[A] = text(15)
        ((_, first),) = producer.logged
        assert first[E.ENGINE_SERVERS.name] == 1 and first[E.ENGINE_SERVERS_UNREAD.name] == 1
        assert first[E.ENGINE_GENERATION_TOKENS.name] == 5
        assert watch.stats()["scrape_failures"] >= 1
        engines.served[B] = text(50)  # back: the background retry finds it
        assert until(lambda: not watch._scraper.down([B]), timeout_s=10)
        with watch.window(2):
            engines.served.update({A: text(16), B: text(53)})
    finally:
        watch.close()
    second = producer.logged[1][1]
    assert second[E.ENGINE_SERVERS.name] == 2 and second[E.ENGINE_SERVERS_UNREAD.name] == 0
    assert second[E.ENGINE_GENERATION_TOKENS.name] == 1 + 3


def test_a_hung_engine_is_waited_for_once_then_not_until_it_answers() -> None:
    """The caller waits timeout_s for a hung engine once; while its scrape is still out, later
    boundaries neither wait for it nor send it another."""
    engines = Engines({A: text(1), B: text(2)})
    engines.hang.add(B)
    producer, watch = watch_of(engines, [A, B], EngineWatchConfig(timeout_s=0.2, poll_s=5.0))
    try:
        watch.begin(1)
        watch.end(1)
        watch.begin(2)
        watch.end(2)
        assert engines.calls[B] == 1  # one scrape of B, still hanging
        assert watch.stats()["scrape_timeouts"] >= 1
        assert [m[E.ENGINE_SERVERS_UNREAD.name] for _, m in producer.logged] == [1, 1]
    finally:
        engines.release.set()
        watch.close()


def test_a_poll_in_flight_at_the_end_is_waited_for_then_read_again() -> None:
    """The background poll of an engine is still out when the window ends: the end waits for
    it and then reads the engine afresh (the poll's reading predates the last response), so
    a slow moment of a healthy engine does not drop it from the step."""
    engines = Engines({A: text(0)})
    _producer, watch = watch_of(engines, [A], EngineWatchConfig(timeout_s=10.0, poll_s=0.01))
    try:
        watch.begin(1)
        engines.hang.add(A)  # the next poll blocks until released
        calls = engines.calls[A]
        assert until(lambda: engines.calls[A] > calls, timeout_s=10)  # a poll is out
        engines.served[A] = text(7)
        threading.Timer(0.3, engines.release.set).start()
        logged = watch.end(1)
    finally:
        engines.release.set()
        watch.close()
    assert logged[E.ENGINE_SERVERS.name] == 1 and logged[E.ENGINE_SERVERS_UNREAD.name] == 0
    assert logged[E.ENGINE_GENERATION_TOKENS.name] == 7
    assert watch.stats()["scrape_timeouts"] == 0


def test_texts_that_are_not_vllm_metrics_are_counted() -> None:
    engines = Engines({A: 'http_requests_total{path="/"} 1\n', B: "vllm:num_preemptions_total x"})
    producer, watch = watch_of(engines, [A, B])
    try:
        with watch.window(1):
            pass
    finally:
        watch.close()
    stats = watch.stats()
    assert stats["no_vllm_metrics"] == 1 and stats["unreadable"] == 1
    assert producer.logged[0][1] == {E.ENGINE_SERVERS.name: 0, E.ENGINE_SERVERS_UNREAD.name: 2}


def test_misuse_is_counted_never_raised() -> None:
    engines = Engines({A: text(1)})
    producer, watch = watch_of(engines, [A])
    try:
        assert watch.end(1) is None  # no window open
        watch.begin(1)
        watch.begin(2)  # ends step 1's window first
        assert watch.end(3) is not None  # logged at step 2, where it began
    finally:
        watch.close()
        watch.close()
    assert [step for step, _ in producer.logged] == [1, 2]
    assert watch.stats()["misuse"] == 3


def test_a_producer_that_raises_does_not_reach_the_caller() -> None:
    class Broken:
        def log(self, data: Mapping[str, Any], step: int) -> None:
            raise RuntimeError("boom")

    watch = EngineWatch(Broken(), [A], config=FAST, environ={}, fetch=Engines({A: text(1)}))
    try:
        watch.begin(1)
        assert watch.end(1) is None
    finally:
        watch.close()
    assert watch.stats()["errors"] == 1


def test_engines_come_from_the_environment_and_later_additions() -> None:
    engines = Engines({A: text(1), B: text(1)})
    watch = EngineWatch(Recorder(), [], environ={ENGINES_VAR: f" {A},,{A} "}, fetch=engines)
    watch.add([B, A])
    assert watch.urls == (A, B)
    watch.close()


@pytest.mark.parametrize(
    ("urls", "environ", "field"),
    [
        (["ftp://x/metrics"], {}, "urls"),
        ([], {ENGINES_VAR: "http://a:1/metrics,http://u:p@b/metrics"}, ENGINES_VAR),
    ],
)
def test_bad_urls_fail_at_construction_naming_where(
    urls: list[str], environ: dict[str, str], field: str
) -> None:
    with pytest.raises(ConfigError) as raised:
        EngineWatch(Recorder(), urls, environ=environ)
    assert raised.value.field == field


def test_the_timeout_comes_from_the_environment() -> None:
    assert EngineWatchConfig.from_env({ENGINES_TIMEOUT_VAR: "12.5"}).timeout_s == 12.5
    assert EngineWatchConfig.from_env({}) == EngineWatchConfig()
    with pytest.raises(ConfigError) as raised:
        EngineWatchConfig.from_env({ENGINES_TIMEOUT_VAR: "soon"})
    assert raised.value.field == ENGINES_TIMEOUT_VAR


@pytest.mark.parametrize("bad", [{"timeout_s": 0}, {"poll_s": -1.0}, {"workers": 0}])
def test_bad_settings_fail_at_construction(bad: dict[str, Any]) -> None:
    with pytest.raises(ConfigError):
        EngineWatchConfig(**bad)


def test_checked_urls_keeps_the_first_of_each() -> None:
    assert checked_urls([A, B, A], "urls") == (A, B)


def test_next_ends_a_window_and_begins_the_next_at_one_scrape() -> None:
    """Dispatch-to-dispatch windows (a rollout dispatched without waiting): the scrape that
    ends one begins the next, so no request falls between them; end_open ends the last."""
    engines = Engines({A: text(0)})
    producer, watch = watch_of(engines, [A])
    try:
        assert watch.next(1) is None  # nothing open yet
        engines.served[A] = text(10)
        first = watch.next(2)
        engines.served[A] = text(25)
        second = watch.end_open()
        assert watch.end_open() is None  # nothing open: nothing logged, no misuse
    finally:
        watch.close()
    assert [step for step, _ in producer.logged] == [1, 2]
    assert first[E.ENGINE_GENERATION_TOKENS.name] == 10
    assert second[E.ENGINE_GENERATION_TOKENS.name] == 15
    assert engines.calls[A] >= 3 and watch.stats()["misuse"] == 0
