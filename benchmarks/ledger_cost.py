"""What the step ledger costs (issue 49): the collector's CPU per step, and the producers'.

**Collector.** The ledger is made once per step, when the step is emitted: the critical path
and buckets of the step's spans, the judgement against the run's rolling window, the
``ledger/...`` numbers (``rlpulse.collector.output.ledgers.Ledgers.add``), and the step's line
for stdout and the trace (``rlpulse.schemas.ledger_view.line``). Both are timed on steps of
the demo trainer's shape (its 7 workers' 13 phases of a step, with a checkpoint now and then)
and on larger ones: 64 and 1,024 data-parallel ranks of each phase. Nothing is added per
message but a dictionary lookup (the producer's clock offset) and two more columns read for a
phase's end: ``benchmarks/paced.py`` is the guard there.

**Producers.** The rollout logs, with its generate phase, when each response finished (a
distribution of 256 values for the demo's 256 responses) and the longest response: the cost
of that ``log()`` call beside the same call without them, on a producer connected to a
collector, CPU of the whole process (the sender's sketch included). The HF path also notes the
time at every generation step (a stopping criterion): one ``perf_counter`` call and a small
tensor per token, timed alone.

Both against a demo step: the ``rlpulse.trainer`` default run's median step from
``results/overhead.json`` when it is there (the smallest step of the demo's configurations),
else 0.38 s, its last measured value.

    python -m benchmarks.ledger_cost [--steps 300]
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common import RESULTS, CpuSteal, load_snapshot, summarize, write_json
from rlpulse.collector.output.ledgers import Ledgers
from rlpulse.schemas.ledger_view import line
from rlpulse.schemas.spans import Span

FALLBACK_STEP_S = 0.38
PHASES = (  # (role, ranks, phase, start, seconds) of a demo step, in seconds from its start
    ("actor_train", 1, "model_update", 0.00, 0.02),
    ("rollout", 1, "model_update", 0.03, 0.07),
    ("rollout", 1, "generate", 0.11, 0.12),
    ("reference", 1, "compute_log_probs", 0.24, 0.01),
    ("reward", 1, "compute_rewards", 0.24, 0.001),
    ("actor_train", 2, "compute_log_probs", 0.26, 0.03),
    ("critic", 1, "compute_values", 0.26, 0.04),
    ("actor_train", 2, "train_step", 0.31, 0.22),
    ("critic", 1, "train_step", 0.31, 0.10),
)


def step_spans(step: int, ranks: int, rng: random.Random) -> list[Span]:
    """One step's spans, the demo's phases, the data-parallel ones on ``ranks`` ranks (a
    checkpoint every 10th step), each with a little jitter."""
    t0 = 1.7e9 + step
    out = []
    phases = list(PHASES)
    if step % 10 == 9:
        phases.append(("actor_train", 2, "do_checkpoint", 0.55, 0.2))
    for role, n, phase, start, seconds in phases:
        for rank in range(ranks if n > 1 else 1):
            s = t0 + start + rng.uniform(0, 0.002)
            length = seconds * rng.uniform(0.95, 1.05)
            longest = 6.0 if phase == "generate" else None
            out.append(
                Span(
                    role,
                    rank,
                    "h",
                    role,
                    phase,
                    s,
                    s + length,
                    length * 0.9,
                    None,
                    length * 0.05,
                    length * 0.04,
                    longest,
                )
            )
    return out


def collector_cost(steps: int, ranks: int) -> dict[str, Any]:
    """µs per step of the ledger (``Ledgers.add``) and of its line, over ``steps`` steps."""
    rng = random.Random(0)
    ledgers = Ledgers(margin=0.2)
    spans = [step_spans(s, ranks, rng) for s in range(steps)]
    add_us, line_us = [], []
    for s, step in enumerate(spans):
        metrics = {"rollout/response/finish/p90": 0.1}
        t0 = time.perf_counter_ns()
        record = ledgers.add("bench", step, metrics)
        t1 = time.perf_counter_ns()
        line(s, metrics, record)
        t2 = time.perf_counter_ns()
        add_us.append((t1 - t0) / 1e3)
        line_us.append((t2 - t1) / 1e3)
    return {
        "ranks": ranks,
        "spans": len(spans[0]),
        "add_us": summarize(add_us[5:]),
        "line_us": summarize(line_us[5:]),
    }


def producer_cost(calls: int, responses: int) -> dict[str, Any]:
    """Process CPU (µs) per generate phase's ``log()`` call with and without the responses'
    finish times and the longest response, interleaved in blocks, on a connected producer."""
    from rlpulse.collector.launch import start_collector
    from rlpulse.producer import Producer
    from rlpulse.schemas import metrics as M

    tmp = Path(tempfile.mkdtemp(prefix="rlpulse-ledger-"))
    collector = start_collector(
        {"track_with": ["jsonl"], "tracker_kwargs": {"jsonl": {"path": str(tmp / "o.jsonl")}}},
        stdout=subprocess.DEVNULL,
        stderr=(tmp / "collector.log").open("w"),
    )
    producer = Producer(
        collector.address, run="bench", role="rollout", expected_roles={"rollout": 1}
    )
    base = {
        M.TIME_PHASE.format(cluster="rollout", phase="generate", part=p): 0.1
        for p in ("total", "execute", "onload", "offload")
    }
    rng = np.random.default_rng(0)
    finish = [np.sort(rng.uniform(0.01, 0.12, responses)) for _ in range(8)]
    cpu = {"without": 0.0, "with": 0.0}
    n = {"without": 0, "with": 0}
    step = 0
    try:
        for block in range(2 * (calls // 50)):
            which = ("without", "with")[block % 2]
            c0 = time.process_time()
            for _ in range(50):
                data = dict(base)
                if which == "with":
                    data[M.ROLLOUT_RESPONSE_FINISH.name] = finish[step % 8]
                    data[M.ROLLOUT_RESPONSE_LONGEST.name] = 6
                producer.log(data, step)
                step += 1
                time.sleep(0.001)
            producer.flush(timeout=10.0)
            cpu[which] += time.process_time() - c0
            n[which] += 50
    finally:
        producer.close()
        collector.stop()
    per = {k: cpu[k] / n[k] * 1e6 for k in cpu}
    return {
        "responses": responses,
        "calls": n,
        "cpu_us_per_call": per,
        "extra_us": per["with"] - per["without"],
    }


def step_timer_cost(tokens: int) -> dict[str, Any]:
    """The HF path's stopping criterion (``rlpulse.trainer.rollout.StepTimes``), µs per
    generation step, alone."""
    import torch

    from rlpulse.trainer.rollout import StepTimes

    ids = torch.zeros((256, 12), dtype=torch.long)
    timer = StepTimes()
    out = []
    for _ in range(tokens):
        t0 = time.perf_counter_ns()
        timer(ids, None)
        out.append((time.perf_counter_ns() - t0) / 1e3)
    return {"us_per_token": summarize(out[10:])}


def demo_step_s() -> tuple[float, str]:
    path = RESULTS / "overhead.json"
    try:
        times = json.loads(path.read_text())["times"]["on"]
        return float(np.median(times)), f"results/overhead.json ({len(times)} runs)"
    except (OSError, KeyError, ValueError):
        return FALLBACK_STEP_S, "its last measured value (results/overhead.json absent)"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--calls", type=int, default=500)
    parser.add_argument("--out", default="ledger_cost")
    args = parser.parse_args(argv)
    steal, load0 = CpuSteal(), load_snapshot()
    step_s, source = demo_step_s()
    res: dict[str, Any] = {
        "collector": [
            collector_cost(steps, ranks)
            for ranks, steps in (
                (2, args.steps),
                (64, args.steps),
                (1024, max(20, args.steps // 10)),
            )
        ],
        "producer": producer_cost(args.calls, 256),
        "step_timer": step_timer_cost(200),
        "demo_step_s": step_s,
        "demo_step_source": source,
        "date": time.strftime("%Y-%m-%d %H:%M %Z"),
        "steps": args.steps,
        "load_start": load0,
        "load_end": load_snapshot(),
        "cpu": steal.since_start(),
    }
    demo = res["collector"][0]
    per_step_us = demo["add_us"]["median"] + demo["line_us"]["median"]
    res["collector_share"] = per_step_us / (step_s * 1e6)
    res["producer_share"] = (
        max(res["producer"]["extra_us"], 0.0) + 6 * res["step_timer"]["us_per_token"]["median"]
    ) / (step_s * 1e6)
    res["met"] = res["collector_share"] < 0.005 and res["producer_share"] < 0.005
    write_json(args.out, res)
    print(json.dumps({k: res[k] for k in ("collector_share", "producer_share", "met")}))
    for c in res["collector"]:
        print(
            f"{c['ranks']} ranks, {c['spans']} spans: ledger {c['add_us']['median']:.0f} us, "
            f"line {c['line_us']['median']:.0f} us per step"
        )
    print(f"producer: {res['producer']['extra_us']:.1f} us of CPU per generate phase more")


if __name__ == "__main__":
    main()
