"""Against RL-Insight (issue 16, item 4): the caller cost of reporting one 60-scalar step, and
what each system does with two ranks' values for the same names.

RL-Insight 0.3.0 (``pip install rl-insight``, verl's ``rl_insight`` logger backend) turns every
metric into one fire-and-forget Ray actor call to a hub actor, named per Ray job, which keeps a
``prometheus_client`` gauge per name and label set and serves ``/metrics``. verl 0.9.1's
``RLInsightLogger.log(data, step)`` calls ``rl_insight.metric_gauge(key.replace("/", "_"),
float(value))`` once per key; this benchmark reports through exactly those calls (the package's
public ``init``, ``metric_gauge`` and ``finish``). Only its own bookkeeping reaches further: the
hub's ``get_status`` (a method of the hub's interface, on the handle from the package's
``get_or_create_monitor_hub``) to wait for the hub and count what it applied.

Everything runs on one local Ray (loopback only; ``benchmarks.run`` adds a network namespace),
next to RL-Insight's own server (``rl-insight server start``, with Prometheus, Tempo and Grafana
disabled: they are binaries it would download) and an rlpulse collector (``start_collector``,
jsonl sink).

**Caller cost.** In this process: rlpulse ``Producer.log(data, step)``, RL-Insight's 60
``metric_gauge`` calls, and an empty call. Contenders take turns in blocks of 50 steps, in a
shuffled order every round; each call is timed alone and followed by 1 ms of "training" (a
sleep). After each block the receiver is drained and the wait timed: rlpulse ``flush()`` (until
the collector acknowledged), RL-Insight one ``get_status`` call on the hub (Ray runs one caller's
calls to an actor in order, so it returns once the block's events are applied). CPU per step is
read for this process (every thread: the producer's sender, Ray's core worker) and for the
receiving process (the collector; the hub's Ray worker).

**Two ranks.** Two Ray actors log the same three metric families at the same step, with
different sample counts. rlpulse gets the samples (the producer reduces them to sum, count,
min and max); RL-Insight gets what a verl worker would send, each rank's own mean, max and min
as gauges, once as verl does (no rank label) and once more with a ``rank`` label. Read back:
the collector's jsonl record, and the hub's ``/metrics``; compared with numpy over both ranks.

    python -m benchmarks.rl_insight [--rounds 20]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import numpy as np
import psutil

from benchmarks.common import RESULTS, free_port, load_snapshot, summarize, write_json
from benchmarks.rl_insight_stack import (
    RlInsightServer,
    gauge_name,
    hub_handle,
    hub_process,
    rl_insight_config,
    scrape,
    skip_reason,
)

ROOT = Path(__file__).resolve().parent.parent
N_SCALARS = 60
BLOCK = 50
PACE_S = 0.001
RANK_SIZES = (64, 1984)
"""Responses per rank at the two-rank step: uneven, as with dynamic batching."""


# ---------------------------------------------------------------------------- caller cost


class Contender:
    """``log(i)`` is the timed call; ``drain()`` waits for the receiver after a block."""

    name = "?"
    receiver: psutil.Process | None = None

    def log(self, i: int) -> None:
        raise NotImplementedError

    def drain(self) -> None:
        pass

    def delivered(self, steps: int) -> str:
        return ""


class Null(Contender):
    name = "null"

    def log(self, i: int) -> None:
        pass


class Rlpulse(Contender):
    name = "rlpulse"

    def __init__(self, payloads: list[dict[str, float]], tmp: Path) -> None:
        from rlpulse.collector.launch import start_collector
        from rlpulse.producer import Producer

        self.payloads = payloads
        self.out = tmp / "caller.jsonl"
        self.collector = start_collector(
            {"track_with": ["jsonl"], "tracker_kwargs": {"jsonl": {"path": str(self.out)}}},
            stdout=subprocess.DEVNULL,
            stderr=(tmp / "collector.log").open("w"),
        )
        self.receiver = psutil.Process(self.collector.proc.pid)
        self.producer = Producer(self.collector.address, run="bench", role="actor_train")

    def log(self, i: int) -> None:
        self.producer.log(self.payloads[i % len(self.payloads)], step=i)

    def drain(self) -> None:
        self.producer.flush(30)

    def close(self) -> None:
        self.producer.close()
        self.collector.stop()

    def delivered(self, steps: int) -> str:
        lines = self.out.read_text().count("\n") if self.out.exists() else 0
        return f"{lines:,} of {steps:,} steps in the jsonl"


class RlInsight(Contender):
    name = "rl_insight"

    def __init__(self, payloads: list[dict[str, float]], config: dict[str, Any]) -> None:
        import ray
        import rl_insight

        self.payloads = payloads
        self.gauge = rl_insight.metric_gauge
        self.ray = ray
        self.hub = hub_handle(config)
        self.drain()  # the hub's constructor has run: its process exists
        self.receiver = hub_process()

    def log(self, i: int) -> None:
        # verl's RLInsightLogger.log: one gauge (one Ray actor call) per key
        gauge = self.gauge
        for key, value in self.payloads[i % len(self.payloads)].items():
            gauge(key.replace("/", "_"), float(value))

    def drain(self) -> None:
        self.ray.get(self.hub.get_status.remote(), timeout=300)

    def delivered(self, steps: int) -> str:
        applied = self.ray.get(self.hub.get_status.remote())["events_applied"]
        return f"{applied:,} of {steps * N_SCALARS:,} gauge events applied by the hub"


def _cpu(proc: psutil.Process | None) -> float:
    if proc is None:
        return float("nan")
    try:
        t = proc.cpu_times()
    except psutil.Error:
        return float("nan")
    return t.user + t.system


def measure_caller(contenders: list[Contender], rounds: int, seed: int) -> dict[str, Any]:
    me = psutil.Process()
    clock, sleep = time.perf_counter_ns, time.sleep
    samples: dict[str, list[float]] = {c.name: [] for c in contenders}
    drains: dict[str, list[float]] = {c.name: [] for c in contenders}
    cpu_caller = dict.fromkeys(samples, 0.0)
    cpu_receiver = dict.fromkeys(samples, 0.0)
    steps = dict.fromkeys(samples, 0)
    for c in contenders:  # warm-up, not recorded
        for _ in range(10):
            c.log(steps[c.name])
            steps[c.name] += 1
            sleep(PACE_S)
        c.drain()
    rng = random.Random(seed)
    for _ in range(rounds):
        order = list(contenders)
        rng.shuffle(order)
        for c in order:
            out, i = samples[c.name], steps[c.name]
            mine0, theirs0 = _cpu(me), _cpu(c.receiver)
            for _ in range(BLOCK):
                t0 = clock()
                c.log(i)
                out.append((clock() - t0) / 1e3)
                i += 1
                sleep(PACE_S)
            t0 = clock()
            c.drain()
            drains[c.name].append((clock() - t0) / 1e6)
            steps[c.name] = i
            cpu_caller[c.name] += _cpu(me) - mine0
            cpu_receiver[c.name] += _cpu(c.receiver) - theirs0
    return {
        c.name: {
            "us": summarize(samples[c.name]),
            "samples": samples[c.name],
            "drain_ms": summarize(drains[c.name]),
            "caller_cpu_us_per_step": cpu_caller[c.name] / len(samples[c.name]) * 1e6,
            "receiver_cpu_us_per_step": cpu_receiver[c.name] / len(samples[c.name]) * 1e6,
            "steps": steps[c.name],
            "delivered": c.delivered(steps[c.name]),
        }
        for c in contenders
    }


# ---------------------------------------------------------------------------- two ranks


def rank_samples(rank: int, seed: int) -> dict[str, np.ndarray]:
    """One rank's per-response samples for three catalog families at the two-rank step."""
    from rlpulse.schemas import metrics as M

    rng = np.random.default_rng([seed, rank])
    n = RANK_SIZES[rank]
    p_solved = (0.9, 0.3)[rank]  # the short batch holds the easy prompts
    return {
        M.CRITIC_SCORE.name: (rng.random(n) < p_solved).astype(np.float64),
        M.RESPONSE_LENGTH.name: np.round(rng.normal((900, 300)[rank], (200, 80)[rank], n)),
        M.CRITIC_ADVANTAGES.name: rng.normal((0.4, -0.1)[rank], 1.0, n),
    }


