"""Serving under load (issue 14): locust against ``python -m rlpulse.trainer.serve``, with the
server's own metrics beside locust's.

For 1, 8 and 32 users, a fresh server (the demo's exported policy when ``make demo`` has run,
else a demo-size model built from the config) streams its metrics to a real collector (jsonl
sink) as run ``load-<users>u``; locust runs headless on loopback for a fixed time, each user
posting a reverse-a-word prompt as soon as its previous answer is in. Then the server is
stopped (SIGTERM: the last window is reported) and both sides are compared: locust's request
count, QPS and latency percentiles (client side: HTTP included) against what the collector
emitted for the run (server side: the requests counted, errors, and the quantiles of the
latency histogram merged over every window, as ``rlpulse.schemas.histogram`` computes them).

    python -m benchmarks.serve_load [--seconds 20] [--users 1,8,32]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common import free_port, load_snapshot, write_json
from rlpulse.collector.launch import start_collector
from rlpulse.schemas import metrics as M, serving as S
from rlpulse.schemas.histogram import quantile
from rlpulse.schemas.reductions import Stat

ROOT = Path(__file__).resolve().parent.parent
LOCUSTFILE = Path(__file__).with_name("serve_locustfile.py")
USERS = (1, 8, 32)
SECONDS = 20


def checkpoint(work: Path) -> tuple[Path, str]:
    """The demo's latest exported policy, or a demo-size model built from the config."""
    exported = sorted(
        (ROOT / "runs" / "demo").glob("checkpoint-*/actor"),
        key=lambda p: int(p.parent.name.split("-")[1]),
    )
    if exported and (exported[-1] / "config.json").is_file():
        return exported[-1], f"the demo's exported policy ({exported[-1].relative_to(ROOT)})"
    from rlpulse.trainer.config import ModelConfig
    from rlpulse.trainer.model import build_policy
    from rlpulse.trainer.tokenizer import build_tokenizer

    tokenizer = build_tokenizer()
    policy = build_policy(ModelConfig(), tokenizer, seed=0)
    out = work / "actor"
    policy.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out, "a demo-size model built from the config (random weights: `make demo` not run)"


def _wait_healthy(url: str, proc: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + 120
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited early:\n{log.read_text()}")
        try:
            with urllib.request.urlopen(url + "/healthz", timeout=5) as resp:
                if resp.status == 200:
                    return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"server not healthy in 120 s:\n{log.read_text()}")
        time.sleep(0.2)


def locust_stats(path: Path) -> dict[str, float]:
    """Locust's final statistics (``--json-file``; its CSV is written every few seconds and
    misses the last of them): count, failures, QPS and latency percentiles in ms, read off
    locust's own response-time histogram (milliseconds, rounded as locust rounds them)."""
    (entry,) = json.loads(path.read_text())  # one endpoint: POST /generate
    n = int(entry["num_requests"])
    times = sorted((float(ms), int(c)) for ms, c in entry["response_times"].items())
    elapsed = float(entry["last_request_timestamp"]) - float(entry["start_time"])

    def percentile(q: float) -> float:
        rank, seen = math.ceil(q * n), 0
        for ms, count in times:
            seen += count
            if seen >= rank:
                return ms
        return math.nan

    return {
        "requests": n,
        "failures": int(entry["num_failures"]),
        "qps": n / elapsed if elapsed > 0 else math.nan,
        "p50_ms": percentile(0.50),
        "p95_ms": percentile(0.95),
        "p99_ms": percentile(0.99),
        "mean_ms": float(entry["total_response_time"]) / n if n else math.nan,
    }


