"""Scale out (issue 13 item 4): one collector against 2 and 4 relays under a root.

The same simulated ranks (``benchmarks.wire``), from the same four sender processes, stream
into either one collector or relays (rank ``i`` to relay ``i % relays``) whose root writes the
jsonl. Three measurements per topology:

* **throughput**: senders keep a window of steps in flight (as in ``benchmarks.ingest``);
  values/s from the first send to the last step in the root's jsonl, and CPU per value of
  every collector process together, of the root alone and of the busiest one;
* **latency**: steps paced every ``--interval`` s; per step, from the last rank's send to the
  step's line in the root's jsonl (p50, p99);
* **paper estimate**: what 10k and 100k ranks would need, from the CPU each tier spent per
  message and per value in this run (one process is one core at most).

All of it runs on this machine, so relays and root share its cores with the senders: more
processes cannot add cores here; what the run shows is what each tier costs.
"""

from __future__ import annotations

import argparse
import math
import multiprocessing as mp
import subprocess
import time
from pathlib import Path
from tempfile import mkdtemp
from typing import Any

import numpy as np
import psutil
import zmq

from benchmarks import wire
from benchmarks.common import CpuSteal, JsonlTail, load_snapshot, median, write_json
from benchmarks.ingest import ROLE, _check, _sender, _steps, _window
from rlpulse.collector.launch import CollectorProcess, start_collector

SPAWN = mp.get_context("spawn")
SENDERS = 4
TOPOLOGIES = (0, 2, 4)
"""Relays under the root; 0 is one collector."""
COMMON = {"grace_s": 60, "settle_s": 0, "liveness_s": 60, "log_level": "WARNING"}


class Tier:
    """One topology's collectors: the one that writes the jsonl, and its relays if any."""

    def __init__(self, relays: int) -> None:
        self.work = Path(mkdtemp(prefix="rlpulse-tiers-"))
        self.out = self.work / "root.jsonl"
        self.log = (self.work / "collectors.log").open("w")
        root = {"track_with": ["jsonl"], "tracker_kwargs": {"jsonl": {"path": str(self.out)}}}
        self.root = self._start({**COMMON, **root})
        self.relays = [
            self._start({**COMMON, "upstream": self.root.address}) for _ in range(relays)
        ]
        self.entry = [r.address for r in self.relays] or [self.root.address]

    def _start(self, config: dict[str, Any]) -> CollectorProcess:
        return start_collector(config, stdout=subprocess.DEVNULL, stderr=self.log)

    def processes(self) -> list[psutil.Process]:
        return [psutil.Process(c.proc.pid) for c in [self.root, *self.relays]]

    def stop(self) -> None:
        for c in [*self.relays, self.root]:
            c.stop()
        self.log.close()


def _cpu(procs: list[psutil.Process]) -> list[float]:
    return [sum(p.cpu_times()[:2]) for p in procs]


def _launch(
    target: Any, tier: Tier, ranks: int, run: str, extra: tuple, progress: list, seed: int
) -> tuple[list, Any, list]:
    """The sender processes, rank ``i`` to the tier's entry ``i % len(entry)``; sender ``i``
    reports through ``progress[i]``."""
    sims = wire.sim_ranks(range(ranks), seed=seed)
    go = SPAWN.Event()
    readies = [SPAWN.Event() for _ in range(SENDERS)]
    firsts = [SPAWN.RawValue("d", 0.0) for _ in range(SENDERS)]
    procs = []
    for i in range(SENDERS):
        mine = [(s.producer, s.rank) for s in sims if s.rank % SENDERS == i]
        address = tier.entry[i % len(tier.entry)]
        args = (
            address,
            zmq.DEALER,
            mine,
            run,
            ranks,
            *extra,
            progress[i],
            readies[i],
            go,
            firsts[i],
        )
        procs.append(SPAWN.Process(target=target, args=args, daemon=True))
    for p in procs:
        p.start()
    for ev in readies:
        if not ev.wait(60):
            raise RuntimeError("a sender process did not start")
    return procs, go, firsts


def _join(procs: list) -> None:
    for p in procs:
        p.join(60)
        if p.exitcode is None:
            p.kill()
            p.join()