class RankWorker:
    """One training rank (a Ray actor): reports the same step to both systems."""

    def __init__(
        self, rank: int, collector: str, config: dict[str, Any], seed: int, run: str
    ) -> None:
        import rl_insight

        from rlpulse.producer import Producer

        self.rank, self.seed, self.config = rank, seed, config
        self.rli = rl_insight
        rl_insight.init(project="rlpulse-bench", experiment_name=run, config=config)
        self.producer = Producer(
            collector, run=run, role="actor_train", rank=rank, world_size=len(RANK_SIZES)
        )

    def report(self, step: int) -> None:
        import ray

        data = rank_samples(self.rank, self.seed)
        # rlpulse: the samples; log() reduces them to mergeable states (sum, count, min, max)
        self.producer.log(data, step=step)
        # RL-Insight: what a verl worker sends, its own statistics as gauges
        for name, x in data.items():
            for stat, value in (("mean", x.mean()), ("max", x.max()), ("min", x.min())):
                key = f"{name}/{stat}".replace("/", "_")
                self.rli.metric_gauge(key, float(value))
                self.rli.metric_gauge(f"by_rank_{key}", float(value), rank=str(self.rank))
        self.producer.flush(30)
        ray.get(hub_handle(self.config).get_status.remote(), timeout=120)

    def close(self) -> None:
        self.producer.close()
        self.rli.finish()


