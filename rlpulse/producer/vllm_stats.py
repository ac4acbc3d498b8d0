"""The vLLM engine's own metrics over one training step, as catalog values, for any trainer
whose engine runs in its own process (``vllm.LLM``): the demo trainer's rollout worker, TRL's
colocate mode. :class:`EngineStats` measures one such engine step by step.

Two sources, both the engine's own numbers:

* :class:`StepRecorder`, added to the engine's stat loggers, sees every engine iteration's
  ``SchedulerStats`` and ``IterationStats``, the objects vLLM's Prometheus logger observes:
  it keeps the largest KV-cache use and queue lengths, and the raw latency samples (time to
  first token, inter-token latency, end-to-end latency, queue time) vLLM puts in its
  histograms;
* :func:`read_counters` reads ``LLM.get_metrics()`` (vLLM's Prometheus registry): the step's
  counts are the change of vLLM's counters between two reads (:func:`counter_deltas`).

:func:`step_metrics` turns both into ``{catalog name: producer value}``. Nothing here imports
vLLM: the recorder has the methods vLLM's ``StatLoggerManager`` calls, and the counters are
read from the ``Metric`` objects ``get_metrics()`` returns. Both need the engine's statistics
on, which ``vllm.LLM`` turns off unless built with ``disable_log_stats=False``.

An engine served over HTTP (``vllm serve``) is measured from its ``/metrics`` instead, under
the same names.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from rlpulse.producer.values import Fraction
from rlpulse.schemas import engine as E
from rlpulse.schemas.histogram import Histogram

COUNTERS: dict[str, str] = {
    "vllm:prompt_tokens": E.ENGINE_PROMPT_TOKENS.name,
    "vllm:generation_tokens": E.ENGINE_GENERATION_TOKENS.name,
    "vllm:request_success": E.ENGINE_REQUESTS.name,
    "vllm:num_preemptions": E.ENGINE_PREEMPTIONS.name,
    "vllm:prefix_cache_queries": E.ENGINE_PREFIX_CACHE_QUERIES.name,
    "vllm:prefix_cache_hits": E.ENGINE_PREFIX_CACHE_HITS.name,
}
"""vLLM counter -> the catalog entry that carries its change over a step."""

HISTOGRAM_COUNTS: dict[str, str] = {
    "vllm:time_to_first_token_seconds": "ttft",
    "vllm:inter_token_latency_seconds": "itl",
    "vllm:e2e_request_latency_seconds": "e2e",
    "vllm:request_queue_time_seconds": "queue",
}
"""vLLM histogram -> the :class:`StepSamples` field holding the same samples (their count
and sum, read with the counters, check that the recorder saw what vLLM observed)."""

HISTOGRAMS: dict[str, Histogram] = {
    "vllm:time_to_first_token_seconds": E.ENGINE_TTFT,
    "vllm:inter_token_latency_seconds": E.ENGINE_ITL,
    "vllm:e2e_request_latency_seconds": E.ENGINE_E2E_LATENCY,
    "vllm:request_queue_time_seconds": E.ENGINE_QUEUE_TIME,
}
"""vLLM histogram -> the catalog histogram that carries its samples."""

GAUGES: dict[str, str] = {
    "vllm:kv_cache_usage_perc": E.ENGINE_KV_CACHE_USAGE.name,
    "vllm:num_requests_running": E.ENGINE_REQUESTS_RUNNING.name,
    "vllm:num_requests_waiting": E.ENGINE_REQUESTS_WAITING.name,
}
"""vLLM gauge -> the catalog entry that carries its largest value over a step (here read from
``SchedulerStats``, the values vLLM sets them to; a server's are scraped,
``rlpulse.producer.enginewatch``)."""

FINISHED_REASON = "finished_reason"
"""The label of ``vllm:request_success`` that says why a request finished."""


@dataclass
class StepSamples:
    """What the recorder saw since it was last taken."""

    kv_cache_usage: float = 0.0
    running: int = 0
    waiting: int = 0
    iterations: int = 0
    ttft: list[float] = field(default_factory=list)
    itl: list[float] = field(default_factory=list)
    e2e: list[float] = field(default_factory=list)
    queue: list[float] = field(default_factory=list)
    finished: list[float] = field(default_factory=list)
    """When each request finished (the recorder's clock, at the engine iteration that
    finished it): the rollout's ``rollout/response/finish``."""


