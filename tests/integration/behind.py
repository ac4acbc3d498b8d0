"""Issue 46 item 1's scenario: a sender that falls behind reducing large ``Samples`` values.

Ranks, each its own process, log at every step a ``Samples`` of ``rows`` rows (a prompt and
a response of given sizes, a reward) and one scalar, ``pace_s`` apart, then ``close()``. A
real collector (jsonl, Prometheus, ``state_dir``) receives them on loopback. :func:`run`
returns what the user would look at: the steps in the jsonl (partial flags and missing
ranks, and how long after its last ``log()`` each appeared), each producer's ``stats()``, its
warnings, its peak RSS and how long ``close()`` took, and the collector's stop line.

The full size (the issue's: 2 ranks, 20,000 rows of a 2 KB prompt and a 6 KB response, 40
steps 50 ms apart; several GB of memory and a minute or two)::

    PYTHONPATH=$PWD scripts/in-netns.sh .venv/bin/python -m tests.integration.behind

``tests/integration/test_sender_behind.py`` runs it scaled down, and at full size in the
slow set.
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import subprocess
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from tempfile import mkdtemp
from typing import Any

from rlpulse.collector.launch import start_collector
from rlpulse.schemas import metrics as M
from tests.integration.collectors import SPAWN, read_jsonl
from tests.support.net import free_port

SAMPLES = M.ROLLOUT_SAMPLES.name
SCALAR = M.ACTOR_PG_LOSS.name


@dataclass(frozen=True)
class Scenario:
    """What each rank logs; ``config``: ``ProducerConfig`` fields on top of the defaults."""

    ranks: int = 2
    rows: int = 20_000
    prompt_bytes: int = 2048
    response_bytes: int = 6144
    steps: int = 40
    pace_s: float = 0.05
    config: dict[str, Any] = field(default_factory=dict)


def peak_rss_bytes() -> int:
    """This process's peak resident memory: ``VmHWM``, its own address space's high-water mark.
    Not ``getrusage().ru_maxrss``: Linux carries the parent's peak into a child through fork and
    exec, so a worker started by a test run that had loaded vLLM read 1.2 GB of its parent's."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def _rows(step: int, rank: int, s: Scenario) -> list[dict[str, Any]]:
    """Distinct texts (each its own object, as a tokenizer's output would be)."""
    prompt, response = "p" * s.prompt_bytes, "r" * s.response_bytes
    return [
        {
            "prompt": f"{step}:{rank}:{i}:" + prompt[: s.prompt_bytes - 16],
            "response": f"{i}:" + response[: s.response_bytes - 8],
            "reward": float((step * 7 + rank * 3 + i) % 101),
        }
        for i in range(s.rows)
    ]


def _rank(address: str, rank: int, s: Scenario, out: Path) -> None:
    """One rank's process: log every step, close, write what it saw to ``out``."""
    from rlpulse.producer import Producer, Samples
    from rlpulse.producer.config import ProducerConfig

    warnings: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            warnings.append(record.getMessage())

    logging.getLogger("rlpulse.producer").addHandler(Keep(logging.WARNING))
    p = Producer(
        address,
        run="behind",
        role="actor_train",
        rank=rank,
        world_size=s.ranks,
        config=ProducerConfig(**s.config),
    )
    log_s = []
    for step in range(s.steps):
        rows = _rows(step, rank, s)
        t = time.perf_counter()
        p.log({SAMPLES: Samples(rows, key="reward"), SCALAR: float(step + rank)}, step=step)
        log_s.append(time.perf_counter() - t)
        del rows
        time.sleep(s.pace_s)
    t = time.monotonic()
    p.close()
    closed = time.monotonic() - t
    rss = peak_rss_bytes()
    report = {
        "stats": p.stats(),
        "close_s": closed,
        "peak_rss_bytes": rss,
        "warnings": warnings,
        "log_max_s": max(log_s),
    }
    out.write_text(json.dumps(report))