def server_stats(jsonl: Path, run: str) -> dict[str, Any]:
    """What the collector emitted for ``run``: totals, and latency quantiles from the bucket
    counts of every window summed (an exact merge over time, as across replicas)."""
    steps = [r for r in map(json.loads, jsonl.read_text().splitlines()) if r["run"] == run]
    metrics = [r["metrics"] for r in steps]
    h = M.SERVE_LATENCY
    counts = np.sum([[m.get(n, 0.0) for n in h.bucket_names] for m in metrics], axis=0)
    summary = h.summary.output_names()
    busy = [m for m in metrics if m.get(summary[Stat.MEAN]) is not None]
    n = float(counts.sum())
    lows = [m[summary[Stat.MIN]] for m in busy]
    highs = [m[summary[Stat.MAX]] for m in busy]
    q = {
        f"p{round(p * 100)}_ms": 1e3
        * (quantile(counts, p, h.bounds, low=min(lows), high=max(highs)) or math.nan)
        for p in (0.5, 0.95, 0.99)
    }
    windows_with_requests = sum(1 for m in metrics if m.get(S.SERVE_REQUESTS.name, 0) > 0)
    batch = M.SERVE_BATCH_SIZE.output_names()
    return {
        "steps": len(steps),
        "partial_steps": sum(1 for r in steps if r["partial"]),
        "windows_with_requests": windows_with_requests,
        "requests": int(sum(m.get(S.SERVE_REQUESTS.name, 0) for m in metrics)),
        "requests_total": int(metrics[-1].get(S.SERVE_REQUESTS_TOTAL.name, 0)) if metrics else 0,
        "errors": int(metrics[-1].get(S.SERVE_ERRORS_TOTAL.name, 0)) if metrics else 0,
        "tokens": int(metrics[-1].get(S.SERVE_TOKENS_GENERATED_TOTAL.name, 0)) if metrics else 0,
        "mean_ms": 1e3
        * sum(m[summary[Stat.MEAN]] * c for m, c in zip(busy, _counts(busy), strict=True))
        / n
        if n
        else math.nan,
        "max_ms": 1e3 * max(highs) if highs else math.nan,
        "max_queue_depth": max((m.get(S.SERVE_QUEUE_DEPTH.name, 0) for m in metrics), default=0),
        "batch_mean": float(
            np.average([m[batch[Stat.MEAN]] for m in metrics if batch[Stat.MEAN] in m])
        )
        if any(batch[Stat.MEAN] in m for m in metrics)
        else math.nan,
        "batch_max": max((m.get(batch[Stat.MAX], 0) for m in metrics), default=0),
        **q,
    }


def _counts(busy: list[dict[str, float]]) -> list[float]:
    return [sum(m.get(n, 0.0) for n in M.SERVE_LATENCY.bucket_names) for m in busy]


