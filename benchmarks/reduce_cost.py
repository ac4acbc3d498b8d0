"""What ``log()`` of one big tensor costs the caller, against the least the work needs.

**CPU** (always): a 1M-element float32 tensor, plain and masked (80% of elements kept),
logged through ``Producer.log`` connected to a running collector, against the numpy floor
of an exact reduction on the same data: finite check, float64 sum, min and max (masked: the
masked samples selected with ``np.compress`` first, the cheapest numpy selection). Goal:
at most 1.5x the floor at the median.

**GPU** (only with CUDA; skipped otherwise, saying so): host time of ``log()`` of a CUDA
tensor of 1k and 1M elements, plain and masked,

* with the GPU idle, against a naive ``t.mean().item()`` on the same tensor (goal: no more);
* while 200 ms of GPU work is queued ahead of it, after the same 2 ms pause as the idle case
  (goal: at most 100 µs, i.e. no waiting);
* the first call in a fresh process (reported, no goal);

and a phase whose body queues 300 ms of GPU work: the GPU time it reports (goal: >= 300 ms)
next to the host time.

Contenders take turns call by call (interleaved). Each timed call is followed by a pause
outside the timing so background threads run, as between training steps.

    python -m benchmarks.reduce_cost [--calls 200]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common import load_snapshot, spin_cycles_per_ms, summarize, write_json
from rlpulse.producer.config import ProducerConfig

N = 1_000_000
PAUSE_S = 0.002


def _time(fn: Callable[[], object]) -> float:
    t = time.perf_counter_ns()
    fn()
    return (time.perf_counter_ns() - t) / 1e3


def interleave(contenders: dict[str, Callable[[], object]], calls: int, between=None) -> dict:
    """Per contender: summary of ``calls`` timings in µs, contenders alternating."""
    samples: dict[str, list[float]] = {k: [] for k in contenders}
    for fn in contenders.values():  # warm-up, untimed
        fn()
    for _ in range(calls):
        for k, fn in contenders.items():
            if between is not None:
                between()
            samples[k].append(_time(fn))
            time.sleep(PAUSE_S)
    return {k: summarize(v) for k, v in samples.items()}


def _collector(tmp: Path) -> Any:
    from rlpulse.collector.launch import start_collector

    return start_collector(
        {"track_with": ["jsonl"], "tracker_kwargs": {"jsonl": {"path": str(tmp / "out.jsonl")}}},
        stdout=subprocess.DEVNULL,
        stderr=(tmp / "collector.log").open("w"),
    )


# ---------------------------------------------------------------------------- CPU


def cpu_section(calls: int, tmp: Path) -> dict[str, Any]:
    import torch

    from rlpulse.producer import Masked, Producer

    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(0)
    t = torch.randn(N, generator=gen)
    m = torch.rand(N, generator=gen) < 0.8
    a, am = t.numpy(), m.numpy()

    def floor() -> object:
        return np.isfinite(a).all(), a.sum(dtype=np.float64), a.min(), a.max()

    def floor_masked() -> object:
        s = np.compress(am, a)
        return np.isfinite(s).all(), s.sum(dtype=np.float64), s.min(), s.max()

    collector = _collector(tmp)
    p = Producer(
        collector.address, run="bench", role="actor_train", config=ProducerConfig(gpu_sample_s=0)
    )
    step = iter(range(10**9))
    res = interleave(
        {
            "floor": floor,
            "log": lambda: p.log({"x": t}, step=next(step)),
            "floor_masked": floor_masked,
            "log_masked": lambda: p.log({"x": Masked(t, m)}, step=next(step)),
        },
        calls,
    )
    p.close()
    collector.stop()
    plain = res["log"]["median"] / res["floor"]["median"]
    masked = res["log_masked"]["median"] / res["floor_masked"]["median"]
    rows = [
        ("plain", "numpy floor", res["floor"], res["log"], plain),
        ("masked (80%)", "numpy floor (compress)", res["floor_masked"], res["log_masked"], masked),
    ]
    md = [
        f"1M float32 elements, {calls} calls per contender, interleaved; `log()` connected to a "
        "running collector. The floor is numpy's least exact reduction on the same data.",
        "",
        "| tensor | floor | floor median | `log()` median | `log()` p99 | `log()` / floor |",
        "|---|---|---|---|---|---|",
        *[
            f"| {kind} | {what} | {f['median']:,.0f} µs | {r['median']:,.0f} µs | {r['p99']:,.0f} µs | {ratio:.2f}x |"
            for kind, what, f, r, ratio in rows
        ],
        "",
    ]
    return {
        "results": res,
        "markdown": md,
        "measured": f"plain {plain:.2f}x, masked {masked:.2f}x the numpy floor",
        "met": plain <= 1.5 and masked <= 1.5,
    }


# ---------------------------------------------------------------------------- GPU

FIRST_CALL = """
import json, sys, time, torch
from rlpulse.producer import Producer
from rlpulse.producer.config import ProducerConfig
t = torch.randn({n}, device="cuda")
torch.cuda.synchronize()
p = Producer("{address}", run="first", role="a", config=ProducerConfig(gpu_sample_s=0))
t0 = time.perf_counter_ns()
p.log({{"x": t}}, step=0)
first = (time.perf_counter_ns() - t0) / 1e3
t0 = time.perf_counter_ns()
p.log({{"x": t}}, step=1)
second = (time.perf_counter_ns() - t0) / 1e3
p.close()
print(json.dumps({{"first_us": first, "second_us": second}}))
"""


def queue_busy(torch: Any, cycles_per_ms: float) -> None:
    """Before a timed call with the GPU busy: wait for the last work, queue 200 ms more, then
    pause as the idle case does. Without the pause the call came right after a 200 ms blocking
    synchronize and ran cold: that, not the queued work, doubled its time (on the CPU, through
    the same code with a fake device, log() takes 74 µs back to back, 135 µs after a 2 ms
    pause and 359 µs after a 200 ms one)."""
    torch.cuda.synchronize()
    torch.cuda._sleep(int(200 * cycles_per_ms))
    time.sleep(PAUSE_S)


def gpu_section(calls: int, tmp: Path) -> dict[str, Any]:
    import torch

    if not torch.cuda.is_available():
        return {"skipped": "no CUDA device on this machine (the section runs wherever one is)"}
    from rlpulse.producer import Masked, Producer
    from rlpulse.schemas import metrics as M

    collector = _collector(tmp)
    p = Producer(
        collector.address,
        run="bench-gpu",
        role="actor_train",
        config=ProducerConfig(gpu_sample_s=0),
    )
    cycles_per_ms = spin_cycles_per_ms(torch)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    step = iter(range(10**9))
    out: dict[str, Any] = {"idle": {}, "busy": {}, "first": {}}
    for n in (1000, N):
        t = torch.randn(n, device="cuda")
        m = torch.rand(n, device="cuda") < 0.8
        out["idle"][n] = interleave(
            {
                "naive_mean_item": lambda t=t: t.mean().item(),
                "log": lambda t=t: p.log({"x": t}, step=next(step)),
                "log_masked": lambda t=t, m=m: p.log({"x": Masked(t, m)}, step=next(step)),
            },
            calls,
            between=torch.cuda.synchronize,
        )
        out["busy"][n] = interleave(
            {
                "log": lambda t=t: p.log({"x": t}, step=next(step)),
                "log_masked": lambda t=t, m=m: p.log({"x": Masked(t, m)}, step=next(step)),
            },
            max(10, calls // 10),
            between=lambda: queue_busy(torch, cycles_per_ms),
        )
        torch.cuda.synchronize()
        script = FIRST_CALL.format(n=n, address=collector.address)
        proc = subprocess.run(
            [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
        )
        out["first"][n] = json.loads(proc.stdout.strip().splitlines()[-1])
    torch.cuda.synchronize()
    with p.phase("actor_train/train_step", step=next(step)):
        start.record()  # the work's own time, measured around it inside the phase
        torch.cuda._sleep(int(300 * cycles_per_ms))
        end.record()
    phase_step = next(step) - 1
    end.synchronize()
    work_s = start.elapsed_time(end) / 1e3
    p.close(timeout=10)
    collector.stop()
    record = next(
        json.loads(line)
        for line in (tmp / "out.jsonl").read_text().splitlines()
        if json.loads(line)["step"] == phase_step and json.loads(line)["run"] == "bench-gpu"
    )

    def metric(template: Any, part: str) -> float:
        name = template.format(cluster="actor_train", phase="train_step", part=part)
        return float(record["metrics"].get(name, float("nan")))

    gpu_exec, host_exec = metric(M.TIME_PHASE_GPU, "execute"), metric(M.TIME_PHASE, "execute")
    rows, ok = [], True
    for n in (1000, N):
        idle, busy = out["idle"][n], out["busy"][n]
        naive = idle["naive_mean_item"]["median"]
        for kind in ("log", "log_masked"):
            i, b = idle[kind]["median"], busy[kind]["median"]
            ok &= i <= naive and b <= 100
            rows.append(
                f"| {n:,} | {kind.replace('log_masked', 'Masked').replace('log', 'plain')} | "
                f"{naive:,.1f} µs | {i:,.1f} µs | {i / naive:.2f}x | {b:,.1f} µs | "
                f"{out['first'][n]['first_us']:,.0f} µs |"
            )
    ok &= gpu_exec >= 0.3 and work_s <= gpu_exec <= work_s + 0.005
    md = [
        f"{torch.cuda.get_device_name()}, torch {torch.__version__}; {calls} calls per contender "
        "with the GPU idle (synchronized before each call, outside the timing), and "
        f"{max(10, calls // 10)} with 200 ms of GPU work queued, then a 2 ms pause, before each call.",
        "",
        "| elements | input | `.mean().item()` idle | `log()` idle | ratio | `log()` with 200 ms queued | first call in a process |",
        "|---|---|---|---|---|---|---|",
        *rows,
        "",
        f"A phase whose body queues 300 ms of GPU work and returns: GPU `execute` "
        f"{gpu_exec * 1e3:,.1f} ms, host `execute` {host_exec * 1e3:,.1f} ms; the work itself, "
        f"timed by events around it inside the phase, {work_s * 1e3:,.1f} ms.",
        "",
    ]
    return {
        "results": out,
        "phase": {"gpu_execute_s": gpu_exec, "host_execute_s": host_exec, "work_s": work_s},
        "markdown": md,
        "measured": (
            "; ".join(
                f"{n:,}: idle {out['idle'][n]['log']['median']:.1f} vs naive "
                f"{out['idle'][n]['naive_mean_item']['median']:.1f} µs, queued "
                f"{out['busy'][n]['log']['median']:.1f} µs"
                for n in (1000, N)
            )
            + f"; phase GPU execute {gpu_exec * 1e3:.0f} ms"
        ),
        "met": ok,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--calls", type=int, default=200)
    args = parser.parse_args()
    load0 = load_snapshot()
    with tempfile.TemporaryDirectory() as d:
        cpu = cpu_section(args.calls, Path(d))
    print("cpu:", cpu["measured"], flush=True)
    with tempfile.TemporaryDirectory() as d:
        gpu = gpu_section(args.calls, Path(d))
    print("gpu:", gpu.get("measured", gpu.get("skipped")), flush=True)
    write_json("reduce_cost", {"cpu": cpu, "gpu": gpu, "load": [load0, load_snapshot()]})
    return 0


if __name__ == "__main__":
    sys.exit(main())
