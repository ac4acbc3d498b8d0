"""The rollout engine's own metrics (vLLM), per training step. Part of the catalog
(``rlpulse.schemas.metrics``).

The rollout worker reads its vLLM engine after each generation: counters as the change of
vLLM's own counters over the step (``LLM.get_metrics()``: ``vllm:generation_tokens`` and the
rest, each named in the help below), the KV-cache use and the scheduler's queues as their
largest value over the step's engine iterations, and the latencies as the very samples vLLM
observes into its Prometheus histograms (time to first token, inter-token latency, end-to-end
latency, queue time), which travel as :class:`~rlpulse.schemas.histogram.Histogram` buckets so
that their quantiles merge exactly (to bucket resolution) across rollout workers.

A vLLM *server* (verl's rollout servers, ``trl vllm-serve``, one started with ``vllm serve``) is
read over HTTP instead (``rlpulse.producer.enginewatch``): the same names, from the change of its
``/metrics`` counters and histogram buckets over the step's rollout window, and its gauges'
largest scraped value. A server's histograms only have vLLM's buckets, so each histogram here
holds vLLM's default bounds (``VLLM_*_BOUNDS``) besides :data:`~rlpulse.schemas.histogram.BOUNDS`:
a server's bucket counts then land on bounds of their own, and its quantiles are exact to vLLM's
bucket resolution (the estimate lies in the vLLM bucket that holds the true quantile). Its mean
is exact (the change of ``_sum`` over the change of ``_count``); its max and min are unknown.

Counts add up across rollout workers; the KV-cache use and the queues take the maximum (the
fullest engine is the one that preempts); the prefix-cache hit rate pools hits over queries.
"""

from __future__ import annotations

from rlpulse.schemas.catalog import Entry, Template
from rlpulse.schemas.histogram import BOUNDS, Histogram
from rlpulse.schemas.reductions import Reduction

SUM, MAX, FRACTION = Reduction.SUM, Reduction.MAX, Reduction.FRACTION
_STEP = "in this training step, summed over rollout workers"

ENGINE_PROMPT_TOKENS = Entry(
    "rollout/engine/prompt_tokens",
    SUM,
    "tokens",
    f"Prompt tokens the engine prefilled {_STEP} (the change of vllm:prompt_tokens).",
)
ENGINE_GENERATION_TOKENS = Entry(
    "rollout/engine/generation_tokens",
    SUM,
    "tokens",
    f"Tokens the engine generated {_STEP} (the change of vllm:generation_tokens), EOS "
    "included: training rollouts and validation alike.",
)
ENGINE_REQUESTS = Entry(
    "rollout/engine/requests",
    SUM,
    "requests",
    f"Requests the engine finished {_STEP} (the change of vllm:request_success, every "
    "finished_reason).",
)
ENGINE_PREEMPTIONS = Entry(
    "rollout/engine/preemptions",
    SUM,
    "requests",
    f"Requests the scheduler preempted (KV cache full: evicted, recomputed later) {_STEP} "
    "(the change of vllm:num_preemptions). Above 0, the KV cache is too small for the batch.",
)
ENGINE_PREFIX_CACHE_QUERIES = Entry(
    "rollout/engine/prefix_cache_queries",
    SUM,
    "tokens",
    f"Prompt tokens looked up in the prefix cache {_STEP} (the change of "
    "vllm:prefix_cache_queries).",
)
ENGINE_PREFIX_CACHE_HITS = Entry(
    "rollout/engine/prefix_cache_hits",
    SUM,
    "tokens",
    f"Prompt tokens found in the prefix cache {_STEP} (the change of vllm:prefix_cache_hits).",
)
ENGINE_PREFIX_CACHE_HIT_RATE = Entry(
    "rollout/engine/prefix_cache_hit_rate",
    FRACTION,
    "ratio",
    "rollout/engine/prefix_cache_hits over rollout/engine/prefix_cache_queries, pooled over "
    "rollout workers (not logged in a step without queries).",
)
ENGINE_KV_CACHE_USAGE = Entry(
    "rollout/engine/kv_cache_usage",
    MAX,
    "ratio",
    "Share of the engine's KV-cache blocks in use (vllm:kv_cache_usage_perc, 1 = full), the "
    "largest value over this step's engine iterations and over rollout workers.",
)
ENGINE_REQUESTS_RUNNING = Entry(
    "rollout/engine/requests_running",
    MAX,
    "requests",
    "Requests the scheduler ran together (vllm:num_requests_running), the largest value over "
    "this step's engine iterations and over rollout workers.",
)
ENGINE_REQUESTS_WAITING = Entry(
    "rollout/engine/requests_waiting",
    MAX,
    "requests",
    "Requests waiting for the scheduler (vllm:num_requests_waiting), the largest value over "
    "this step's engine iterations and over rollout workers.",
)

