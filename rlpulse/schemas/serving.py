"""Metrics of the policy server (``python -m rlpulse.trainer.serve``), a producer with role ``serve``.
Part of the catalog (``rlpulse.schemas.metrics``).

The server logs one "step" per reporting interval (a window counter, every second by default):
what happened in that window, summed over its replicas by the collector. The collector adds
the latency quantiles (from the merged histogram buckets) and the running totals, which are
Prometheus counters, so ``rate()`` gives requests, errors and tokens per second exactly. On
Prometheus the window's buckets and errors by kind are not gauges of the last window (a 15 s
scrape would see one 1 s window in fifteen): the Prometheus sink sums them over every window
into a real histogram, ``rlpulse_serve_latency_seconds_bucket{le}`` with ``_sum`` and
``_count``, and counters ``rlpulse_serve_errors_total{kind}``
(``rlpulse.collector.sinks.promexport.Totals``).

Error kinds are closed: each is one way a request to ``POST /generate`` can fail, and the
server answers it with the kind in its JSON body, so a client's error and the metric that
counted it have one spelling.
"""

from __future__ import annotations

from rlpulse.schemas.catalog import Entry, Template, family
from rlpulse.schemas.histogram import Histogram
from rlpulse.schemas.reductions import Reduction

SUM, MAX = Reduction.SUM, Reduction.MAX

# Error kinds: the "error" field of a failed /generate answer and the {kind} of SERVE_ERRORS.
INVALID_JSON = "invalid_json"
"""The body is not a JSON object."""
BODY_TOO_LARGE = "body_too_large"
"""The body is larger than the server accepts, before it is even parsed."""
UNKNOWN_FIELD = "unknown_field"
"""A field the API does not have (a misspelt ``max_tokens``, say)."""
MISSING_FIELD = "missing_field"
"""A required field (``prompt``) is absent."""
WRONG_TYPE = "wrong_type"
"""A field of the wrong JSON type (a number for the prompt, a string for max_new_tokens)."""
EMPTY_PROMPT = "empty_prompt"
"""The prompt is empty (or only whitespace)."""
PROMPT_TOO_LONG = "prompt_too_long"
"""The prompt's tokens plus max_new_tokens do not fit the model's context."""
OUT_OF_RANGE = "out_of_range"
"""max_new_tokens or temperature outside the range the server accepts."""
OVERLOADED = "overloaded"
"""The request queue is full: the server sheds load instead of queueing without bound."""
INTERNAL = "internal"
"""Generation failed on the server (a bug, a device error)."""
ERROR_KINDS = (
    INVALID_JSON,
    BODY_TOO_LARGE,
    UNKNOWN_FIELD,
    MISSING_FIELD,
    WRONG_TYPE,
    EMPTY_PROMPT,
    PROMPT_TOO_LONG,
    OUT_OF_RANGE,
    OVERLOADED,
    INTERNAL,
)

_WINDOW = "in the reporting window, summed over the server's replicas"

SERVE_REQUESTS = Entry(
    "serve/requests",
    SUM,
    "requests",
    f"Requests to POST /generate answered {_WINDOW}: every answer, errors included.",
)
SERVE_ERRORS = Template(
    "serve/errors/{kind}",
    SUM,
    "requests",
    f"Requests to POST /generate answered with an error of this kind {_WINDOW} (kinds: "
    "schemas.serving.ERROR_KINDS; overloaded is HTTP 503, internal 500, the others 4xx).",
    choices={"kind": ERROR_KINDS},
)
SERVE_TOKENS_GENERATED = Entry(
    "serve/tokens_generated",
    SUM,
    "tokens",
    f"Tokens generated for successful answers {_WINDOW} (up to and including EOS).",
)
SERVE_QUEUE_DEPTH = Entry(
    "serve/queue_depth",
    MAX,
    "requests",
    "Requests waiting for the model, the largest count seen in the reporting window (read "
    "when a request is queued and when a batch is taken); the maximum across replicas.",
)
SERVE_BATCH_SIZE = family(
    "serve/batch_size",
    "requests",
    "Requests generated together in one model call (the server batches concurrent requests).",
)
SERVE_LATENCY = Histogram(
    "serve/latency",
    "s",
    "Seconds from a POST /generate request reaching the handler to its answer (queueing, "
    "batching and generation; errors included).",
    count_unit="requests",
)
SERVE_LATENCY_BUCKETS = SERVE_LATENCY.buckets
SERVE_LATENCY_SUMMARY = SERVE_LATENCY.summary
SERVE_LATENCY_P50 = SERVE_LATENCY.quantile_entries[0.5]
SERVE_LATENCY_P95 = SERVE_LATENCY.quantile_entries[0.95]
SERVE_LATENCY_P99 = SERVE_LATENCY.quantile_entries[0.99]

# Running totals, derived by the collector (Prometheus counters).
SERVE_REQUESTS_TOTAL = Entry(
    "serve/requests_total",
    SUM,
    "requests",
    "Requests answered since the run started (cumulative serve/requests). Computed by the "
    "collector.",
    derived=True,
    cumulative=True,
)
SERVE_ERRORS_TOTAL = Entry(
    "serve/errors_total",
    SUM,
    "requests",
    "Error answers of every kind since the run started (cumulative sum of "
    "serve/errors/{kind}). Computed by the collector.",
    derived=True,
    cumulative=True,
)
SERVE_TOKENS_GENERATED_TOTAL = Entry(
    "serve/tokens_generated_total",
    SUM,
    "tokens",
    "Tokens generated since the run started (cumulative serve/tokens_generated). Computed by "
    "the collector.",
    derived=True,
    cumulative=True,
)
