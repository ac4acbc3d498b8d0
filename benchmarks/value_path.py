"""The path of one value, function by function: from ``Producer.log`` to its JSON line.

A structure measure, not a speed one (issue #40 asks for the hop count of a ``Masked``
distribution value before and after a restructuring). One process runs a collector (jsonl
tracker, in a thread) and a producer; a first step warms both up (name table sent, sinks
open). Then every thread is profiled while step 1 is logged: ``critic/advantages`` (a catalog
distribution, so it takes the sketch path) as ``Masked(tensor, mask)``, the rank says the step
is done, and tracing stops when the step's line is in the file. Each call into rlpulse's own
code is recorded once per function, in the order first called, with its thread.

The count is of distinct functions, not calls: loops and helpers called many times count once.
It includes what runs beside the value in the same window (the collector's poll loop, the
sender's heartbeat), which is part of what a reader follows; both sides of a comparison pay it.

    python -m benchmarks.value_path [--out path.json] [--list]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
from pathlib import Path
from types import FrameType
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("producer", "collector", "schemas", "wire")
"""The folders whose functions count (the trainer, runtools and deploy are not on the path)."""


def _module_of(filename: str) -> str | None:
    path = Path(filename).resolve()
    try:
        rel = path.relative_to(ROOT)
    except ValueError:
        return None
    parts = rel.with_suffix("").parts
    if parts[0] == "rlpulse":  # the packages live in rlpulse/ (before 11-27: at the top)
        parts = parts[1:]
    if not parts or parts[0] not in PACKAGES:
        return None
    return ".".join(parts)


def trace_one_value(timeout_s: float = 30.0) -> dict[str, Any]:
    """Run the path once and return what was called, per thread, in first-call order."""
    import torch

    from rlpulse.collector.config import CollectorConfig
    from rlpulse.collector.daemon import Collector
    from rlpulse.producer import Masked, Producer
    from rlpulse.schemas import metrics as M

    seen: dict[tuple[str, str, str], int] = {}
    order: list[tuple[str, str, str]] = []

    active = [False]

    def profile(frame: FrameType, event: str, arg: object) -> None:
        if event != "call" or not active[0]:
            return
        module = _module_of(frame.f_code.co_filename)
        if module is None:
            return
        key = (threading.current_thread().name, module, frame.f_code.co_qualname)
        if key not in seen:
            seen[key] = 0
            order.append(key)
        seen[key] += 1

    # Every thread rlpulse starts from here on carries the profiler; it records only while
    # ``active`` (Python 3.11 cannot attach one to a thread already running).
    threading.setprofile(profile)
    out = Path(tempfile.mkdtemp(prefix="value-path-")) / "run.jsonl"
    config = CollectorConfig.from_mapping(
        {
            "bind": "tcp://127.0.0.1:*",
            "settle_s": 0,
            "track_with": ["jsonl"],
            "tracker_kwargs": {"jsonl": {"path": str(out)}},
        }
    )
    collector = Collector(config)
    server = threading.Thread(target=collector.run, name="collector", daemon=True)
    server.start()
    producer = Producer(collector.address, run="path", role="critic", rank=0, world_size=1)
    values = torch.linspace(-1.0, 1.0, 1024)
    mask = torch.arange(1024) % 3 != 0
    name = M.CRITIC_ADVANTAGES.name

    def lines() -> list[dict[str, Any]]:
        if not out.exists():
            return []
        return [json.loads(x) for x in out.read_text().splitlines() if x.strip()]

    def wait_for_step(step: int) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for rec in lines():
                if rec.get("step") == step and name in json.dumps(rec):
                    return rec
            time.sleep(0.005)
        raise TimeoutError(f"step {step} of {name} never reached {out}")

    producer.log({name: Masked(values, mask)}, step=0)
    producer.step_done(0)
    wait_for_step(0)

    sys.setprofile(profile)
    active[0] = True
    try:
        producer.log({name: Masked(values, mask)}, step=1)
        producer.step_done(1)
        record = wait_for_step(1)
    finally:
        active[0] = False
        sys.setprofile(None)
        threading.setprofile(None)  # type: ignore[arg-type]
    producer.close()
    collector.stop()  # run() closes it on its own thread
    server.join(timeout=10)
    threads: dict[str, list[str]] = {}
    for thread_name, module, qualname in order:
        threads.setdefault(thread_name, []).append(f"{module}.{qualname}")
    return {
        "value": f"Masked({name}, 1024 float32, 2/3 kept)",
        "functions": len(order),
        "calls": sum(seen.values()),
        "modules": len({m for _, m, _ in order}),
        "per_thread": {t: len(fs) for t, fs in threads.items()},
        "order": threads,
        "record_has_value": name in json.dumps(record),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, help="write the result as JSON here")
    parser.add_argument("--list", action="store_true", help="print every function, per thread")
    args = parser.parse_args(argv)
    result = trace_one_value()
    if args.list:
        for thread, functions in result["order"].items():
            print(f"## {thread} ({len(functions)})")
            for fn in functions:
                print(f"  {fn}")
    print(
        f"{result['value']}: {result['functions']} functions in {result['modules']} modules, "
        f"{result['calls']} calls; per thread {result['per_thread']}"
    )
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