ENGINE_FINISHED = Template(
    "rollout/engine/finished/{reason}",
    SUM,
    "requests",
    f"Requests the engine finished for this reason {_STEP} (the change of "
    "vllm:request_success{finished_reason=reason}: stop, length, abort, error, repetition); "
    "read from servers' /metrics (rlpulse.producer.enginewatch).",
)
ENGINE_SERVERS = Entry(
    "rollout/engine/servers",
    MAX,
    "servers",
    "Engine servers whose /metrics were read at both ends of a rollout window of this step "
    "(rlpulse.producer.enginewatch): the step's rollout/engine/ numbers from servers cover "
    "these (the most of any window of the step: a validation window is a second one).",
)
ENGINE_SERVERS_UNREAD = Entry(
    "rollout/engine/servers_unread",
    MAX,
    "servers",
    "Engine servers of the run whose /metrics could not be read at a rollout window's begin "
    "or end in this step (refused, timed out, unreadable, or down since an earlier step), the "
    "most of any window of the step: the step's rollout/engine/ numbers leave them out.",
)

VLLM_TTFT_BOUNDS = (
    *(0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5),
    *(10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0),
)
"""vLLM's default buckets of vllm:time_to_first_token_seconds (``vllm/v1/metrics/buckets.py``)."""
VLLM_ITL_BOUNDS = (
    *(0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5),
    *(10.0, 20.0, 40.0, 80.0),
)
"""vLLM's default buckets of vllm:inter_token_latency_seconds."""
VLLM_REQUEST_BOUNDS = (
    *(0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0),
    *(120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0),
)
"""vLLM's default buckets of vllm:e2e_request_latency_seconds and
vllm:request_queue_time_seconds."""


def _with(vllm: tuple[float, ...]) -> tuple[float, ...]:
    """vLLM's bounds and rlpulse's together, so a server's buckets map onto bounds here; an
    rlpulse bound within 2% of a vLLM one gives way to it (no sliver buckets such as
    (0.005, 0.00501])."""
    near = [b for b in BOUNDS if any(abs(b - v) <= 0.02 * v for v in vllm)]
    return tuple(sorted({*vllm, *(b for b in BOUNDS if b not in near)}))


_SAMPLES = "the samples vLLM observes into"
ENGINE_TTFT = Histogram(
    "rollout/engine/time_to_first_token",
    "s",
    f"Seconds from a request's arrival at the engine to its first token ({_SAMPLES} "
    "vllm:time_to_first_token_seconds), one sample per request.",
    count_unit="requests",
    bounds=_with(VLLM_TTFT_BOUNDS),
)
ENGINE_ITL = Histogram(
    "rollout/engine/inter_token_latency",
    "s",
    f"Seconds between two consecutive tokens of a request ({_SAMPLES} "
    "vllm:inter_token_latency_seconds), one sample per generated token after the first.",
    count_unit="tokens",
    bounds=_with(VLLM_ITL_BOUNDS),
)
ENGINE_E2E_LATENCY = Histogram(
    "rollout/engine/e2e_latency",
    "s",
    f"Seconds from a request's arrival at the engine to its last token ({_SAMPLES} "
    "vllm:e2e_request_latency_seconds), one sample per finished request.",
    count_unit="requests",
    bounds=_with(VLLM_REQUEST_BOUNDS),
)
ENGINE_QUEUE_TIME = Histogram(
    "rollout/engine/queue_time",
    "s",
    f"Seconds a request waited in the engine's queue before it was first scheduled ({_SAMPLES} "
    "vllm:request_queue_time_seconds), one sample per finished request.",
    count_unit="requests",
    bounds=_with(VLLM_REQUEST_BOUNDS),
)
HISTOGRAMS = (ENGINE_TTFT, ENGINE_ITL, ENGINE_E2E_LATENCY, ENGINE_QUEUE_TIME)
TEMPLATES: tuple[Template, ...] = (ENGINE_FINISHED,)
"""The templates of this module; ``rlpulse.schemas.metrics`` lists them in the catalog."""
ENTRIES: tuple[Entry, ...] = (
    *(v for v in list(globals().values()) if isinstance(v, Entry)),
    *(e for h in HISTOGRAMS for e in h.entries),
)
"""Every catalog entry of this module; ``rlpulse.schemas.metrics`` lists them in the catalog."""
