"""Where ``log()``'s host time goes for a CUDA tensor: the single torch and CUDA calls it makes,
timed alone on this host, and a profile of ``log()`` with the GPU idle and with 200 ms of work
queued. A diagnostic beside ``benchmarks.reduce_cost``'s GPU rows (no goal of its own).

    python -m benchmarks.gpu_profile [--calls 200] [--out DIR]

Prints one JSON line (medians in µs); with ``--out`` also writes the profiles as text.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from benchmarks.common import spin_cycles_per_ms
from benchmarks.reduce_cost import queue_busy


def median_us(fn: Callable[[], object], calls: int, between: Callable[[], object] | None = None):
    samples = []
    fn()
    for _ in range(calls):
        if between is not None:
            between()
        t = time.perf_counter_ns()
        fn()
        samples.append((time.perf_counter_ns() - t) / 1e3)
    return float(np.median(samples))


def main() -> int:
    import torch

    from rlpulse.collector.launch import start_collector
    from rlpulse.producer import Masked, Producer
    from rlpulse.producer.config import ProducerConfig

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print(json.dumps({"skipped": "no CUDA device"}))
        return 0
    calls = args.calls
    small, big = torch.randn(1000, device="cuda"), torch.randn(1_000_000, device="cuda")
    mask = torch.rand(1000, device="cuda") < 0.8
    event = torch.cuda.Event()
    ops: dict[str, Callable[[], object]] = {
        "tensor.detach()": small.detach,
        "tensor.clone(), 1k": small.clone,
        "tensor.clone(), 1M": big.clone,
        "tensor.device.type": lambda: small.device.type,
        "torch.cuda.current_stream()": torch.cuda.current_stream,
        "torch.cuda.Event()": torch.cuda.Event,
        "event.record()": event.record,
        "event.query()": event.query,
        "torch.stack([0-d])": lambda: torch.stack([small[0]]),
        "torch.cuda.is_initialized()": torch.cuda.is_initialized,
        "naive t.mean().item(), 1k": lambda: small.mean().item(),
    }
    sync = torch.cuda.synchronize
    out: dict[str, object] = {"device": torch.cuda.get_device_name(), "ops_us": {}}
    for name, fn in ops.items():
        out["ops_us"][name] = round(median_us(fn, calls, between=sync), 2)  # type: ignore[index]
    per_ms = spin_cycles_per_ms(torch)

    def busy() -> None:
        queue_busy(torch, per_ms)

    with tempfile.TemporaryDirectory() as d:
        handle = start_collector(
            {"track_with": ["jsonl"], "tracker_kwargs": {"jsonl": {"path": f"{d}/o.jsonl"}}},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        p = Producer(handle.address, run="p", role="a", config=ProducerConfig(gpu_sample_s=0))
        step = iter(range(10**9))
        profiles = {}
        for label, between, n in (("idle", sync, calls), ("busy", busy, 20)):
            for kind, value in (("plain", small), ("masked", Masked(small, mask))):
                prof = cProfile.Profile()
                samples = []
                for _ in range(n):
                    between()
                    t = time.perf_counter_ns()
                    prof.enable()
                    p.log({"x": value}, step=next(step))
                    prof.disable()
                    samples.append((time.perf_counter_ns() - t) / 1e3)
                    time.sleep(0.002)
                text = io.StringIO()
                pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(25)
                key = f"log() 1k {kind}, {label}"
                out[key] = round(float(np.median(samples)), 1)
                profiles[key] = text.getvalue()
        p.close(timeout=10)
        handle.stop()
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "gpu-profile.txt").write_text(
            "\n\n".join(f"== {k} ==\n{v}" for k, v in profiles.items())
        )
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
