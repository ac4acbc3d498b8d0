"""Many short runs, one after another, against one long-lived collector: what a team's shared
collector sees. Used by ``test_run_retention`` and runnable on its own to measure::

    PYTHONPATH=. .venv/bin/python -m tests.integration.many_runs --runs 240 --every 40

Each run is ``ranks`` producers (in this driver process, each with its own socket and sender
thread, against the collector process on loopback) logging ``steps`` steps and closing. Every
``every`` runs it samples the collector process: resident memory (``VmRSS``), the bytes of
``state_dir/checkpoint.json`` and of the sink cursors, and the run series on ``/metrics``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from rlpulse.collector.launch import CollectorProcess, start_collector
from rlpulse.producer import Producer
from rlpulse.producer.config import ProducerConfig
from rlpulse.schemas import metrics as M
from tests.support.net import free_port

LOSS = M.ACTOR_PG_LOSS.name


@dataclass
class Sample:
    """The collector after ``runs`` runs."""

    runs: int
    rss_kb: int
    checkpoint_bytes: int
    cursor_bytes: int
    run_series: int
    """``rlpulse_run_step`` series on /metrics: one per run the page still shows."""
    seconds: float


@dataclass
class Shared:
    """A collector with ``state_dir``, jsonl and Prometheus, as a team would run it."""

    collector: CollectorProcess
    state: Path
    out: Path
    port: int
    log: Path

    def sample(self, runs: int, started: float) -> Sample:
        status = Path(f"/proc/{self.collector.proc.pid}/status").read_text()
        rss = next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS"))
        checkpoint = self.state / "checkpoint.json"
        cursors = sum(p.stat().st_size for p in (self.state / "cursors").glob("*.json"))
        return Sample(
            runs,
            rss,
            checkpoint.stat().st_size if checkpoint.exists() else 0,
            cursors,
            self.metrics().count("rlpulse_run_step{"),
            round(time.monotonic() - started, 1),
        )

    def metrics(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=10) as r:
            return r.read().decode()


@contextmanager
def shared_collector(tmp: Path, **extra: Any) -> Iterator[Shared]:
    """The collector, stopped (SIGTERM) on leaving; ``extra`` config keys on top."""
    port = free_port()
    state, out, log = tmp / "state", tmp / "out.jsonl", tmp / "collector.log"
    config = {
        "track_with": ["jsonl", "prometheus"],
        "tracker_kwargs": {"jsonl": {"path": str(out)}, "prometheus": {"port": port}},
        "state_dir": str(state),
        "settle_s": 0,
        "checkpoint_s": 0.5,
        **extra,
    }
    with log.open("w") as stderr:
        collector = start_collector(config, stderr=stderr, stdout=subprocess.DEVNULL)
    try:
        yield Shared(collector, state, out, port, log)
    finally:
        collector.stop()


def one_run(address: str, run: str, ranks: int, steps: int) -> list[dict[str, int]]:
    """``ranks`` producers of ``run`` log ``steps`` steps and close; their stats."""
    config = ProducerConfig(close_timeout_s=10.0)
    producers = [
        Producer(address, run=run, role="actor_train", rank=r, world_size=ranks, config=config)
        for r in range(ranks)
    ]
    for step in range(steps):
        for rank, p in enumerate(producers):
            p.log({LOSS: float(rank + step)}, step=step)
    for p in producers:
        p.close()
    return [p.stats() for p in producers]


def many_runs(
    shared: Shared,
    runs: int,
    *,
    ranks: int = 2,
    steps: int = 5,
    every: int = 100,
    prefix: str = "job",
    after_run: Callable[[int], None] | None = None,
) -> list[Sample]:
    """Run ``runs`` runs one after another; a sample before the first and every ``every``."""
    started = time.monotonic()
    samples = [shared.sample(0, started)]
    for i in range(runs):
        stats = one_run(shared.collector.address, f"{prefix}-{i}", ranks, steps)
        lost = [s for s in stats if s.get("unacked") or s.get("dropped_send")]
        assert not lost, f"run {i}: producers lost data: {lost}"
        if after_run is not None:
            after_run(i)
        if (i + 1) % every == 0:
            samples.append(shared.sample(i + 1, started))
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=240)
    parser.add_argument("--every", type=int, default=40)
    parser.add_argument("--retention", type=float, default=None, help="run_retention_s")
    parser.add_argument("--liveness", type=float, default=None, help="liveness_s")
    args = parser.parse_args()
    extra: dict[str, Any] = {}
    if args.retention is not None:
        extra["run_retention_s"] = args.retention
    if args.liveness is not None:
        extra["liveness_s"] = args.liveness
    with tempfile.TemporaryDirectory() as tmp, shared_collector(Path(tmp), **extra) as shared:
        for sample in many_runs(shared, args.runs, every=args.every):
            print(json.dumps(asdict(sample)), flush=True)


if __name__ == "__main__":
    main()


def stopped_rank(address: str, run: str, steps: int, stats_path: str) -> None:
    """Rank 1 of 2 of ``run``, in its own process: logs steps ``0..steps-1``, makes sure they
    are delivered, then stops itself (SIGSTOP: a node paused, a process frozen) until the
    test sends SIGCONT; then logs two steps more and closes, writing its ``stats()``."""
    p = Producer(
        address,
        run=run,
        role="actor_train",
        rank=1,
        world_size=2,
        config=ProducerConfig(close_timeout_s=10.0),
    )
    for step in range(steps):
        p.log({LOSS: float(step)}, step=step)
    p.flush(10)
    os.kill(os.getpid(), signal.SIGSTOP)
    for step in range(steps, steps + 2):
        p.log({LOSS: float(step)}, step=step)
    p.close()
    Path(stats_path).write_text(json.dumps(p.stats()))
