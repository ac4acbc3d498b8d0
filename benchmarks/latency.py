"""Latency (issue item 3): the last rank's ``log()`` of a step to the step being visible.

A real collector daemon runs with a jsonl sink and a Prometheus sink. For each step, R-1
simulated ranks (``benchmarks.wire``, one DEALER socket) send their metrics and ``done`` for
the step; then the last rank, a real :class:`rlpulse.producer.Producer`, calls ``log()`` and
``step_done()`` as the trainer's workers do, and the clock starts at that ``log()``. All ranks
finish together, the worst case: the collector still has the other ranks' messages to work
through when the last one arrives. The benchmark then watches the jsonl file (every 0.25 ms)
until the step shows, and waits 20 ms before the next step.

Each rank count runs twice. In the first pass nothing scrapes ``/metrics`` (the Prometheus sink
still takes every step), as between a real Prometheus' scrapes (15 s apart by default): that
pass gives the jsonl figures. The second pass also scrapes ``/metrics`` every 2 ms until the
step shows there (so /metrics figures carry up to ~2 ms of polling granularity): 500 scrapes a
second load the collector far beyond any real Prometheus, so its jsonl figures are reported
apart, and the CPU one scrape costs the collector is measured on its own at the end.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import subprocess
import time
import urllib.request
from pathlib import Path
from tempfile import mkdtemp
from typing import Any

import zmq

from benchmarks import wire
from benchmarks.common import JsonlTail, free_port, load_snapshot, summarize, write_json
from rlpulse.collector.launch import start_collector
from rlpulse.producer import Producer

ROLE = "actor_train"
METRICS = 60
SCRAPE_EVERY_S = 0.002
TIMEOUT_S = 5.0


def _scrape_step(url: str, run: str) -> int:
    """The run's latest step on /metrics, or -1."""
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            text = resp.read().decode()
    except OSError:
        return -1
    m = re.search(r'^rlpulse_run_step\{run="' + re.escape(run) + r'"\} (\S+)$', text, re.M)
    return int(float(m.group(1))) if m else -1


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def scrape_cost(url: str, pid: int, n: int = 200) -> dict[str, float]:
    """What one /metrics scrape costs the (otherwise idle) collector: CPU ms and body size."""
    with urllib.request.urlopen(url, timeout=2) as resp:
        body = resp.read()
    c0, t0 = _cpu_s(pid), time.perf_counter()
    for _ in range(n):
        with urllib.request.urlopen(url, timeout=2) as resp:
            resp.read()
    wall, cpu = time.perf_counter() - t0, _cpu_s(pid) - c0
    return {"cpu_ms": cpu / n * 1e3, "wall_ms": wall / n * 1e3, "lines": body.count(b"\n")}