def measure_two_ranks(config: dict[str, Any], metrics_port: int, tmp: Path, seed: int) -> dict:
    import ray

    from rlpulse.collector.launch import start_collector
    from rlpulse.schemas import metrics as M
    from rlpulse.schemas.reductions import QUANTILE_STATS

    out = tmp / "two-ranks.jsonl"
    collector = start_collector(
        {"track_with": ["jsonl"], "tracker_kwargs": {"jsonl": {"path": str(out)}}},
        stdout=subprocess.DEVNULL,
        stderr=(tmp / "collector-two-ranks.log").open("w"),
    )
    try:
        actor = ray.remote(num_cpus=0)(RankWorker)
        ranks = [
            actor.remote(r, collector.address, config, seed, "two-ranks")
            for r in range(len(RANK_SIZES))
        ]
        ray.get([w.report.remote(0) for w in ranks], timeout=300)  # both at once
        ray.get([w.close.remote() for w in ranks], timeout=60)
    finally:
        collector.stop()
    record = next(
        r for r in map(json.loads, out.read_text().splitlines()) if r["run"] == "two-ranks"
    )
    gauges = scrape(metrics_port)
    per_rank = [rank_samples(r, seed) for r in range(len(RANK_SIZES))]
    rows = []
    for entry in (M.CRITIC_SCORE, M.RESPONSE_LENGTH, M.CRITIC_ADVANTAGES):
        pooled = np.concatenate([d[entry.name] for d in per_rank])
        for stat, out_name in entry.output_names().items():
            if stat in QUANTILE_STATS:  # a sketch's quantiles: RL-Insight has no such gauge
                continue
            reduce: Callable[[np.ndarray], Any] = getattr(np, stat.value)
            plain = [v for _, v in gauges.get(gauge_name(out_name), [])]
            labelled = {
                lab["rank"]: v for lab, v in gauges.get(gauge_name(out_name, "by_rank_"), [])
            }
            rows.append(
                {
                    "name": out_name,
                    "truth": float(reduce(pooled)),
                    "per_rank": [float(reduce(d[entry.name])) for d in per_rank],
                    "rlpulse": record["metrics"].get(out_name),
                    "rl_insight": plain,
                    "rl_insight_by_rank": [labelled.get(str(r)) for r in range(len(RANK_SIZES))],
                }
            )
    return {"rows": rows, "record_ranks": record["ranks"], "partial": record["partial"]}


# ---------------------------------------------------------------------------- the run


def measure(rounds: int, seed: int) -> dict[str, Any]:
    import ray
    import rl_insight

    tmp = Path(tempfile.mkdtemp(prefix="rlpulse-rl-insight-"))
    rnd = random.Random(seed)
    names = [f"bench/scalar_{i:02d}" for i in range(N_SCALARS)]
    payloads = [{n: rnd.uniform(-1, 1) for n in names} for _ in range(16)]
    server = RlInsightServer(tmp)
    metrics_port = free_port()
    config = rl_insight_config(server, metrics_port)
    setup: dict[str, float] = {}
    with ExitStack() as stack:
        t = time.perf_counter()
        server.start()
        stack.callback(server.stop)
        setup["rl_insight_server_s"] = time.perf_counter() - t
        t = time.perf_counter()
        path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
        ray.init(
            _node_ip_address="127.0.0.1",
            include_dashboard=False,
            num_cpus=2,
            runtime_env={"env_vars": {"RAY_USAGE_STATS_ENABLED": "0", "PYTHONPATH": path}},
        )
        stack.callback(ray.shutdown)
        setup["ray_init_s"] = time.perf_counter() - t
        t = time.perf_counter()
        rl_insight.init(project="rlpulse-bench", experiment_name="caller-cost", config=config)
        stack.callback(rl_insight.finish)
        rli = RlInsight(payloads, config)
        setup["rl_insight_init_s"] = time.perf_counter() - t
        t = time.perf_counter()
        rlp = Rlpulse(payloads, tmp)
        stack.callback(rlp.close)
        setup["rlpulse_collector_s"] = time.perf_counter() - t
        caller = measure_caller([rlp, rli, Null()], rounds, seed)
        rlp.close()  # the collector writes the last step on the producer's goodbye
        for c in (rlp, rli):
            caller[c.name]["delivered"] = c.delivered(caller[c.name]["steps"])
        two = measure_two_ranks(config, metrics_port, tmp, seed)
    return {"caller": caller, "two_ranks": two, "setup_s": setup, "rounds": rounds}


