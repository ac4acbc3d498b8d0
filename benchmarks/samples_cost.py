"""What ``log()`` of a ``Samples`` value costs the caller (issue 41), beside plain scalar calls.

One producer, connected to a running collector daemon (jsonl sink), as in
``benchmarks/caller_cost.py`` and measured the same way (its :class:`CpuMeter` and
:func:`settle`, blocks of 50 calls paced by 1 ms of "training", in a shuffled order every
round, with a pause and a wait for quiet after each block). Three calls take turns:

* ``scalar``: ``log({"actor/pg_loss": x}, step)``, one scalar;
* ``scalars60``: ``log`` of 60 scalars (caller_cost's first workload);
* ``samples``: ``log({"rollout/samples": Samples(rows, key="reward")}, step)`` with 256 rows,
  each of 1 KB of text (a 256-byte prompt and a 768-byte response) and four numbers, the
  ``Samples(...)`` construction included in the timed call, as a user writes it.

The timed call is what the caller pays: ``log()`` returns once the value is handed to the
sender thread. The CPU of the whole process (the sender's reduction included) is read around
every block, so ``cpu_us_per_call`` is the total a call costs, background included. Apart, the
sender's own work on one such value (``rlpulse.schemas.samples.reduce_rows`` of the 256 rows
to top, bottom and random ``k``, and its msgpack encoding) is timed alone.

The results say whether the collector's records held the samples (``samples_in_records``): a
producer that does not take ``Samples`` yet drops the value as invalid (``stats()``), and the
caller's figure is then what the call costs to be refused.

    python -m benchmarks.samples_cost [--rounds 10]
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

from benchmarks.caller_cost import BLOCK, PACE_S, PAUSE_S, CpuMeter, settle
from benchmarks.common import RESULTS, CpuSteal, load_snapshot, summarize, write_json

ROWS = 256
PROMPT_BYTES, RESPONSE_BYTES = 256, 768
N_SCALARS = 60
WORKLOADS = ("scalar", "scalars60", "samples")
NAME = "rollout/samples"


def make_rows(rnd: random.Random, rows: int, text_bytes: int) -> list[dict[str, Any]]:
    """``rows`` rollouts of ``text_bytes`` of ASCII text each (a quarter prompt, the rest
    response) and four numbers."""
    prompt = max(1, text_bytes // 4)
    letters = "abcdefghijklmnopqrstuvwxyz "
    return [
        {
            "prompt": "".join(rnd.choices(letters, k=prompt)),
            "response": "".join(rnd.choices(letters, k=text_bytes - prompt)),
            "reward": rnd.uniform(-1, 1),
            "advantage": rnd.gauss(0, 1),
            "response_length": text_bytes - prompt,
            "staleness": rnd.randrange(3),
        }
        for _ in range(rows)
    ]


class Payloads:
    """Pre-built inputs, cycled so no call sees the same values twice in a row."""

    def __init__(self, seed: int, rows: int, text_bytes: int) -> None:
        rnd = random.Random(seed)
        names = [f"bench/scalar_{i:02d}" for i in range(N_SCALARS)]
        self.scalars = [{n: rnd.uniform(-1, 1) for n in names} for _ in range(16)]
        self.rows = [make_rows(rnd, rows, text_bytes) for _ in range(4)]


def sender_cost(p: Payloads, calls: int) -> dict[str, dict[str, float]]:
    """The sender thread's work on one value, timed alone: reducing the rows and encoding the
    state (µs)."""
    from rlpulse.schemas.samples import encode, reduce_rows

    reduce_us, encode_us = [], []
    for i in range(calls + 1):
        t0 = time.perf_counter_ns()
        state = reduce_rows(p.rows[i % 4], "reward", origin=("actor_train", 0))
        t1 = time.perf_counter_ns()
        encode(state)
        t2 = time.perf_counter_ns()
        if i:  # the first is a warm-up
            reduce_us.append((t1 - t0) / 1e3)
            encode_us.append((t2 - t1) / 1e3)
    return {"reduce_us": summarize(reduce_us), "encode_us": summarize(encode_us)}


def _samples_in_records(path: Path) -> int:
    """Lines of the collector's jsonl output that carry the samples of :data:`NAME`."""
    if not path.exists():
        return 0
    n = 0
    for line in path.read_text().splitlines():
        if NAME in json.loads(line).get("samples", {}):
            n += 1
    return n


