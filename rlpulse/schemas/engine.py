"""The rollout engine's own metrics (vLLM), per training step. Part of the catalog
(``rlpulse.schemas.metrics``).

The rollout worker reads its vLLM engine after each generation: counters as the change of
vLLM's own counters over the step (``LLM.get_metrics()``: ``vllm:generation_tokens`` and the
rest, each named in the help below), the KV-cache use and the scheduler's queues as their
largest value over the step's engine iterations, and the latencies as the very samples vLLM
observes into its Prometheus histograms (time to first token, inter-token latency, end-to-end
latency, queue time), which travel as :class:`~rlpulse.schemas.histogram.Histogram` buckets so
that their quantiles merge exactly (to bucket resolution) across rollout workers.

Counts add up across rollout workers; the KV-cache use and the queues take the maximum (the
fullest engine is the one that preempts); the prefix-cache hit rate pools hits over queries.
"""

from __future__ import annotations

from rlpulse.schemas.catalog import Entry
from rlpulse.schemas.histogram import Histogram
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

_SAMPLES = "the samples vLLM observes into"
ENGINE_TTFT = Histogram(
    "rollout/engine/time_to_first_token",
    "s",
    f"Seconds from a request's arrival at the engine to its first token ({_SAMPLES} "
    "vllm:time_to_first_token_seconds), one sample per request.",
    count_unit="requests",
)
ENGINE_ITL = Histogram(
    "rollout/engine/inter_token_latency",
    "s",
    f"Seconds between two consecutive tokens of a request ({_SAMPLES} "
    "vllm:inter_token_latency_seconds), one sample per generated token after the first.",
    count_unit="tokens",
)
ENGINE_E2E_LATENCY = Histogram(
    "rollout/engine/e2e_latency",
    "s",
    f"Seconds from a request's arrival at the engine to its last token ({_SAMPLES} "
    "vllm:e2e_request_latency_seconds), one sample per finished request.",
    count_unit="requests",
)
ENGINE_QUEUE_TIME = Histogram(
    "rollout/engine/queue_time",
    "s",
    f"Seconds a request waited in the engine's queue before it was first scheduled ({_SAMPLES} "
    "vllm:request_queue_time_seconds), one sample per finished request.",
    count_unit="requests",
)
HISTOGRAMS = (ENGINE_TTFT, ENGINE_ITL, ENGINE_E2E_LATENCY, ENGINE_QUEUE_TIME)
ENTRIES: tuple[Entry, ...] = (
    *(v for v in list(globals().values()) if isinstance(v, Entry)),
    *(e for h in HISTOGRAMS for e in h.entries),
)
"""Every catalog entry of this module; ``rlpulse.schemas.metrics`` lists them in the catalog."""