def _fmt(x: float | None) -> str:
    return "—" if x is None else f"{x:.5g}"


def _survivor(row: dict[str, Any]) -> str:
    """Whose value RL-Insight's unlabelled gauge ended with."""
    if len(row["rl_insight"]) != 1:
        return f"{len(row['rl_insight'])} series"
    if len(set(row["per_rank"])) == 1:
        return "both ranks' value"
    for k, v in enumerate(row["per_rank"]):
        if row["rl_insight"][0] == v:
            return f"rank {k}'s"
    return "neither rank's"


def _us(x: float) -> str:
    return f"{x / 1000:,.1f} ms" if x >= 10_000 else f"{x:,.0f} µs" if x >= 100 else f"{x:.1f} µs"


def _ms(x: float) -> str:
    return f"{x:,.0f} ms" if x >= 10 else f"{x:.1f} ms"


def _close(a: float | None, b: float) -> bool:
    return a is not None and abs(a - b) <= 1e-9 * max(1.0, abs(b))


def summary(res: dict[str, Any]) -> dict[str, Any]:
    """The ``markdown``, ``measured`` and ``met`` of the report's section."""
    c, rows = res["caller"], res["two_ranks"]["rows"]
    ours, theirs = c["rlpulse"]["us"]["median"], c["rl_insight"]["us"]["median"]
    exact = sum(_close(r["rlpulse"], r["truth"]) for r in rows)
    survivors = [_survivor(r) for r in rows]
    theirs_right = sum(
        len(r["rl_insight"]) == 1 and _close(r["rl_insight"][0], r["truth"]) for r in rows
    )
    labels = {
        "rlpulse": "rlpulse `Producer.log(data, step)`",
        "rl_insight": f"RL-Insight `metric_gauge` x{N_SCALARS} (verl's `RLInsightLogger.log`)",
        "null": "empty call (the timer)",
    }
    receivers = {"rlpulse": "collector", "rl_insight": "hub actor"}
    md = [
        f"RL-Insight {res['versions']['rl-insight']} as verl uses it (`rl_insight.init`, then one "
        "`metric_gauge(name, value)` per key, each a Ray actor call to its hub) against rlpulse, in one "
        f"process on one local Ray: {res['rounds']} rounds of {BLOCK} steps of {N_SCALARS} scalars, "
        f'contenders interleaved in a shuffled order, {PACE_S * 1e3:.0f} ms of "training" after each call. '
        "Drain: after each block, until the receiver has everything (rlpulse `flush()`; RL-Insight a "
        "`get_status` call on the hub, which runs after the block's events). "
        f"Load average {res['load_start']['load1']:.1f} at start, {res['load_end']['load1']:.1f} at end.",
        "",
        "| contender | caller cost median | p99 | max | caller CPU / step | receiver CPU / step | drain after 50 steps (median) | delivered |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name in ("rlpulse", "rl_insight", "null"):
        r, s = c[name], c[name]["us"]
        receiver = drain = "—"
        if name in receivers:
            receiver = f"{_us(r['receiver_cpu_us_per_step'])} ({receivers[name]})"
            drain = _ms(r["drain_ms"]["median"])
        md.append(
            f"| {labels[name]} | {_us(s['median'])} | {_us(s['p99'])} | {_us(s['max'])} | "
            f"{_us(r['caller_cpu_us_per_step'])} | {receiver} | {drain} | {r['delivered'] or '—'} |"
        )
    md += [
        "",
        f"RL-Insight's median caller cost is **{theirs / ours:.1f}x** rlpulse's. Setup: Ray "
        f"{res['setup_s']['ray_init_s']:.1f} s, RL-Insight server {res['setup_s']['rl_insight_server_s']:.1f} s "
        f"and hub {res['setup_s']['rl_insight_init_s']:.1f} s, rlpulse collector "
        f"{res['setup_s']['rlpulse_collector_s']:.1f} s.",
        "",
        f"**Two ranks, same names, one step.** Rank 0 holds {RANK_SIZES[0]} responses, rank 1 "
        f"{RANK_SIZES[1]:,}; both report at once. rlpulse gets the samples; RL-Insight gets each rank's "
        "own mean, max and min as gauges, as verl would send them (no rank label), and again with a "
        "`rank` label. Read back: the collector's jsonl record and the hub's `/metrics`.",
        "",
        "| metric | numpy over both ranks | rlpulse | RL-Insight, as verl (no rank label) | RL-Insight, `rank` label: rank 0; rank 1 |",
        "|---|---|---|---|---|",
    ]
    for r, who in zip(rows, survivors, strict=True):
        plain = "; ".join(_fmt(v) for v in r["rl_insight"]) or "—"
        md.append(
            f"| `{r['name']}` | {_fmt(r['truth'])} | {_fmt(r['rlpulse'])} | {plain} ({who}) | "
            f"{'; '.join(_fmt(v) for v in r['rl_insight_by_rank'])} |"
        )
    mean = rows[0]  # critic/score/mean
    by_rank = [v for v in mean["rl_insight_by_rank"] if v is not None]
    won = [survivors.count(f"rank {k}'s") for k in range(len(RANK_SIZES))]
    md += [
        "",
        f"rlpulse: {exact} of {len(rows)} values equal numpy's over both ranks (relative 1e-9), from "
        f"{res['two_ranks']['record_ranks']} ranks in one record. RL-Insight keeps one gauge per name "
        "and label set: without a rank label (verl's call), each name holds whichever rank's value "
        "the hub applied last "
        f"(rank 0's for {won[0]} names, rank 1's for {won[1]}, the same on both for the rest), "
        f"so {theirs_right} of "
        f"{len(rows)} equal numpy's, where that rank happened to hold the global value. With a rank "
        "label it keeps both; a reader can take the max of the maxes and the min of the mins, but not "
        "the pooled mean, since gauges carry no counts: the mean of the two ranks' "
        f"`{mean['name']}` is {_fmt(sum(by_rank) / max(1, len(by_rank)))} against "
        f"{_fmt(mean['truth'])}.",
        "",
    ]
    met = ours < theirs and exact == len(rows)
    measured = (
        f"log() median {_us(ours)} vs RL-Insight {_us(theirs)} ({theirs / ours:.1f}x); "
        f"two ranks: rlpulse exact on {exact}/{len(rows)}, RL-Insight (one rank's value per "
        f"name) on {theirs_right}/{len(rows)}"
    )
    return {"markdown": md, "measured": measured, "met": met}


def versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {"python": sys.version.split()[0]}
    for pkg in ("rl-insight", "ray", "prometheus_client", "omegaconf", "pyzmq"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            out[pkg] = "not installed"
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=20, help="blocks of 50 steps per contender")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="rl_insight")
    parser.add_argument("--out-dir", type=Path, default=RESULTS)
    args = parser.parse_args()
    reason = skip_reason()
    if reason:
        write_json(args.out, {"skipped": reason}, args.out_dir)
        print(f"rl_insight: not measured ({reason})", flush=True)
        return
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    load0 = load_snapshot()
    res = measure(args.rounds, args.seed)
    res.update(load_start=load0, load_end=load_snapshot(), versions=versions())
    res.update(summary(res))
    for name, r in res["caller"].items():
        s = r["us"]
        print(
            f"{name:11s} median {s['median']:9.1f} us  p99 {s['p99']:9.1f} us  max {s['max']:10.1f} us  "
            f"caller CPU {r['caller_cpu_us_per_step']:8.1f} us  receiver CPU "
            f"{r['receiver_cpu_us_per_step']:8.1f} us  drain {r['drain_ms']['median']:7.1f} ms",
            flush=True,
        )
    print(res["measured"], flush=True)
    write_json(args.out, res, args.out_dir)


if __name__ == "__main__":
    main()