def measure(rounds: int, seed: int, rows: int, text_bytes: int) -> dict[str, Any]:
    from rlpulse.collector.launch import start_collector
    from rlpulse.producer import Producer, Samples

    tmp = Path(tempfile.mkdtemp(prefix="rlpulse-samples-"))
    out = tmp / "rlpulse.jsonl"
    p = Payloads(seed, rows, text_bytes)
    collector = start_collector(
        {"track_with": ["jsonl"], "tracker_kwargs": {"jsonl": {"path": str(out)}}},
        stdout=subprocess.DEVNULL,
        stderr=(tmp / "collector.log").open("w"),
    )
    producer = Producer(
        collector.address, run="bench", role="actor_train", expected_roles={"actor_train": 1}
    )

    def call(workload: str, i: int) -> None:
        if workload == "scalar":
            producer.log({"actor/pg_loss": p.scalars[i % 16]["bench/scalar_00"]}, step=i)
        elif workload == "scalars60":
            producer.log(p.scalars[i % 16], step=i)
        else:
            producer.log({NAME: Samples(p.rows[i % 4], key="reward")}, step=i)

    meter = CpuMeter({collector.proc.pid})
    timings: dict[str, list[float]] = {w: [] for w in WORKLOADS}
    cpu = dict.fromkeys(WORKLOADS, 0.0)
    rng = random.Random(seed)
    clock, sleep = time.perf_counter_ns, time.sleep
    step = 0
    try:
        for w in WORKLOADS:  # warm-up, not recorded
            for _ in range(10):
                call(w, step)
                step += 1
                sleep(PACE_S)
        sleep(0.5)
        meter.read()
        settle(meter)
        for _ in range(rounds):
            order = list(WORKLOADS)
            rng.shuffle(order)
            for w in order:
                xs = timings[w]
                cpu0 = meter.read()
                for _ in range(BLOCK):
                    t0 = clock()
                    call(w, step)
                    xs.append((clock() - t0) / 1e3)
                    step += 1
                    sleep(PACE_S)
                sleep(PAUSE_S)
                settle(meter)
                cpu[w] += meter.read() - cpu0
    finally:
        producer.close()
        stats = producer.stats()
        collector.stop()
    results = [
        {
            "workload": w,
            "us": summarize(xs),
            "cpu_us_per_call": cpu[w] / len(xs) * 1e6 if xs else float("nan"),
        }
        for w, xs in timings.items()
    ]
    return {
        "results": results,
        "sender": sender_cost(p, max(20, rounds * 5)),
        "producer_stats": stats,
        "samples_in_records": _samples_in_records(out),
        "rows": rows,
        "text_bytes": text_bytes,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=10, help="blocks of 50 calls per workload")
    parser.add_argument("--rows", type=int, default=ROWS)
    parser.add_argument("--text-bytes", type=int, default=PROMPT_BYTES + RESPONSE_BYTES)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="samples_cost")
    parser.add_argument("--results", type=Path, default=RESULTS, help="folder of the JSON")
    parser.add_argument("--note", default="", help="what code was measured, for RESULTS.md")
    args = parser.parse_args(argv)
    steal, load0 = CpuSteal(), load_snapshot()
    res = measure(args.rounds, args.seed, args.rows, args.text_bytes)
    res.update(
        date=time.strftime("%Y-%m-%d %H:%M %Z"),
        rounds=args.rounds,
        block=BLOCK,
        pace_ms=PACE_S * 1e3,
        load_start=load0,
        load_end=load_snapshot(),
        cpu=steal.since_start(),
        note=args.note,
    )
    for r in res["results"]:
        s = r["us"]
        print(
            f"{r['workload']:10s} median {s['median']:8.1f} us  p99 {s['p99']:8.1f} us  "
            f"CPU/call {r['cpu_us_per_call']:8.1f} us",
            flush=True,
        )
    s = res["sender"]
    print(
        f"sender: reduce_rows median {s['reduce_us']['median']:.0f} us, encode "
        f"{s['encode_us']['median']:.0f} us; steps with samples in the records: "
        f"{res['samples_in_records']}",
        flush=True,
    )
    write_json(args.out, res, args.results)


if __name__ == "__main__":
    main()
