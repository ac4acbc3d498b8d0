"""Write the Grafana dashboards in ``dashboards/`` from the metric catalog.

Every query names its metric through :func:`rlpulse.collector.output.promnames.prom_metric` and a catalog
constant, so a renamed metric changes the dashboards the next time this runs; the committed
JSON must equal what this writes (tests/deploy/test_grafana.py), and every query is checked
against a live collector's ``/metrics`` (tests/deploy/test_exported_names.py).

    .venv/bin/python deploy/grafana/generate.py

Template metrics (phase times, memory) have the worker group, phase and device inside their
Prometheus name (``rlpulse_time_actor_train_train_step_total_seconds``), so those panels select
by a ``__name__`` regex and ``label_replace`` the parts back into labels for the legend.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from rlpulse.collector.output.promnames import prom_metric
from rlpulse.deploy.grafana.panels import (
    JOB,
    RUN,
    dashboard,
    family,
    gpu_regex,
    heatmap,
    histogram_quantile,
    layout,
    name,
    panel,
    quantiles,
    row,
    sel,
    template_query,
    template_regex,
)
from rlpulse.schemas import attribution as A, engine as E, ledger as L, metrics as M
from rlpulse.schemas.catalog import Template
from rlpulse.schemas.reductions import Stat
from rlpulse.schemas.topology import GENERATE, PHASES, SERVE

HERE = Path(__file__).parent
# --------------------------------------------------------------------------- the dashboards


def rl_overview() -> dict[str, Any]:
    r = "{{run}}"
    panels = [
        panel(
            "Score",
            [
                (sel(M.CRITIC_SCORE, Stat.MEAN), f"{r} train score"),
                (sel(M.VAL_SCORE, Stat.MEAN), f"{r} val score"),
                (sel(M.CRITIC_ACCURACY), f"{r} train accuracy"),
                (sel(M.VAL_ACCURACY), f"{r} val accuracy"),
            ],
            "none",
            description="Training rollouts' and held-out validation score and accuracy.",
        ),
        panel(
            "Rewards",
            family(M.CRITIC_REWARDS, "reward"),
            "none",
            description="Reward per response after normalisation and clipping.",
        ),
        panel(
            "Advantages and returns",
            [
                *family(M.CRITIC_ADVANTAGES, "advantage"),
                *quantiles(M.CRITIC_ADVANTAGES, "advantage")[:-1],
                (sel(M.CRITIC_RETURNS, Stat.MEAN), f"{r} return mean"),
            ],
            "none",
            description="Per response token: mean, max, min and the p50/p90/p99 of the "
            "collector's merged sketch (1% relative error).",
        ),
        panel(
            "KL",
            [
                (sel(M.ACTOR_REF_KL), f"{r} KL to reference"),
                (sel(M.ACTOR_KL_LOSS), f"{r} KL loss"),
                (sel(M.ACTOR_APPROXKL), f"{r} approx KL to old"),
                (sel(M.ACTOR_POLICYKL), f"{r} policy KL to old"),
                (sel(M.ACTOR_KL_COEF), f"{r} KL coef"),
            ],
            "none",
            description="Nats. Alert RLPulseKLToReferenceHigh fires above 0.1.",
        ),
        panel(
            "Entropy",
            [
                *quantiles(M.CRITIC_ENTROPY, "entropy"),
                (sel(M.CRITIC_ENTROPY, Stat.MIN), f"{r} entropy min"),
            ],
            "none",
            description="Policy entropy per response token (nats): quantiles over the batch's "
            "tokens, mean and min. A collapse of the mean to ~0 alerts.",
        ),
        panel(
            "Clip fractions",
            [
                (sel(M.ACTOR_CLIPFRAC), f"{r} actor clipfrac"),
                (sel(M.ACTOR_PPO_RATIO_CLIPFRAC), f"{r} ratio outside band"),
                (sel(M.ACTOR_PPO_RATIO_HIGH_CLIPFRAC), f"{r} ratio high"),
                (sel(M.ACTOR_PPO_RATIO_LOW_CLIPFRAC), f"{r} ratio low"),
                (sel(M.CRITIC_CLIPFRAC), f"{r} value clipfrac"),
                (sel(M.CRITIC_REWARD_CLIP_FRAC), f"{r} reward clip"),
            ],
            "percentunit",
        ),
        panel(
            "Response and prompt length",
            [
                *family(M.RESPONSE_LENGTH, "response"),
                *quantiles(M.RESPONSE_LENGTH, "response")[:-1],
                (sel(M.PROMPT_LENGTH, Stat.MEAN), f"{r} prompt mean"),
            ],
            "none",
            description="Tokens per response (mean, max, min, p50/p90/p99) and per prompt.",
        ),
        panel(
            "Losses",
            [
                (sel(M.ACTOR_PG_LOSS), f"{r} pg loss"),
                (sel(M.ACTOR_TOTAL_LOSS), f"{r} actor total loss"),
                (sel(M.CRITIC_LOSS), f"{r} critic loss"),
            ],
            "none",
        ),
        panel("Importance ratio", family(M.ACTOR_RATIO, "ratio"), "none"),
        panel(
            "Validation diversity",
            [
                (sel(M.VAL_DISTINCT_1), f"{r} distinct-1"),
                (sel(M.VAL_DISTINCT_2), f"{r} distinct-2"),
                (sel(M.VAL_REPETITION_RATE), f"{r} repetition"),
            ],
            "percentunit",
        ),
        row("Rollout engine vs trainer, and staleness"),
        panel(
            "Rollout - trainer log-prob",
            [
                *quantiles(M.ROLLOUT_LOGPROB_DIFF, "diff"),
                (sel(M.ROLLOUT_LOGPROB_DIFF, Stat.MAX), f"{r} diff max"),
                (sel(M.ROLLOUT_LOGPROB_DIFF, Stat.MIN), f"{r} diff min"),
            ],
            "none",
            description="Per response token: the rollout engine's log-prob of the token it "
            "sampled minus the trainer's recomputed one (nats). 0 when both score alike; "
            "sampling settings, kernels and precision, and off-policy updates move it. "
            "Alert RLPulseRolloutLogprobMismatch fires when the p99 stays above 0.5.",
        ),
        panel(
            "Trainer / rollout probability ratio",
            [
                *quantiles(M.ROLLOUT_PROB_RATIO, "ratio"),
                (sel(M.ROLLOUT_PROB_RATIO, Stat.MAX), f"{r} ratio max"),
                (sel(M.ROLLOUT_PROB_RATIO, Stat.MIN), f"{r} ratio min"),
            ],
            "none",
            description="exp(trainer log-prob - rollout log-prob) per response token: the "
            "importance weight a truncated-IS correction would apply (1: no mismatch).",
        ),
        panel(
            "Staleness of trained samples",
            [
                *quantiles(M.ASYNC_STALENESS, "staleness"),
                (sel(M.ASYNC_STALENESS, Stat.MAX), f"{r} staleness max"),
            ],
            "none",
            description="Trainer step minus the step of the policy that generated each "
            "trained token (ppo.off_policy_steps once the pipeline is full; 0 on-policy).",
        ),
    ]
    return dashboard(
        "rlpulse-rl-overview",
        "rlpulse / RL overview",
        "Score, rewards, advantages, KL, entropy, clip fractions and lengths per run.",
        layout(panels),
    )


def straggler(stat: str) -> str:
    """The Prometheus family of one straggler statistic (cluster and phase are labels)."""
    return prom_metric(M.STRAGGLER.format(cluster="c", phase=PHASES[0], stat=stat)).name


def throughput() -> dict[str, Any]:
    r = "{{run}}"
    part = template_regex(M.TIME_PHASE, [], part="total")
    moves = template_regex(M.TIME_PHASE, [("part", "onload", "(onload|offload)")])
    host_exec = template_regex(M.TIME_PHASE, [], part="execute")
    gpu_exec = template_regex(M.TIME_PHASE_GPU, [], part="execute")
    gpu_total = template_regex(M.TIME_PHASE_GPU, [], part="total")
    panels = [
        panel(
            "Tokens per second (system/tps)",
            [(sel(M.SYSTEM_TPS), f"{r}")],
            "none",
            description="Collector-derived: tokens trained on / step wall time.",
        ),
        panel(
            "Tokens per second (rate of system/tokens)",
            [
                (f"rate({name(M.SYSTEM_TOKENS)}{{{RUN}}}[$__rate_interval])", f"{r}"),
            ],
            "none",
            description="Prometheus' rate over the cumulative token counter.",
        ),
        panel("Samples trained on", [(sel(M.SYSTEM_SAMPLES), f"{r}")], "none"),
        panel("Step", [(f"rlpulse_run_step{{{RUN}}}", f"{r}")], "none"),
        panel(
            "Driver stages",
            [
                (sel(M.TIME_ROLLOUT), f"{r} rollout"),
                (sel(M.TIME_REF_LOG_PROBS_VALUES_REWARD), f"{r} ref log-probs, values, reward"),
                (sel(M.TIME_OLD_LOG_PROBS_VALUES), f"{r} old log-probs, values"),
                (sel(M.TIME_ADV), f"{r} advantages"),
            ],
            "s",
        ),
        panel(
            "Phase time (total), slowest rank",
            [
                (template_query(part, ["phase"]), f"{r} {{{{phase}}}}"),
            ],
            "s",
            description="time/{cluster}/{phase}/total, max across ranks.",
        ),
        panel(
            "Model state onload and offload",
            [
                (template_query(moves, ["phase", "part"]), f"{r} {{{{phase}}}} {{{{part}}}}"),
            ],
            "s",
        ),
        panel(
            "Phase execute: host vs GPU, slowest rank",
            [
                (template_query(host_exec, ["phase"]), f"{r} {{{{phase}}}} host"),
                (template_query(gpu_exec, ["phase"]), f"{r} {{{{phase}}}} GPU"),
            ],
            "s",
            description="time/{cluster}/{phase}/execute (what the caller spent) beside "
            "time/{cluster}/{phase}/gpu/execute (the stream's work between the phase's CUDA "
            "events). The host runs ahead of the GPU: where they differ, the GPU time is where "
            "the step goes.",
        ),
        panel(
            "Phase GPU time (total), slowest rank",
            [(template_query(gpu_total, ["phase"]), f"{r} {{{{phase}}}}")],
            "s",
            description="time/{cluster}/{phase}/gpu/total, max across ranks (absent without CUDA).",
        ),
        panel(
            "Stragglers: slowest rank behind the median rank",
            [(f"{straggler('lag')}{{{RUN}}}", f"{r} {{{{cluster}}}}/{{{{phase}}}}")],
            "s",
            description="straggler/{cluster}/{phase}/lag: per step and phase, the slowest rank's "
            "time minus the median rank's, from every rank's span (collector-derived). A line "
            "that stays up is a rank holding every step back; the next panel says which.",
        ),
        panel(
            "Stragglers: which rank is slowest",
            [(f"{straggler('slowest_rank')}{{{RUN}}}", f"{r} {{{{cluster}}}}/{{{{phase}}}}")],
            "none",
            description="straggler/{cluster}/{phase}/slowest_rank. The same rank step after step "
            "(a flat line) with a large lag fires RLPulsePersistentStraggler. The run's trace "
            "(trace tracker; rlpulse report --timeline) shows the ranks side by side.",
        ),
        *ledger_row(),
        *engine_row(),
    ]
    return dashboard(
        "rlpulse-throughput",
        "rlpulse / Throughput and phase timings",
        "Tokens per second, samples, driver stage and per-phase times.",
        layout(panels),
    )


def stacked(p: dict[str, Any]) -> dict[str, Any]:
    """A time series panel whose series are stacked (parts of one whole), filled."""
    custom = p["fieldConfig"]["defaults"]["custom"]
    custom["stacking"] = {"mode": "normal", "group": "A"}
    custom["fillOpacity"] = 60
    return p


def ledger_row() -> list[dict[str, Any]]:
    """The step ledger (rlpulse.schemas.ledger): where each step's wall time went."""
    r = "{{run}}"
    buckets = prom_metric(L.LEDGER_BUCKET.format(bucket=L.WORK)).name
    fractions = prom_metric(L.LEDGER_FRACTION.format(bucket=L.WORK)).name
    path = prom_metric(L.LEDGER_PATH.format(cluster="c", phase=PHASES[0], part="execute")).name
    summed = f'{{{RUN}, bucket!="{L.OVERLAP}"}}'
    return [
        row("Step ledger: where each step's time went"),
        stacked(
            panel(
                "Step wall time by bucket (stacked)",
                [(f"{buckets}{summed}", f"{r} {{{{bucket}}}}")],
                "s",
                description="ledger/{bucket}: each second of the step's wall time (first rank's "
                "start to last rank's end) in one bucket: work on the critical path, straggler "
                "wait, rollout tail, weight sync, reward, checkpoint, gaps (no rank in a phase) "
                "and unaccounted; they stack to ledger/wall. docs/ledger.md; rlpulse why "
                "RUN.jsonl --step N for one step.",
            )
        ),
        stacked(
            panel(
                "Share of the step by bucket",
                [(f"{fractions}{summed}", f"{r} {{{{bucket}}}}")],
                "percentunit",
                description="ledger/{bucket}/fraction: the same buckets as shares of the step.",
            )
        ),
        stacked(
            panel(
                "Critical path by phase and part",
                [(f"{path}{{{RUN}}}", f"{r} {{{{cluster}}}}/{{{{phase}}}} {{{{part}}}}")],
                "s",
                description="ledger/path/{cluster}/{phase}/{part}: the step's critical path in "
                "each phase: its execute, onload and offload, the straggler wait of its "
                "slowest rank and the rollout tail.",
            )
        ),
        panel(
            "Step against the run's rolling median",
            [
                (sel(L.LEDGER_WALL), f"{r} step"),
                (sel(A.LEDGER_MEDIAN), f"{r} rolling median"),
                (sel(A.LEDGER_EXCESS), f"{r} excess"),
                (f'{buckets}{{{RUN}, bucket="{L.OVERLAP}"}}', f"{r} overlap (not in the sum)"),
            ],
            "s",
            description="ledger/wall beside the median of the run's previous steps; above "
            "ledger_margin (20%) the step record names a cause (the jsonl's ledger.cause, the "
            "stdout line, the trace's step event).",
        ),
    ]


