"""What a distribution metric (``Reduction.DIST``: mean/max/min plus a quantile sketch) costs
beside a plain mean/max/min family, in ``log()`` and in the collector (issue 26).

* **log(), host**: a float32 array (1k and 1M elements, plain and masked with 80% kept): what
  the caller does (copy the samples, for a mean/max/min family and a distribution alike:
  ``rlpulse.producer.reduce.snapshot_value`` and ``rlpulse.producer.sketch.snapshot_value``)
  and what the sender thread then does (``reduce_value``: the exact state; ``sketch_value``:
  the state plus the encoded sketch).
* **log(), GPU** (only with CUDA): device time of the side-stream kernels for 1M elements,
  ``reduce_tensor`` against ``reduce_tensor`` + ``sketch_tensor``, and the host time of the
  launch (no synchronization in either).
* **collector**: one step of 8 ranks, each sending one message with a 1M/8-token
  distribution and a scalar, decoded from bytes, merged and emitted (the step's quantiles read
  off the merged sketch), against the same messages without sketches (mean/max/min only).
* **wire**: bytes of one entry with and without its sketch.

Contenders take turns (interleaved); the table shows medians and p90s in microseconds.

    python -m benchmarks.sketch_cost [--calls 50]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import numpy as np

from benchmarks.common import write_json
from rlpulse.collector.config import CollectorConfig
from rlpulse.collector.runs.aggregator import Aggregator
from rlpulse.producer import Masked
from rlpulse.producer.copies import snapshot_value as snapshot_mmm
from rlpulse.producer.reduce import reduce_value
from rlpulse.producer.sketch import sketch_value, snapshot_value
from rlpulse.schemas import metrics as M, protocol as P
from rlpulse.schemas.messages import TableDecl
from rlpulse.schemas.reductions import Reduction

ADV, LOSS = M.CRITIC_ADVANTAGES.name, M.ACTOR_PG_LOSS.name
RANKS = 8
CALLER_1K: dict[str, float] = {}
"""The caller's median µs for 1,000 float32 samples: a mean/max/min family and a distribution."""


def interleave(contenders: dict[str, Callable[[], object]], calls: int) -> dict[str, np.ndarray]:
    """Per contender, ``calls`` timings in µs, contenders alternating call by call."""
    out: dict[str, list[float]] = {k: [] for k in contenders}
    for fn in contenders.values():
        fn()  # warm-up
    for _ in range(calls):
        for k, fn in contenders.items():
            t = time.perf_counter_ns()
            fn()
            out[k].append((time.perf_counter_ns() - t) / 1e3)
    return {k: np.array(v) for k, v in out.items()}


def row(what: str, base: np.ndarray, dist: np.ndarray) -> str:
    b50, d50 = np.median(base), np.median(dist)
    b90, d90 = np.percentile(base, 90), np.percentile(dist, 90)
    return f"| {what} | {b50:,.0f} | {b90:,.0f} | {d50:,.0f} | {d90:,.0f} | {d50 / b50:.2f}x |"


def host_rows(calls: int) -> list[str]:
    rng = np.random.default_rng(0)
    out = []
    for n in (1_000, 1_000_000):
        x = rng.normal(0, 1, n).astype(np.float32)
        mask = rng.random(n) < 0.8
        for label, value in ((f"{n:,} float32", x), (f"{n:,} float32, masked", Masked(x, mask))):
            t = interleave(
                {
                    "mmm_caller": lambda v=value: snapshot_mmm(v),
                    "mmm_sender": lambda v=value: reduce_value(v),
                    "caller": lambda v=value: snapshot_value(v),
                    "sender": lambda v=value: sketch_value(v),
                },
                calls,
            )
            out.append(row(f"log() caller, host: {label}", t["mmm_caller"], t["caller"]))
            out.append(row(f"sender thread, host: {label}", t["mmm_sender"], t["sender"]))
            if n == 1_000 and label.endswith("float32"):
                CALLER_1K.update(
                    mmm=float(np.median(t["mmm_caller"])), dist=float(np.median(t["caller"]))
                )
    return out