def measure(
    ranks: int, steps: int, warmup: int, with_prometheus: bool, scrape: bool
) -> dict[str, Any]:
    work = Path(mkdtemp(prefix="rlpulse-latency-"))
    out = work / "out.jsonl"
    port = free_port()
    trackers = ["jsonl", *(["prometheus"] if with_prometheus else [])]
    kwargs: dict[str, Any] = {"jsonl": {"path": str(out)}}
    if with_prometheus:
        kwargs["prometheus"] = {"port": port}
    config = {
        "track_with": trackers,
        "tracker_kwargs": kwargs,
        "grace_s": 60,
        "settle_s": 0,  # every simulated rank registers before the first step
        "liveness_s": 60,
        "log_level": "WARNING",
    }
    log = (work / "collector.log").open("w")
    collector = start_collector(config, stdout=subprocess.DEVNULL, stderr=log)
    url = f"http://127.0.0.1:{port}/metrics"
    run = f"latency-{ranks}"
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(collector.address)
    sims = wire.sim_ranks(range(ranks - 1), seed=ranks)
    shape = wire.Shape(wire.metric_names(METRICS))
    names = shape.names
    producer = Producer(collector.address, run=run, role=ROLE, rank=ranks - 1, world_size=ranks)
    jsonl_ms: list[float] = []
    prom_ms: list[float] = []
    tail = JsonlTail(out)
    try:
        for sim in sims:
            sock.send(sim.hello(run, ROLE, ranks, shape))
        time.sleep(0.5)
        for step in range(steps):
            t = time.time()
            for sim in sims:
                sock.send(sim.metrics(shape, step, t))  # the step's done is folded in
            data = {name: float(step + i) for i, name in enumerate(names)}
            t0 = time.perf_counter()
            producer.log(data, step=step)
            producer.step_done(step)
            seen_jsonl = math.nan
            seen_prom = math.nan if scrape else 0.0
            next_scrape = t0
            deadline = t0 + TIMEOUT_S
            while math.isnan(seen_jsonl) or math.isnan(seen_prom):
                now = time.perf_counter()
                if math.isnan(seen_jsonl) and step in tail.poll():
                    seen_jsonl = now
                if math.isnan(seen_prom) and now >= next_scrape:
                    if _scrape_step(url, run) >= step:
                        seen_prom = time.perf_counter()
                    next_scrape = now + SCRAPE_EVERY_S
                if now > deadline:
                    break
                time.sleep(0.00025)
            if step >= warmup:
                jsonl_ms.append((seen_jsonl - t0) * 1e3)
                if scrape:
                    prom_ms.append((seen_prom - t0) * 1e3)
            time.sleep(0.02)
        cost = scrape_cost(url, collector.proc.pid) if scrape else None
    finally:
        producer.close()
        sock.close()
        ctx.term()
        tail.close()
        collector.stop()
        log.close()
    missed = sum(math.isnan(x) for x in jsonl_ms + prom_ms)
    return {
        "ranks": ranks,
        "metrics": METRICS,
        "steps": len(jsonl_ms),
        "jsonl_ms": summarize([x for x in jsonl_ms if not math.isnan(x)]),
        "prometheus_ms": summarize([x for x in prom_ms if not math.isnan(x)]) if scrape else None,
        "scrape": cost,
        "missed": missed,
        "jsonl_samples": jsonl_ms,
        "prometheus_samples": prom_ms,
    }


def prometheus_available() -> str | None:
    """None when the Prometheus sink can be used, else why not."""
    try:
        import prometheus_client  # noqa: F401

        from rlpulse.collector.sinks import prometheus  # noqa: F401
    except ImportError as exc:
        return f"collector.sinks.prometheus cannot be imported: {exc}"
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--ranks", default="8,64,256")
    parser.add_argument("--steps", type=int, default=160)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--out", default="latency")
    args = parser.parse_args()
    wire.self_check()
    why_not = prometheus_available()
    load0 = load_snapshot()
    results = []
    prom = why_not is None
    for ranks in (int(r) for r in args.ranks.split(",")):
        res = measure(ranks, args.steps, args.warmup, with_prometheus=prom, scrape=False)
        scraped = (
            measure(ranks, args.steps, args.warmup, with_prometheus=True, scrape=True)
            if prom
            else None
        )
        if scraped is not None:
            res["prometheus_ms"] = scraped["prometheus_ms"]
            res["prometheus_samples"] = scraped["prometheus_samples"]
            res["jsonl_ms_scraped"] = scraped["jsonl_ms"]
            res["scrape"] = scraped["scrape"]
            res["missed"] += scraped["missed"]
        results.append(res)
        j, p = res["jsonl_ms"], res["prometheus_ms"]
        print(
            f"{ranks:4d} ranks: jsonl p50 {j['median']:.1f} ms p99 {j['p99']:.1f} ms"
            + (
                f"; /metrics p50 {p['median']:.1f} ms p99 {p['p99']:.1f} ms (jsonl p50 "
                f"{res['jsonl_ms_scraped']['median']:.1f} ms while scraped); a scrape costs "
                f"{res['scrape']['cpu_ms']:.2f} ms of collector CPU"
                if p
                else ""
            )
            + (f"; {res['missed']} missed" if res["missed"] else ""),
            flush=True,
        )
    write_json(
        args.out,
        {
            "results": results,
            "prometheus_unavailable": why_not,
            "scrape_every_ms": SCRAPE_EVERY_S * 1e3,
            "load_start": load0,
            "load_end": load_snapshot(),
        },
    )


if __name__ == "__main__":
    main()