def engine_row() -> list[dict[str, Any]]:
    """The rollout engine's own metrics per training step (vLLM; rlpulse.schemas.engine)."""
    r = "{{run}}"

    def latency(title: str, h: Any, description: str) -> dict[str, Any]:
        bucket = f"{name_of(h.name)}_bucket"  # the Prometheus sink's cumulative histogram
        return panel(
            title,
            [
                *((histogram_quantile(q, bucket), f"{r} p{q * 100:g}") for q in h.quantile_entries),
                (sel(h.summary, Stat.MEAN), f"{r} mean (last step)"),
                (sel(h.summary, Stat.MAX), f"{r} max (last step)"),
            ],
            "s",
            description=f"{description} Quantiles over every rollout worker's samples in each "
            "interval (histogram_quantile of the merged buckets, exact to bucket resolution); "
            "mean and max of the latest training step.",
        )

    return [
        row("Rollout engine (vLLM), per training step"),
        panel(
            "Engine tokens",
            [
                (sel(E.ENGINE_GENERATION_TOKENS), f"{r} generated"),
                (sel(E.ENGINE_PROMPT_TOKENS), f"{r} prompt (prefilled)"),
            ],
            "none",
            description="Changes of vllm:generation_tokens and vllm:prompt_tokens over the "
            "step, summed over rollout workers (validation included).",
        ),
        panel(
            "Engine requests, queue and preemptions",
            [
                (sel(E.ENGINE_REQUESTS), f"{r} finished"),
                (sel(E.ENGINE_REQUESTS_RUNNING), f"{r} running (max)"),
                (sel(E.ENGINE_REQUESTS_WAITING), f"{r} waiting (max)"),
                (sel(E.ENGINE_PREEMPTIONS), f"{r} preempted"),
            ],
            "none",
            description="Preemptions above 0: the KV cache is too small for the batch "
            "(rollout.kv_cache_mb, or gpu_memory_utilization on a GPU).",
        ),
        panel(
            "KV cache and prefix cache",
            [
                (sel(E.ENGINE_KV_CACHE_USAGE), f"{r} KV cache in use (max)"),
                (sel(E.ENGINE_PREFIX_CACHE_HIT_RATE), f"{r} prefix-cache hit rate"),
            ],
            "percentunit",
            description="vllm:kv_cache_usage_perc at its largest over the step's engine "
            "iterations; prefix-cache hits over queries (tokens).",
        ),
        latency(
            "Time to first token",
            E.ENGINE_TTFT,
            "vllm:time_to_first_token_seconds' samples.",
        ),
        latency(
            "Inter-token latency",
            E.ENGINE_ITL,
            "vllm:inter_token_latency_seconds' samples.",
        ),
        latency(
            "End-to-end request latency",
            E.ENGINE_E2E_LATENCY,
            "vllm:e2e_request_latency_seconds' samples.",
        ),
        latency("Queue time", E.ENGINE_QUEUE_TIME, "vllm:request_queue_time_seconds' samples."),
        panel(
            "Rollout stage beside the engine's generation",
            [
                (sel(M.TIME_ROLLOUT), f"{r} driver: time/rollout"),
                (sel(E.ENGINE_E2E_LATENCY.summary, Stat.MAX), f"{r} engine: slowest request"),
            ],
            "s",
            description="The driver's rollout stage against the engine's longest request: "
            "the gap is batching, transfer and the worker's own work.",
        ),
    ]


