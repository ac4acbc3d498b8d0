"""Soak (issue 38): 8 ranks x 100 metrics x 50,000 steps through a real collector process with
``state_dir``, a jsonl sink and the Prometheus sink (its ``/metrics`` scraped every few
seconds). The collector's memory must stay flat after warm-up and its write-ahead log under
two segments, while every step arrives once, complete and exact.

``RLPULSE_SOAK_STEPS`` runs fewer steps (the figures in benchmarks/RESULTS.md say how many).
The summary is printed (``pytest -s``) and written to ``soak.json`` in the test's tmp_path.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

from rlpulse.collector.config import CollectorConfig
from rlpulse.producer import Producer
from rlpulse.producer.config import ProducerConfig
from tests.integration.collectors import SPAWN
from tests.support.net import free_port

RANKS, METRICS = 8, 100
STEPS = int(os.environ.get("RLPULSE_SOAK_STEPS", "50000"))
FLUSH_EVERY = 500
"""Steps between a rank's ``flush()``: the only pacing, so no ``log()`` call is dropped for a
full queue (the soak measures the collector, not the producer's bounds)."""
SAMPLE_S = 1.0
SCRAPE_EVERY = 5
"""Samples between two scrapes of ``/metrics``."""
WARM_UP = 0.1
"""The share of the run (by jsonl bytes written) after which memory must stay flat."""
RSS_GROWTH_MB = 32.0


def value(rank: int, step: int, metric: int) -> float:
    return (step % 1000) + metric / 1000 + rank


def soak_rank(address: str, rank: int, steps: int, stats_path: str) -> None:
    names = [f"soak/m{i:03d}" for i in range(METRICS)]
    p = Producer(
        address,
        run="soak",
        role="actor_train",
        rank=rank,
        world_size=RANKS,
        config=ProducerConfig(close_timeout_s=120, gpu_sample_s=0),
    )
    with p:
        for step in range(steps):
            base = (step % 1000) + rank
            p.log({name: base + i / 1000 for i, name in enumerate(names)}, step=step)
            if step % FLUSH_EVERY == FLUSH_EVERY - 1:
                p.flush(120)
    Path(stats_path).write_text(json.dumps(p.stats()))


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def wal_bytes(state: Path) -> tuple[int, int]:
    """(bytes, segment files) of the write-ahead log now."""
    sizes = []
    for path in (state / "wal").glob("*.log"):
        try:
            sizes.append(path.stat().st_size)
        except FileNotFoundError:  # deleted by compaction meanwhile
            continue
    return sum(sizes), len(sizes)


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_soak_memory_flat_and_the_log_bounded(tmp_path: Path) -> None:
    out, state, prom = tmp_path / "out.jsonl", tmp_path / "state", free_port()
    config = CollectorConfig.from_mapping(
        {
            "track_with": ["jsonl", "prometheus"],
            "tracker_kwargs": {"jsonl": {"path": str(out)}, "prometheus": {"port": prom}},
            "state_dir": str(state),
            "settle_s": 0,
            "grace_s": 300,
            "liveness_s": 300,
        }
    )
    segment = config.segment_bytes
    (tmp_path / "collector.yaml").write_text(yaml.safe_dump(config.to_mapping()))
    bind, ready = f"tcp://127.0.0.1:{free_port()}", tmp_path / "ready"
    with (tmp_path / "collector.log").open("w") as err:
        collector = subprocess.Popen(
            [
                *(sys.executable, "-m", "rlpulse.collector"),
                *("--config", str(tmp_path / "collector.yaml")),
                *("--bind", bind, "--ready-file", str(ready)),
            ],
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
    try:
        deadline = time.monotonic() + 60
        while not ready.exists():
            assert collector.poll() is None, (tmp_path / "collector.log").read_text()
            assert time.monotonic() < deadline, "the collector did not start"
            time.sleep(0.05)
        started = time.monotonic()
        ranks = [
            SPAWN.Process(target=soak_rank, args=(bind, r, STEPS, str(tmp_path / f"rank{r}.json")))
            for r in range(RANKS)
        ]
        for p in ranks:
            p.start()
        samples: list[tuple[float, float, int, int, int]] = []
        scrapes = 0
        while any(p.is_alive() for p in ranks) or (
            out.exists() and samples and samples[-1][4] != out.stat().st_size
        ):
            wal, files = wal_bytes(state)
            written = out.stat().st_size if out.exists() else 0
            samples.append((time.monotonic() - started, rss_mb(collector.pid), wal, files, written))
            if len(samples) % SCRAPE_EVERY == 0:
                with urllib.request.urlopen(f"http://127.0.0.1:{prom}/metrics", timeout=30) as r:
                    assert r.status == 200 and b"rlpulse_collector_" in r.read()
                scrapes += 1
            time.sleep(SAMPLE_S)
        elapsed = time.monotonic() - started
        for p in ranks:
            p.join(60)
            assert p.exitcode == 0
        collector.terminate()
        assert collector.wait(120) == 0
    finally:
        if collector.poll() is None:
            collector.kill()

    final = samples[-1][4]
    warm = next(i for i, s in enumerate(samples) if s[4] >= WARM_UP * final)
    after = [s[1] for s in samples[warm:]]
    summary = {
        "ranks": RANKS,
        "metrics": METRICS,
        "steps": STEPS,
        "elapsed_s": round(elapsed, 1),
        "values_per_s": round(RANKS * METRICS * STEPS / elapsed),
        "rss_start_mb": round(samples[0][1], 1),
        "rss_after_warm_up_mb": round(after[0], 1),
        "rss_max_after_warm_up_mb": round(max(after), 1),
        "rss_end_mb": round(samples[-1][1], 1),
        "wal_max_mb": round(max(s[2] for s in samples) / 2**20, 1),
        "wal_max_segments": max(s[3] for s in samples),
        "segment_mb": segment // 2**20,
        "scrapes": scrapes,
        "samples": len(samples),
    }
    (tmp_path / "soak.json").write_text(json.dumps({**summary, "series": samples}))
    print("soak:", json.dumps(summary))
    stats = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(RANKS)]
    lost = {k: sum(s[k] for s in stats) for k in stats[0] if k.startswith("dropped")}
    assert not any(lost.values()), lost
    steps, wrong = 0, 0
    with out.open() as f:
        for line in f:
            record = json.loads(line)
            assert record["step"] == steps and not record["partial"] and record["ranks"] == RANKS
            metrics = record["metrics"]
            for i in (0, 57, METRICS - 1):  # pooled over ranks: the mean of rank values
                want = sum(value(r, steps, i) for r in range(RANKS)) / RANKS
                wrong += not math.isclose(metrics[f"soak/m{i:03d}"], want, rel_tol=1e-12)
            steps += 1
    assert steps == STEPS and wrong == 0

    assert max(after) - after[0] < RSS_GROWTH_MB, summary
    assert summary["wal_max_mb"] * 2**20 < 2 * segment, summary