def throughput(relays: int, ranks: int, metrics: int, steps: int) -> dict[str, Any]:
    tier = Tier(relays)
    try:
        progress = SPAWN.RawValue("q", 0)
        run = f"tiers-{relays}-{ranks}x{metrics}"
        extra = (metrics, steps, _window(ranks, metrics))
        seed = ranks * 31 + len(run)
        procs, go, firsts = _launch(_sender, tier, ranks, run, extra, [progress] * SENDERS, seed)
        time.sleep(0.5)  # registrations (and the relays' announcements) before the clock
        watched = tier.processes()
        cpu0 = _cpu(watched)
        tail = JsonlTail(tier.out)
        go.set()
        t_end, deadline = math.nan, time.monotonic() + 300
        while time.monotonic() < deadline:
            seen = tail.poll()
            if seen:
                progress.value = tail.lines
                if steps - 1 in seen:
                    t_end = time.time()
                    break
            time.sleep(0.0005)
        cpu = [b - a for a, b in zip(cpu0, _cpu(watched), strict=True)]
        tail.close()
        _join(procs)
        elapsed = t_end - min(v.value for v in firsts if v.value > 0)
    finally:
        tier.stop()
    values = ranks * metrics * steps
    return {
        "relays": relays,
        "ranks": ranks,
        "metrics": metrics,
        "steps": steps,
        "values": values,
        "messages": ranks * steps,
        "seconds": elapsed,
        "values_per_s": values / elapsed,
        "cpu_s": cpu,  # root first, then each relay
        "cpu_us_per_value": sum(cpu) / values * 1e6,
        "root_cpu_us_per_value": cpu[0] / values * 1e6,
        "busiest_cpu_share": max(cpu) / elapsed,
        **_check(tier.out, ranks, steps),
    }


def _paced(
    address: str,
    pattern: int,
    ranks: list[tuple[int, int]],
    run: str,
    world_size: int,
    n_metrics: int,
    steps: int,
    interval: float,
    sent: Any,
    ready: Any,
    go: Any,
    first_send: Any,
) -> None:
    """A sender that sends a step every ``interval`` s and records when each step's last
    message left (``sent[step]``)."""
    ctx = zmq.Context()
    sock = ctx.socket(pattern)
    sock.setsockopt(zmq.LINGER, 5000)
    sock.connect(address)
    sims = [wire.SimRank(pid, rank) for pid, rank in ranks]
    shape = wire.Shape(wire.metric_names(n_metrics))
    for sim in sims:
        sock.send(sim.hello(run, ROLE, world_size, shape))
    ready.set()
    go.wait()
    t0 = time.monotonic() + 0.1
    first_send.value = time.time()
    for step in range(steps):
        time.sleep(max(0.0, t0 + step * interval - time.monotonic()))
        t = time.time()
        for sim in sims:
            sock.send(sim.metrics(shape, step, t))
        sent[step] = time.time()
    time.sleep(1.0)
    for sim in sims:
        sock.send(sim.bye())
    sock.close()
    ctx.term()


def latency(relays: int, ranks: int, metrics: int, steps: int, interval: float) -> dict[str, Any]:
    tier = Tier(relays)
    try:
        sents = [SPAWN.RawArray("d", steps) for _ in range(SENDERS)]
        run = f"paced-{len(tier.relays)}-{ranks}"
        extra = (metrics, steps, interval)
        procs, go, _ = _launch(_paced, tier, ranks, run, extra, sents, seed=ranks * 37)
        time.sleep(0.5)
        tail = JsonlTail(tier.out)
        seen_at: dict[int, float] = {}
        go.set()
        deadline = time.monotonic() + steps * interval + 60
        while len(seen_at) < steps and time.monotonic() < deadline:
            now = time.time()
            for step in tail.poll():
                seen_at[step] = now
            time.sleep(0.0005)
        tail.close()
        _join(procs)
    finally:
        tier.stop()
    lat = [seen_at[s] - max(a[s] for a in sents) for s in sorted(seen_at) if s >= 2]
    return {
        "relays": relays,
        "ranks": ranks,
        "metrics": metrics,
        "steps": steps,
        "interval_s": interval,
        "latency_ms": [x * 1e3 for x in lat],
        "p50_ms": float(np.percentile(lat, 50)) * 1e3 if lat else math.nan,
        "p99_ms": float(np.percentile(lat, 99)) * 1e3 if lat else math.nan,
        **_check(tier.out, ranks, steps),
    }


def fit_costs(runs: list[dict[str, Any]]) -> dict[str, float]:
    """CPU µs per message and per value of one collector and of a relay (cpu = a x messages +
    b x values), and of the root (a x deltas + b x values written), by least squares over the
    throughput runs."""

    def fit(rows: list[tuple[float, float, float]]) -> tuple[float, float]:
        a = np.array([[m, v] for m, v, _ in rows])
        y = np.array([c for _, _, c in rows])
        (per_msg, per_value), *_ = np.linalg.lstsq(a, y, rcond=None)
        return max(per_msg, 0.0) * 1e6, max(per_value, 0.0) * 1e6

    single = [(r["messages"], r["values"], r["cpu_s"][0]) for r in runs if r["relays"] == 0]
    relay = [
        (r["messages"] / r["relays"], r["values"] / r["relays"], c)
        for r in runs
        if r["relays"]
        for c in r["cpu_s"][1:]
    ]
    # The root applies one delta per relay per step and writes each step once: its cost is
    # per delta and per value written, whatever the ranks behind the relays.
    root = [
        (r["relays"] * r["steps"], r["steps"] * r["metrics"], r["cpu_s"][0])
        for r in runs
        if r["relays"]
    ]
    out = {}
    for name, rows in (("single", single), ("relay", relay), ("root", root)):
        if len(rows) >= 2:
            out[f"{name}_us_per_message"], out[f"{name}_us_per_value"] = fit(rows)
    return out