def memory() -> dict[str, Any]:
    r = "{{run}}"
    legend = f"{r} {{{{phase}}}} gpu{{{{device}}}}"

    def gpu(title: str, when: str, state: str, stat: str, unit: str, description: str) -> dict:
        q = template_query(gpu_regex(when, state, stat), ["phase", "device"])
        return panel(title, [(q, legend)], unit, description=description)

    cpu = template_regex(M.MEMORY_CPU, [("kind", "rss", "(rss|vms)")], when="end")
    panels = [
        gpu(
            "GPU peak allocated during phase",
            "end",
            "onload",
            "max_allocated",
            "bytes",
            "torch max_memory_allocated from the phase start, by worker group/phase and device.",
        ),
        gpu(
            "GPU peak reserved during phase",
            "end",
            "onload",
            "max_reserved",
            "bytes",
            "torch max_memory_reserved: what the caching allocator held.",
        ),
        gpu(
            "GPU peak reserved, fraction of device",
            "end",
            "onload",
            "max_reserved_frac",
            "percentunit",
            "Near 1: the phase is about to run out of device memory.",
        ),
        gpu(
            "GPU allocated after offload",
            "end",
            "offload",
            "allocated",
            "bytes",
            "What stays on the device once the phase offloaded its state.",
        ),
        panel(
            "CPU memory at phase end",
            [
                (template_query(cpu, ["phase", "kind"]), f"{r} {{{{phase}}}} {{{{kind}}}}"),
            ],
            "bytes",
            description="Worker process rss and vms (psutil), max across ranks.",
        ),
        *nvml_row(),
    ]
    return dashboard(
        "rlpulse-memory",
        "rlpulse / Memory by phase and device",
        "GPU and CPU memory at phase boundaries, per worker group, phase and device.",
        layout(panels),
    )