class StepRecorder:
    """A vLLM stat logger (the methods ``StatLoggerManager`` calls) that keeps one step's
    extremes and latency samples; :meth:`take` hands them over and starts the next step.

    >>> rec = StepRecorder()
    >>> rec.take().iterations
    0
    """

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self._now = StepSamples()
        self._clock = clock

    def record(
        self,
        scheduler_stats: Any,
        iteration_stats: Any,
        mm_cache_stats: Any = None,
        engine_idx: int = 0,
    ) -> None:
        """One engine iteration: the same objects vLLM's Prometheus logger records."""
        now = self._now
        if scheduler_stats is not None:
            now.iterations += 1
            now.kv_cache_usage = max(now.kv_cache_usage, float(scheduler_stats.kv_cache_usage))
            now.running = max(now.running, int(scheduler_stats.num_running_reqs))
            waiting = scheduler_stats.num_waiting_reqs + getattr(
                scheduler_stats, "num_skipped_waiting_reqs", 0
            )
            now.waiting = max(now.waiting, int(waiting))
        if iteration_stats is None:
            return
        now.ttft.extend(iteration_stats.time_to_first_tokens_iter)
        now.itl.extend(iteration_stats.inter_token_latencies_iter)
        at = self._clock() if iteration_stats.finished_requests else 0.0
        for finished in iteration_stats.finished_requests:
            now.e2e.append(finished.e2e_latency)
            now.queue.append(finished.queued_time)
            now.finished.append(at)

    def take(self) -> StepSamples:
        taken, self._now = self._now, StepSamples()
        return taken

    # The rest of vLLM's stat-logger interface: nothing to do.
    def log_engine_initialized(self) -> None:
        pass

    def log(self) -> None:
        pass

    def record_sleep_state(self, is_awake: int = 0, level: int = 0) -> None:
        pass

    def record_admission_rejection(self, reason: str) -> None:
        pass


def read_counters(metrics: Iterable[Any]) -> dict[str, float]:
    """vLLM's counters summed over their labels (engine, finished_reason), and each
    histogram's ``<name>:count`` and ``<name>:sum``, from ``LLM.get_metrics()``."""
    out: dict[str, float] = {}
    for metric in metrics:
        kind = type(metric).__name__
        if kind == "Counter" and metric.name in COUNTERS:
            out[metric.name] = out.get(metric.name, 0.0) + float(metric.value)
        elif kind == "Histogram" and metric.name in HISTOGRAM_COUNTS:
            out[f"{metric.name}:count"] = out.get(f"{metric.name}:count", 0.0) + metric.count
            out[f"{metric.name}:sum"] = out.get(f"{metric.name}:sum", 0.0) + float(metric.sum)
    return out


def counter_deltas(before: Mapping[str, float], after: Mapping[str, float]) -> dict[str, float]:
    """What each counter grew by between two reads (a counter absent before started at 0).

    >>> counter_deltas({"vllm:prompt_tokens": 10.0}, {"vllm:prompt_tokens": 25.0})
    {'vllm:prompt_tokens': 15.0}
    """
    return {name: value - before.get(name, 0.0) for name, value in after.items()}


def step_metrics(deltas: Mapping[str, float], samples: StepSamples) -> dict[str, Any]:
    """One step of the engine as ``{catalog name: producer value}``."""
    out: dict[str, Any] = {
        entry: round(deltas.get(counter, 0.0)) for counter, entry in COUNTERS.items()
    }
    queries = out[E.ENGINE_PREFIX_CACHE_QUERIES.name]
    if queries:
        out[E.ENGINE_PREFIX_CACHE_HIT_RATE.name] = Fraction(
            out[E.ENGINE_PREFIX_CACHE_HITS.name], queries
        )
    if samples.iterations:
        out[E.ENGINE_KV_CACHE_USAGE.name] = samples.kv_cache_usage
        out[E.ENGINE_REQUESTS_RUNNING.name] = samples.running
        out[E.ENGINE_REQUESTS_WAITING.name] = samples.waiting
    for name, histogram in HISTOGRAMS.items():
        out.update(histogram.observe(getattr(samples, HISTOGRAM_COUNTS[name])))
    return out


class StatsOff(RuntimeError):
    """The engine was built with its statistics off (``vllm.LLM``'s default): nothing to read."""


class EngineStats:
    """One in-process vLLM engine (a ``vllm.LLM``), measured step by step: a
    :class:`StepRecorder` among its stat loggers, and its counters read at each take.
    :class:`StatsOff` when the engine keeps no statistics (build it with
    ``disable_log_stats=False``).

    One per process and engine: vLLM's Prometheus registry, which ``get_metrics()`` reads, is
    global to the process, and a second engine's start replaces the first's counters there.

    >>> # stats = EngineStats(llm); llm.generate(...); producer.log(stats.take_metrics(), step)
    """

    def __init__(self, llm: Any) -> None:
        manager = getattr(getattr(llm, "llm_engine", None), "logger_manager", None)
        if manager is None:
            raise StatsOff(
                "the vLLM engine keeps no statistics (vllm.LLM's disable_log_stats is True by "
                "default): build it with disable_log_stats=False"
            )
        self.llm = llm
        self.recorder = StepRecorder()
        self._manager = manager
        manager.stat_loggers.append(self.recorder)
        self._counters = read_counters(llm.get_metrics())

    def take_raw(self) -> tuple[dict[str, float], StepSamples]:
        """The counters' changes and the recorder's samples since the last take."""
        now = read_counters(self.llm.get_metrics())
        deltas, self._counters = counter_deltas(self._counters, now), now
        return deltas, self.recorder.take()

    def take_metrics(self) -> dict[str, Any]:
        """The engine's metrics since the last take, as ``{catalog name: producer value}``."""
        return step_metrics(*self.take_raw())

    def detach(self) -> None:
        """Stop recording (the engine keeps running)."""
        if self.recorder in self._manager.stat_loggers:
            self._manager.stat_loggers.remove(self.recorder)