def gpu_rows(calls: int) -> list[str]:
    try:
        import torch
    except ImportError:
        return ["| log(), GPU | not measured: torch missing | | | | |"]
    if not torch.cuda.is_available():
        return ["| log(), GPU | not measured: no CUDA device | | | | |"]
    from rlpulse.producer.device import reduce_tensor, sketch_tensor

    v = torch.randn(1_000_000, device="cuda")
    mask = torch.rand(1_000_000, device="cuda") < 0.8
    torch.cuda.synchronize()

    def device_us(fn: Callable[[], object]) -> float:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) * 1e3

    base = lambda: reduce_tensor(torch, v, mask)  # noqa: E731
    dist = lambda: (reduce_tensor(torch, v, mask), sketch_tensor(torch, v, mask))  # noqa: E731
    for fn in (base, dist):
        fn()
    dev_b = np.array([device_us(base) for _ in range(calls)])
    dev_d = np.array([device_us(dist) for _ in range(calls)])
    host = interleave({"mmm": base, "dist": dist}, calls)
    torch.cuda.synchronize()
    name = torch.cuda.get_device_name()
    return [
        row(f"GPU kernels, device time: 1M float32 masked ({name})", dev_b, dev_d),
        row("GPU kernels, host launch time (no sync)", host["mmm"], host["dist"]),
    ]


def step_messages(sketched: bool, seed: int) -> list[bytes]:
    """One step of ``RANKS`` ranks: a hello each, one metrics message each, a done each."""
    rng = np.random.default_rng(seed)
    tokens = rng.normal(0, 1, 1_000_000)
    out = []
    for rank, chunk in enumerate(np.array_split(tokens, RANKS)):
        pid = rank + 1
        decl = TableDecl(0, [ADV, LOSS], bytes([Reduction.MEAN, Reduction.MEAN]))
        out.append(
            P.encode_hello(pid, 1, run="r", role="a", rank=rank, world_size=RANKS, tables=[decl])
        )
        state, _, sketch = sketch_value(chunk)
        rows = np.array([state, (1.0, 1.0, 1.0, 1.0)], dtype="<f8").tobytes()
        entry = P.pack_entry(0, 0.0, 0, rows, {}, {0: sketch} if sketched else None)
        out.append(P.encode_metrics(pid, 1, [entry], done=0))
    return out


def collector_rows(calls: int) -> list[str]:
    msgs = {k: step_messages(k, 1) for k in (False, True)}
    timing = CollectorConfig(grace_s=30.0, liveness_s=10.0, settle_s=0.0)

    def one_step(sketched: bool) -> None:
        out: list = []
        agg = Aggregator(out.append, timing)
        for buf in msgs[sketched]:
            agg.handle(P.decode(buf), 0.0)
        agg.poll(0.0)
        assert len(out) == 1 and (f"{ADV}/p50" in out[0].metrics) == sketched

    t = interleave({"mmm": lambda: one_step(False), "dist": lambda: one_step(True)}, calls)
    per_entry = {k: v / RANKS for k, v in t.items()}
    plain, sketched = (len(msgs[k][1]) for k in (False, True))
    return [
        row(f"collector: one step of {RANKS} ranks (decode, merge, emit)", t["mmm"], t["dist"]),
        row("collector: per rank's entry", per_entry["mmm"], per_entry["dist"]),
        f"| wire: one entry, 125k normal tokens (bytes) | {plain:,} | | {sketched:,} | | "
        f"{sketched / plain:.0f}x |",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=50)
    args = parser.parse_args()
    lines = [*host_rows(args.calls), *gpu_rows(args.calls), *collector_rows(args.calls)]
    print("| what | mean/max/min p50 µs | p90 µs | dist (sketch) p50 µs | p90 µs | dist / mmm |")
    print("|---|---:|---:|---:|---:|---:|")
    for line in lines:
        print(line)
    write_json(
        "sketch_cost",
        {
            "rows": lines,
            "calls": args.calls,
            "caller_1k": CALLER_1K,
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        },
    )


if __name__ == "__main__":
    main()