def nvml_row() -> list[dict[str, Any]]:
    """GPU state as the driver reports it (NVML, read by each worker's sender thread)."""
    legend = "{{run}} {{phase}} gpu{{device}}"  # {{phase}} holds the worker group here
    device = ("device_id", "7777", "([0-9]+)")

    def nvml(title: str, template: Template, unit: str, description: str, **fixed: str) -> dict:
        q = template_query(template_regex(template, [device], **fixed), ["phase", "device"])
        return panel(title, [(q, legend)], unit, description=description)

    return [
        row("GPU, as the driver sees it (NVML)"),
        nvml(
            "GPU memory used, whole device",
            M.GPU_DEVICE_MEMORY,
            "bytes",
            "Every process and CUDA context on the device, max over the step's readings; "
            "compare with torch's reserved memory above to see what the allocator misses.",
            stat="memory_used",
        ),
        nvml(
            "GPU memory of the worker and its children",
            M.GPU_DEVICE_MEMORY,
            "bytes",
            "This worker process and its child processes (a vLLM engine started by the "
            "rollout worker counts under rollout). Absent where a PID namespace hides them.",
            stat="memory_process",
        ),
        nvml(
            "GPU utilization",
            M.GPU_UTILIZATION,
            "percentunit",
            "Share of time a kernel ran, mean over the step's readings and ranks.",
        ),
        nvml("GPU power", M.GPU_POWER, "watt", "Board power draw, mean over the step."),
        nvml(
            "GPU temperature", M.GPU_TEMPERATURE, "celsius", "Core temperature, max over the step."
        ),
    ]