def estimate(costs: dict[str, float], ranks: int, metrics: int, step_s: float) -> dict[str, Any]:
    """Cores one collector would need, and relays (at most ``HEADROOM`` of a core each) and
    the root's load for a job of ``ranks`` x ``metrics`` with a ``step_s`` step."""
    msgs, values = ranks / step_s, ranks * metrics / step_s

    def load(kind: str, m: float, v: float) -> float:
        return (m * costs[f"{kind}_us_per_message"] + v * costs[f"{kind}_us_per_value"]) / 1e6

    single = load("single", msgs, values)
    relays = 0 if single <= HEADROOM else math.ceil(load("relay", msgs, values) / HEADROOM)
    behind = max(relays, 1)
    kind = "relay" if relays else "single"
    return {
        "ranks": ranks,
        "metrics": metrics,
        "step_s": step_s,
        "single_cores": single,
        "relays": relays,
        "relay_cores": load("relay", msgs / behind, values / behind) if relays else 0.0,
        "root_cores": load("root", relays / step_s, metrics / step_s) if relays else single,
        # every rank ends a step at about the same moment: the busiest tier works through
        # one step's messages in this long (a step's worth of load, all at once)
        "burst_s": load(kind, ranks / behind, ranks * metrics / behind),
    }


HEADROOM = 0.5
"""The share of a core a relay is planned to use (room for bursts: every rank ends a step at
about the same moment)."""
ESTIMATES = [(10_000, 60, 10.0), (10_000, 500, 2.0), (100_000, 60, 10.0), (100_000, 500, 2.0)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--shapes", default="256x60,1024x60,256x500")
    parser.add_argument("--target-values", type=float, default=1.5e6)
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--latency-ranks", type=int, default=256)
    parser.add_argument("--latency-steps", type=int, default=40)
    parser.add_argument("--interval", type=float, default=0.25)
    parser.add_argument("--out", default="tiers")
    args = parser.parse_args()
    wire.self_check()
    shapes = [tuple(int(x) for x in s.split("x")) for s in args.shapes.split(",")]
    steal, load0 = CpuSteal(), load_snapshot()
    runs = []
    for ranks, metrics in shapes:
        steps = _steps(ranks, metrics, args.target_values)
        for _ in range(args.reps):
            for relays in TOPOLOGIES:
                res = throughput(relays, ranks, metrics, steps)
                runs.append(res)
                print(
                    f"{relays} relays {ranks:5d} x {metrics:3d} x {steps:4d}: "
                    f"{res['values_per_s'] / 1e6:5.2f} M values/s, CPU {res['cpu_us_per_value']:.3f} "
                    f"us/value (root {res['root_cpu_us_per_value']:.3f})"
                    + ("" if res["valid"] else "  INVALID"),
                    flush=True,
                )
    lat = []
    for relays in TOPOLOGIES:
        res = latency(relays, args.latency_ranks, 60, args.latency_steps, args.interval)
        lat.append(res)
        print(
            f"{relays} relays latency {args.latency_ranks} ranks: p50 {res['p50_ms']:.1f} ms, "
            f"p99 {res['p99_ms']:.1f} ms" + ("" if res["valid"] else "  INVALID"),
            flush=True,
        )
    summary = []
    for ranks, metrics in shapes:
        for relays in TOPOLOGIES:
            mine = [
                r
                for r in runs
                if (r["relays"], r["ranks"], r["metrics"]) == (relays, ranks, metrics)
            ]
            summary.append(
                {
                    "relays": relays,
                    "ranks": ranks,
                    "metrics": metrics,
                    "values_per_s": median([r["values_per_s"] for r in mine]),
                    "cpu_us_per_value": median([r["cpu_us_per_value"] for r in mine]),
                    "root_cpu_us_per_value": median([r["root_cpu_us_per_value"] for r in mine]),
                    "busiest_cpu_share": median([r["busiest_cpu_share"] for r in mine]),
                    "valid": all(r["valid"] for r in mine),
                }
            )
    costs = fit_costs(runs)
    estimates = [estimate(costs, *e) for e in ESTIMATES] if len(costs) == 6 else []
    write_json(
        args.out,
        {
            "runs": runs,
            "summary": summary,
            "latency": lat,
            "costs": costs,
            "estimates": estimates,
            "headroom": HEADROOM,
            "senders": SENDERS,
            "load_start": load0,
            "load_end": load_snapshot(),
            "cpu": steal.since_start(),
        },
    )


if __name__ == "__main__":
    main()