class _Watch:
    """When each step's line first appeared in the jsonl file (its lag: from the step's last
    ``log()`` to the sinks)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.at: dict[int, float] = {}
        self._done = 0
        self._rest = b""

    def read(self) -> None:
        if not self.path.exists():
            return
        with self.path.open("rb") as f:
            f.seek(self._done)
            data = self._rest + f.read()
        self._done += len(data) - len(self._rest)
        *lines, self._rest = data.split(b"\n")
        now = time.time()
        for line in lines:
            self.at.setdefault(json.loads(line)["step"], now)


def run(s: Scenario, work: Path | None = None) -> dict[str, Any]:
    """Run the scenario against a fresh collector; what reached it and what each rank saw."""
    work = work or Path(mkdtemp(prefix="rlpulse-behind-"))
    jsonl, log_path = work / "out.jsonl", work / "collector.log"
    config = {
        "track_with": ["jsonl", "prometheus"],
        "tracker_kwargs": {"jsonl": {"path": str(jsonl)}, "prometheus": {"port": free_port()}},
        "state_dir": str(work / "state"),
        "settle_s": 0,
    }
    with log_path.open("w") as err:
        collector = start_collector(config, stderr=err, stdout=subprocess.DEVNULL)
    try:
        procs = []
        for rank in range(s.ranks):
            out = work / f"rank{rank}.json"
            proc = SPAWN.Process(target=_rank, args=(collector.address, rank, s, out))
            proc.start()
            procs.append((proc, out))
        seen = _Watch(jsonl)
        deadline = time.monotonic() + 600
        while any(proc.is_alive() for proc, _ in procs) and time.monotonic() < deadline:
            seen.read()
            time.sleep(0.02)
        end = time.monotonic() + 1.0  # what was delivered is applied
        while time.monotonic() < end:
            seen.read()
            time.sleep(0.02)
        ranks = [json.loads(out.read_text()) for _, out in procs]
    finally:
        collector.stop(120)
    records = read_jsonl(jsonl) if jsonl.exists() else []
    lags = {r["step"]: seen.at[r["step"]] - r["time"] for r in records if r["step"] in seen.at}
    lag = sorted(lags.values())
    stopped = [line for line in log_path.read_text().splitlines() if "collector stopped" in line]
    dropped = re.search(r"producers dropped (\d+)", stopped[-1]) if stopped else None
    report_path = work / "state" / "stopped.json"
    return {
        "scenario": asdict(s),
        "steps": [r["step"] for r in records],
        "partial": {r["step"]: r["missing"] for r in records if r["partial"]},
        "with_samples": [r["step"] for r in records if SAMPLES in r.get("samples", {})],
        "scalar_ranks": {r["step"]: r["metrics"].get(SCALAR) for r in records},
        "lag_s": {"median": lag[len(lag) // 2], "max": lag[-1]} if lag else None,
        "lag_by_step": lags,
        "ranks": ranks,
        "collector_stop_line": stopped[-1] if stopped else "",
        "collector_producers_dropped": int(dropped.group(1)) if dropped else None,
        "stop_report": json.loads(report_path.read_text()) if report_path.exists() else None,
    }


def summary(result: dict[str, Any]) -> dict[str, Any]:
    """The figures a report quotes."""
    s = result["scenario"]
    return {
        "steps_emitted": len(result["steps"]),
        "steps_logged": s["steps"],
        "missing_steps": sorted(set(range(s["steps"])) - set(result["steps"])),
        "partial_steps": sorted(result["partial"]),
        "steps_with_samples": len(result["with_samples"]),
        "lag_s": result["lag_s"],
        "collector_producers_dropped": result["collector_producers_dropped"],
        "stop_report": result["stop_report"],
        "ranks": [
            {
                "stats": {k: v for k, v in r["stats"].items() if v},
                "close_s": round(r["close_s"], 2),
                "peak_rss_mb": round(r["peak_rss_bytes"] / 2**20),
                "log_max_ms": round(r["log_max_s"] * 1e3, 2),
                "warnings": r["warnings"],
            }
            for r in result["ranks"]
        ],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=Scenario.rows)
    parser.add_argument("--steps", type=int, default=Scenario.steps)
    parser.add_argument("--json", type=Path, help="write the whole result here too")
    args = parser.parse_args()
    result = run(Scenario(rows=args.rows, steps=args.steps))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    print(json.dumps(summary(result), indent=1))


if __name__ == "__main__":
    main()