def measure(
    users: int, seconds: int, model: Path, collector_address: str, work: Path
) -> dict[str, Any]:
    """One load level against a fresh server; the locust and server sides of it."""
    port = free_port()
    run = f"load-{users}u"
    log = work / f"server-{users}.log"
    cmd = [
        sys.executable,
        "-m",
        "rlpulse.trainer.serve",
        "--model",
        str(model),
        "--port",
        str(port),
        "--collector",
        collector_address,
        "--run",
        run,
        "--torch-threads",
        "1",
    ]
    with log.open("w") as out:
        server = subprocess.Popen(cmd, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_healthy(url, server, log)
        stats = work / f"locust-{users}"  # locust adds .json
        locust = [
            sys.executable,
            "-m",
            "locust",
            "-f",
            str(LOCUSTFILE),
            "--headless",
            "--users",
            str(users),
            "--spawn-rate",
            str(users),
            "--run-time",
            f"{seconds}s",
            "--stop-timeout",
            "30",
            "--host",
            url,
            "--json-file",
            str(stats),
            "--only-summary",
            "--loglevel",
            "WARNING",
        ]
        done = subprocess.run(
            locust, cwd=ROOT, capture_output=True, text=True, timeout=seconds + 120
        )
        if done.returncode not in (0, 1):  # 1: some requests failed, reported as such
            raise RuntimeError(f"locust exited {done.returncode}:\n{done.stderr[-3000:]}")
        client = locust_stats(stats.with_suffix(".json"))
    finally:
        server.send_signal(signal.SIGTERM)  # drains, reports the last window, exits 0
        try:
            server.wait(60)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
    return {
        "users": users,
        "seconds": seconds,
        "run": run,
        "locust": client,
        "server_exit": server.returncode,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=int, default=SECONDS, help="locust run time per level")
    parser.add_argument(
        "--users", default=",".join(map(str, USERS)), help="comma-separated user counts"
    )
    parser.add_argument("--out", default="serve_load")
    args = parser.parse_args()
    levels = [int(u) for u in args.users.split(",")]
    work = Path(tempfile.mkdtemp(prefix="rlpulse-serve-load-"))
    model, model_note = checkpoint(work)
    jsonl = work / "metrics.jsonl"
    load0 = load_snapshot()
    collector = start_collector(
        {"track_with": ["jsonl"], "tracker_kwargs": {"jsonl": {"path": str(jsonl)}}, "grace_s": 30},
        stdout=subprocess.DEVNULL,
        stderr=(work / "collector.log").open("w"),
    )
    try:
        results = [measure(u, args.seconds, model, collector.address, work) for u in levels]
    finally:
        collector.stop()
    for r in results:
        r["server"] = server_stats(jsonl, r["run"])
    load1 = load_snapshot()
    agree = all(
        r["locust"]["requests"] == r["server"]["requests"] == r["server"]["requests_total"]
        for r in results
    )
    clean = all(r["locust"]["failures"] == 0 and r["server"]["errors"] == 0 for r in results)
    rows = []
    for r in results:
        c, s = r["locust"], r["server"]
        rows.append(
            f"| {r['users']} | {c['qps']:.1f} | {c['p50_ms']:.0f} / {s['p50_ms']:.0f} ms | "
            f"{c['p95_ms']:.0f} / {s['p95_ms']:.0f} ms | {c['p99_ms']:.0f} / {s['p99_ms']:.0f} ms | "
            f"{c['failures'] / max(c['requests'], 1):.1%} / {s['errors'] / max(s['requests'], 1):.1%} | "
            f"{c['requests']} / {s['requests']} | {s['batch_mean']:.1f} (max {s['batch_max']:.0f}) | "
            f"{s['max_queue_depth']:.0f} |"
        )
    report = {
        "model": model_note,
        "cpus": os.cpu_count(),
        "load_start": load0,
        "load_end": load1,
        "results": results,
        "measured": (
            "; ".join(
                f"{r['users']} users: {r['locust']['requests']} (locust) vs {r['server']['requests']} (server)"
                for r in results
            )
            + f"; errors {sum(r['locust']['failures'] for r in results)}"
        ),
        "met": agree and clean,
        "markdown": [
            f"`python -m benchmarks.serve_load`: for each user count a fresh `python -m rlpulse.trainer.serve` serving {model_note}, "
            f"on CPU with one torch thread, metrics streamed to a collector (jsonl); locust {args.seconds} s headless on "
            "loopback, each user posting a reverse-a-word prompt (greedy, max_new_tokens 6) as soon as its previous answer "
            "is in. Each cell is locust / the server: locust's latency is the client's (HTTP and locust's own CPU included), "
            "the server's from handler entry to answer, its quantiles read off the latency histogram merged over every "
            "window the collector emitted (exact to bucket resolution). Requests are locust's count / the sum of the "
            "collector's `serve/requests` over the run's windows (the server's `serve/requests_total` agrees: "
            f"{'yes' if all(r['server']['requests'] == r['server']['requests_total'] for r in results) else 'NO'}). "
            f"Locust, the server and the collector share this machine's {os.cpu_count()} CPUs. "
            f"Load average {load0['load1']:.1f} at the start, {load1['load1']:.1f} at the end.",
            "",
            "| users | QPS (locust) | p50 | p95 | p99 | error rate | requests | batch size (mean of windows) | queue depth, max |",
            "|---|---|---|---|---|---|---|---|---|",
            *rows,
            "",
            f"Verdict: met when both sides count the same requests at every level and nothing failed "
            f"({'yes' if agree else 'NO'}, {'none failed' if clean else 'some failed'}).",
            "",
        ],
    }
    write_json(args.out, report)
    print("\n".join(report["markdown"]))


if __name__ == "__main__":
    main()