def pipeline() -> dict[str, Any]:
    rate = "[$__rate_interval]"
    panels = [
        panel("Collector up", [(f"up{{{JOB}}}", "{{instance}}")], "none", kind="stat"),
        panel("Producers connected", [("rlpulse_collector_producers", "producers")], "none"),
        panel(
            "Messages and entries received per second",
            [
                (f"rate(rlpulse_collector_messages_received_total{rate})", "messages"),
                (f"rate(rlpulse_collector_events_received_total{rate})", "entries"),
            ],
            "none",
        ),
        panel(
            "Steps emitted per minute",
            [
                (f"60 * rate(rlpulse_collector_steps_emitted_total{rate})", "emitted"),
                (f"60 * rate(rlpulse_collector_partial_steps_total{rate})", "partial"),
            ],
            "none",
        ),
        panel(
            "Sink lag",
            [("rlpulse_sink_lag_seconds", "{{sink}}")],
            "s",
            description="Age of the oldest step waiting in each sink's queue.",
        ),
        panel("Sink queue depth", [("rlpulse_sink_queue_depth", "{{sink}}")], "none"),
        panel(
            "Sink writes, errors and drops per minute",
            [
                (f"60 * rate(rlpulse_sink_written_total{rate})", "{{sink}} written"),
                (f"60 * rate(rlpulse_sink_errors_total{rate})", "{{sink}} errors"),
                (f"60 * rate(rlpulse_sink_dropped_total{rate})", "{{sink}} dropped"),
            ],
            "none",
        ),
        panel(
            "Data lost or refused (increase over 5m)",
            [
                ("increase(rlpulse_collector_producer_dropped_total[5m])", "producer drops"),
                ("increase(rlpulse_collector_producer_errors_total[5m])", "producer errors"),
                ("increase(rlpulse_collector_producer_invalid_total[5m])", "invalid values"),
                ("increase(rlpulse_collector_late_entries_total[5m])", "late entries"),
                (
                    "sum by (reason) (increase(rlpulse_collector_malformed_total[5m]))",
                    "malformed {{reason}}",
                ),
            ],
            "none",
        ),
        panel(
            "Ranks in the latest step",
            [
                (f"rlpulse_run_ranks{{{RUN}}}", "{{run}} ranks"),
                (f"rlpulse_run_step_partial{{{RUN}}}", "{{run}} partial"),
            ],
            "none",
        ),
        panel(
            "Collector process",
            [
                (f"rate(process_cpu_seconds_total{{{JOB}}}{rate})", "CPU seconds/s"),
                (f"process_resident_memory_bytes{{{JOB}}} / 2^30", "rss GiB"),
            ],
            "none",
        ),
    ]
    return dashboard(
        "rlpulse-pipeline",
        "rlpulse / Pipeline health",
        "The collector's own health: producers, steps, sinks, drops.",
        layout(panels),
    )


