"""Collector ingest (issue item 2) and scale curve (item 4).

For each ranks x metrics configuration, simulated ranks (``benchmarks.wire``) in two sender
processes stream steps into

* the real collector daemon (``rlpulse.collector.launch.start_collector``, jsonl sink): values/s from
  the first ``log()`` (message sent) to the last step's line in the jsonl file; and
* the floor: the same bytes into a bare ZeroMQ PULL socket that msgpack-decodes each message.

The two are interleaved (floor, collector, collector, floor, ...). Senders keep a bounded
window of steps in flight, as a training job does (its ranks cannot run ahead of their own
steps), so memory measured is what the collector holds, not a backlog in ZeroMQ queues. The
collector's CPU is read from its process (``psutil`` ``cpu_times``) and its RSS sampled every
50 ms. A last run streams many steps at a fixed shape to show memory does not grow with run
length.
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing as mp
import subprocess
import threading
import time
from pathlib import Path
from tempfile import mkdtemp
from typing import Any

import msgpack
import psutil
import zmq

from benchmarks import wire
from benchmarks.common import CpuSteal, JsonlTail, load_snapshot, median, write_json
from rlpulse.collector.launch import start_collector

SPAWN = mp.get_context("spawn")
SENDERS = 2
ROLE = "actor_train"


def _sender(
    address: str,
    pattern: int,
    ranks: list[tuple[int, int]],
    run: str,
    world_size: int,
    n_metrics: int,
    steps: int,
    window: int,
    progress: Any,
    ready: Any,
    go: Any,
    first_send: Any,
) -> None:
    """One sender process: registers its ranks, then streams steps when ``go`` is set."""
    ctx = zmq.Context()
    sock = ctx.socket(pattern)
    sock.setsockopt(zmq.SNDHWM, 0)  # the step window bounds what is queued
    sock.setsockopt(zmq.LINGER, 5000)
    sock.connect(address)
    sims = [wire.SimRank(pid, rank) for pid, rank in ranks]
    shape = wire.Shape(wire.metric_names(n_metrics))  # before the hellos: they declare its table
    for sim in sims:
        sock.send(sim.hello(run, ROLE, world_size, shape))
    ready.set()
    go.wait()
    send = sock.send
    for step in range(steps):
        while progress.value + window <= step:  # steps emitted so far + window
            time.sleep(0.0002)
        t = time.time()
        if step == 0:
            first_send.value = t
        for sim in sims:
            send(sim.metrics(shape, step, t))  # the step's done is folded in
    # Close only once everything is through: a closing socket's linger would drop the tail.
    deadline = time.monotonic() + 300
    while progress.value < steps and time.monotonic() < deadline:
        time.sleep(0.005)
    for sim in sims:
        sock.send(sim.bye())
    sock.close()
    ctx.term()


def _floor(
    ready_file: str, expect: int, hellos: int, per_step: int, progress: Any, out: Any
) -> None:
    """The floor: bind a PULL socket, msgpack-decode every message, nothing else.

    ``out`` receives (end wall time, CPU seconds from the first message after the hellos to
    the last, peak RSS bytes)."""
    ctx = zmq.Context()
    sock = ctx.socket(zmq.PULL)
    sock.setsockopt(zmq.RCVHWM, 0)
    sock.bind("tcp://127.0.0.1:*")
    Path(ready_file).write_text(sock.getsockopt_string(zmq.LAST_ENDPOINT))
    recv, unpackb = sock.recv, msgpack.unpackb
    cpu0 = 0.0
    steps_seen = 0
    for count in range(1, expect + 1):
        unpackb(recv(), raw=False)
        if count == hellos:
            cpu0 = time.process_time()
        done = (count - hellos) // per_step if count > hellos else 0
        if done != steps_seen:
            steps_seen = done
            progress.value = done
    out[0] = time.time()
    out[1] = time.process_time() - cpu0
    out[2] = float(psutil.Process().memory_info().rss)
    sock.close(linger=0)
    ctx.term()


class _Senders:
    """The sender processes of one run; they read ``progress`` (steps emitted so far)."""

    def __init__(
        self,
        address: str,
        pattern: int,
        run: str,
        ranks: int,
        metrics: int,
        steps: int,
        progress: Any,
    ) -> None:
        self.go = SPAWN.Event()
        self.firsts = [SPAWN.RawValue("d", 0.0) for _ in range(SENDERS)]
        readies = [SPAWN.Event() for _ in range(SENDERS)]
        sims = wire.sim_ranks(range(ranks), seed=len(run) * 7919 + ranks)
        window = _window(ranks, metrics)
        self.procs = [
            SPAWN.Process(
                target=_sender,
                args=(
                    address,
                    pattern,
                    [(s.producer, s.rank) for s in sims[i::SENDERS]],
                    run,
                    ranks,
                    metrics,
                    steps,
                    window,
                    progress,
                    readies[i],
                    self.go,
                    self.firsts[i],
                ),
                daemon=True,
            )
            for i in range(SENDERS)
        ]
        for p in self.procs:
            p.start()
        for ev in readies:
            if not ev.wait(60):
                raise RuntimeError("a sender process did not start")

    def start(self) -> None:
        self.go.set()

    def first_send(self) -> float:
        return min(v.value for v in self.firsts if v.value > 0)

    def join(self) -> None:
        for p in self.procs:
            p.join(60)
            if p.exitcode is None:
                p.kill()
                p.join()


def _window(ranks: int, metrics: int) -> int:
    """Steps in flight: about 300k values, at least 2 steps, at most 48 (below the
    collector's ``max_open_steps`` of 64, beyond which it would emit steps partial)."""
    return max(2, min(48, math.ceil(300_000 / (ranks * metrics))))


def _steps(ranks: int, metrics: int, target_values: float) -> int:
    return max(6, min(2000, math.ceil(target_values / (ranks * metrics))))


def run_floor(ranks: int, metrics: int, steps: int) -> dict[str, Any]:
    """Same bytes, same window, into a bare PULL socket with a msgpack decode."""
    ready = Path(mkdtemp(prefix="rlpulse-floor-")) / "ready"
    progress = SPAWN.RawValue("q", 0)
    out = SPAWN.RawArray("d", 3)
    per_step = ranks  # one metrics message per rank per step (hellos first, byes after)
    expect = ranks + per_step * steps  # registrations come first
    proc = SPAWN.Process(target=_floor, args=(str(ready), expect, ranks, per_step, progress, out))
    proc.start()
    while not ready.exists() or not ready.read_text():
        time.sleep(0.01)
    senders = _Senders(ready.read_text(), zmq.PUSH, "floor", ranks, metrics, steps, progress)
    time.sleep(0.2)
    senders.start()
    proc.join(180)
    senders.join()
    elapsed = out[0] - senders.first_send()
    return _result("floor", ranks, metrics, steps, elapsed, out[1], out[2])


def _result(
    kind: str, ranks: int, metrics: int, steps: int, elapsed: float, cpu: float, rss: float
) -> dict[str, Any]:
    values = ranks * metrics * steps
    return {
        "kind": kind,
        "ranks": ranks,
        "metrics": metrics,
        "steps": steps,
        "values": values,
        "seconds": elapsed,
        "values_per_s": values / elapsed,
        "cpu_s": cpu,
        "cpu_us_per_value": cpu / values * 1e6,
        "cpu_share": cpu / elapsed,
        "peak_rss_mb": rss / 2**20,
    }


class _Watch(threading.Thread):
    """Tails the jsonl sink (publishing steps emitted to the senders) and samples the
    collector's RSS; stops once ``last_step`` is in the file."""

    def __init__(self, path: Path, pid: int, progress: Any, last_step: int) -> None:
        super().__init__(daemon=True)
        self.tail = JsonlTail(path)
        self.proc = psutil.Process(pid)
        self.progress = progress
        self.last_step = last_step
        self.t_end = math.nan
        self.peak_rss = 0
        self.rss_trace: list[tuple[int, float]] = []  # (steps emitted, RSS bytes)
        self.emitted = 0
        self.stop = threading.Event()

    def run(self) -> None:
        next_rss = 0.0
        while not self.stop.is_set():
            steps = self.tail.poll()
            if steps:
                self.emitted += len(steps)
                self.progress.value = self.emitted
                if self.last_step in steps:
                    self.t_end = time.time()
                    break
            now = time.monotonic()
            if now >= next_rss:
                rss = self.proc.memory_info().rss
                self.peak_rss = max(self.peak_rss, rss)
                self.rss_trace.append((self.emitted, rss))
                next_rss = now + 0.05
            time.sleep(0.0005)
        rss = self.proc.memory_info().rss
        self.peak_rss = max(self.peak_rss, rss)
        self.rss_trace.append((self.emitted, rss))
        self.tail.close()


def run_collector(ranks: int, metrics: int, steps: int, trace: bool = False) -> dict[str, Any]:
    """The real daemon with a jsonl sink: first send to the last step in the file."""
    work = Path(mkdtemp(prefix="rlpulse-ingest-"))
    out = work / "out.jsonl"
    config = {
        "track_with": ["jsonl"],
        "tracker_kwargs": {"jsonl": {"path": str(out)}},
        "grace_s": 60,
        "settle_s": 0,  # every simulated rank registers before the first step
        "liveness_s": 60,
        "log_level": "WARNING",
    }
    log = (work / "collector.log").open("w")
    collector = start_collector(config, stdout=subprocess.DEVNULL, stderr=log)
    try:
        progress = SPAWN.RawValue("q", 0)
        run = f"ingest-{ranks}x{metrics}"
        senders = _Senders(collector.address, zmq.DEALER, run, ranks, metrics, steps, progress)
        time.sleep(0.3)  # registrations handled before the clock starts
        proc = psutil.Process(collector.proc.pid)
        rss0 = proc.memory_info().rss
        watch = _Watch(out, collector.proc.pid, progress, steps - 1)
        cpu0 = sum(proc.cpu_times()[:2])
        watch.start()
        senders.start()
        watch.join(180)
        cpu = sum(proc.cpu_times()[:2]) - cpu0
        watch.stop.set()
        senders.join()
        elapsed = watch.t_end - senders.first_send()
    finally:
        collector.stop()
        log.close()
    check = _check(out, ranks, steps)
    res = _result("collector", ranks, metrics, steps, elapsed, cpu, watch.peak_rss)
    res.update(check)
    res["idle_rss_mb"] = rss0 / 2**20
    if trace:
        res["rss_trace"] = [(s, r / 2**20) for s, r in watch.rss_trace]
    return res


def _check(path: Path, ranks: int, steps: int) -> dict[str, Any]:
    """Every step once, complete, with every rank: or say what was wrong."""
    got, partial, short = [], 0, 0
    with path.open() as f:
        for line in f:
            rec = json.loads(line)
            got.append(rec["step"])
            partial += bool(rec["partial"])
            short += rec["ranks"] != ranks
    return {
        "valid": got == list(range(steps)) and partial == 0 and short == 0,
        "steps_in_sink": len(got),
        "partial_steps": partial,
    }


CONFIGS = [(r, m) for m in (60, 500) for r in (16, 64, 256, 1024)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--target-values", type=float, default=1e6, help="values per run")
    parser.add_argument("--reps", type=int, default=2, help="runs of each contender per config")
    parser.add_argument("--long-steps", type=int, default=1500, help="steps of the run-length test")
    parser.add_argument("--configs", default="", help="e.g. 16x60,1024x500 (default: all)")
    parser.add_argument("--out", default="ingest")
    args = parser.parse_args()
    wire.self_check()
    configs = CONFIGS
    if args.configs:
        configs = [tuple(int(x) for x in c.split("x")) for c in args.configs.split(",")]
    steal = CpuSteal()
    load0 = load_snapshot()
    runs: list[dict[str, Any]] = []
    for ranks, metrics in configs:
        steps = _steps(ranks, metrics, args.target_values)
        order = ["floor", "collector", "collector", "floor"] * args.reps
        for kind in order[: 2 * args.reps]:
            res = (
                run_floor(ranks, metrics, steps)
                if kind == "floor"
                else run_collector(ranks, metrics, steps)
            )
            runs.append(res)
            print(
                f"{kind:9s} {ranks:5d} ranks x {metrics:3d} metrics x {steps:4d} steps: "
                f"{res['values_per_s'] / 1e6:6.2f} M values/s, CPU {res['cpu_us_per_value']:.3f} us/value, "
                f"RSS {res['peak_rss_mb']:.0f} MB"
                + ("" if res.get("valid", True) else "  INVALID"),
                flush=True,
            )
    long_run = run_collector(16, 60, args.long_steps, trace=True)
    print(
        f"run length: 16 x 60 x {args.long_steps} steps, RSS {long_run['rss_trace'][0][1]:.0f} -> "
        f"{long_run['rss_trace'][-1][1]:.0f} MB",
        flush=True,
    )
    summary = []
    for ranks, metrics in configs:
        mine = [r for r in runs if r["ranks"] == ranks and r["metrics"] == metrics]
        col = [r for r in mine if r["kind"] == "collector"]
        flo = [r for r in mine if r["kind"] == "floor"]
        summary.append(
            {
                "ranks": ranks,
                "metrics": metrics,
                "steps": col[0]["steps"],
                "collector_values_per_s": median([r["values_per_s"] for r in col]),
                "floor_values_per_s": median([r["values_per_s"] for r in flo]),
                "collector_cpu_us_per_value": median([r["cpu_us_per_value"] for r in col]),
                "floor_cpu_us_per_value": median([r["cpu_us_per_value"] for r in flo]),
                "collector_cpu_share": median([r["cpu_share"] for r in col]),
                "collector_peak_rss_mb": max(r["peak_rss_mb"] for r in col),
                "collector_idle_rss_mb": median([r["idle_rss_mb"] for r in col]),
                "floor_peak_rss_mb": max(r["peak_rss_mb"] for r in flo),
                "valid": all(r["valid"] for r in col),
            }
        )
    write_json(
        args.out,
        {
            "runs": runs,
            "summary": summary,
            "long_run": long_run,
            "load_start": load0,
            "load_end": load_snapshot(),
            "cpu": steal.since_start(),
            "senders": SENDERS,
        },
    )


if __name__ == "__main__":
    main()