def serving() -> dict[str, Any]:
    """The policy server (``python -m rlpulse.trainer.serve``, role serve): traffic, errors, latency."""
    r = "{{run}}"
    rate = "[$__rate_interval]"
    latency = name_of(M.SERVE_LATENCY.name)  # a Prometheus histogram on /metrics
    bucket = f"{latency}_bucket"  # the Prometheus sink's histogram of serve/latency
    summary = M.SERVE_LATENCY_SUMMARY
    rss = name_of(M.MEMORY_CPU.format(cluster=SERVE, phase=GENERATE, when="end", kind="rss"))
    gpu = name_of(M.GPU_DEVICE_MEMORY.format(cluster=SERVE, device_id=0, stat="memory_process"))
    errors = name(M.SERVE_ERRORS_TOTAL)
    panels = [
        panel(
            "Requests and errors per second",
            [
                (
                    f"sum by (run) (rate({name(M.SERVE_REQUESTS_TOTAL)}{{{RUN}}}{rate}))",
                    f"{r} requests",
                ),
                (f"sum by (run) (rate({errors}{{{RUN}}}{rate}))", f"{r} errors"),
            ],
            "reqps",
            description="Rates of the collector's running totals over every replica. Alert "
            "RLPulseServeErrorRateHigh fires when errors exceed 5% of requests for 5m.",
        ),
        panel(
            "Errors by kind per second",
            [(f"sum by (run, kind) (rate({errors}{{{RUN}}}{rate}))", f"{r} {{{{kind}}}}")],
            "reqps",
            description="serve/errors/{kind} summed over every reporting window (a counter "
            "per kind): 4xx kinds are the clients' (the answer names the field), overloaded "
            "(503) and internal (500) the server's.",
        ),
        panel(
            "Latency quantiles",
            [
                *(
                    (histogram_quantile(q, bucket), f"{r} p{q * 100:g}")
                    for q in M.SERVE_LATENCY.quantile_entries
                ),
                (
                    f"sum by (run) (rate({latency}_sum{{{RUN}}}{rate})) / "
                    f"sum by (run) (rate({latency}_count{{{RUN}}}{rate}))",
                    f"{r} mean",
                ),
                (sel(summary, Stat.MAX), f"{r} max (last window)"),
            ],
            "s",
            description="Of the requests answered in each interval, over every replica: "
            "quantiles from the merged cumulative histogram (histogram_quantile, exact to "
            "bucket resolution, 26% wide), the mean from its sum and count; max is the latest "
            "1 s reporting window's. Alert RLPulseServeLatencyP99High fires above 1 s.",
        ),
        heatmap(
            "Latency distribution",
            f"sum by (le) (increase({bucket}{{{RUN}}}{rate}))",
            "s",
            description="Requests per latency bucket in each interval, every selected run and "
            "replica together (serve/latency/bucket/{le}, cumulative on /metrics).",
        ),
        panel(
            "Tokens generated per second",
            [(f"sum by (run) (rate({name(M.SERVE_TOKENS_GENERATED_TOTAL)}{{{RUN}}}{rate}))", r)],
            "none",
        ),
        panel(
            "Queue depth and batch size",
            [
                (sel(M.SERVE_QUEUE_DEPTH), f"{r} queue depth (max)"),
                (sel(M.SERVE_BATCH_SIZE, Stat.MEAN), f"{r} batch size (mean)"),
                (sel(M.SERVE_BATCH_SIZE, Stat.MAX), f"{r} batch size (max)"),
            ],
            "none",
            description="Requests waiting for the model, and requests generated together per "
            "model call: batches grow with load; a queue that stays full answers 503.",
        ),
        panel(
            "Server memory",
            [
                (f"{rss}{{{RUN}}}", f"{r} rss at batch end"),
                (f"{gpu}{{{RUN}}}", f"{r} GPU 0, server process"),
            ],
            "bytes",
            description="Resident memory after a batch (serve/generate phase, max across "
            "replicas), and GPU memory of the server process (NVML; absent without a GPU).",
        ),
    ]
    return dashboard(
        "rlpulse-serving",
        "rlpulse / Serving",
        "The policy server: requests, errors by kind, latency quantiles, tokens, queue, memory.",
        layout(panels),
    )


def name_of(reported: str) -> str:
    """The Prometheus name of a reported name (a template instance)."""
    return prom_metric(reported).name


DASHBOARDS = {
    "rlpulse-rl-overview.json": rl_overview,
    "rlpulse-throughput.json": throughput,
    "rlpulse-memory.json": memory,
    "rlpulse-pipeline.json": pipeline,
    "rlpulse-serving.json": serving,
}


def render(build: Any) -> str:
    return json.dumps(build(), indent=2, sort_keys=False) + "\n"


def main(argv: list[str]) -> int:
    out = Path(argv[0]) if argv else HERE / "dashboards"
    out.mkdir(parents=True, exist_ok=True)
    for filename, build in DASHBOARDS.items():
        (out / filename).write_text(render(build))
        print(out / filename)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
