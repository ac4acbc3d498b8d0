"""A relay frozen mid-run (issue 46, item 2), for real: a root with a ``state_dir``, a jsonl and
a Prometheus sink, two relays with their ``state_dir``, two rank processes behind each, all
on loopback. Relay 1 gets SIGSTOP once every rank's steps reach the root, and SIGCONT
``freeze_s`` later (or SIGKILL, never to come back). :func:`scenario` runs it and returns
what the root wrote, its /metrics during and after the freeze, and every producer's
``stats()``; ``python -m tests.integration.relay_freeze`` runs the issue's 30 s, 400-step
trial with every default and prints the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlpulse.collector.launch import CollectorProcess, start_collector
from tests.integration.collectors import SPAWN
from tests.integration.workload import run_rank
from tests.support.net import free_port
from tests.support.prom import scrape

RANKS = 4
LAYOUT = [("actor_train", r) for r in range(RANKS)]
FROZEN = 1
"""The relay frozen (ranks 1 and 3 are behind it: rank r reports to relay r % 2)."""


@dataclass
class Outcome:
    """What a :func:`scenario` left: the root's records, its /metrics, the producers' stats."""

    records: list[dict]
    frozen_metrics: dict[str, float]
    """The root's /metrics just before relay 1 was let go (or once it was killed)."""
    final_metrics: dict[str, float]
    stats: list[dict]
    seconds: float
    logs: dict[str, str] = field(default_factory=dict)

    @property
    def partial(self) -> list[int]:
        return [r["step"] for r in self.records if r["partial"]]

    def figures(self) -> dict[str, Any]:
        late = self.final_metrics.get("rlpulse_collector_late_entries_total")
        return {
            "steps": len(self.records),
            "partial": len(self.partial),
            "first_partial": self.partial[:5],
            "root_late_entries": late,
            "dropped_late": [s["dropped_late"] for s in self.stats],
            "dropped_send": [s["dropped_send"] for s in self.stats],
            "unacked": [s["unacked"] for s in self.stats],
            "resent_messages": [s["resent_messages"] for s in self.stats],
            "seconds": round(self.seconds, 1),
            "relay_metrics_frozen": relay_rows(self.frozen_metrics),
            "relay_metrics_final": relay_rows(self.final_metrics),
            "stop_lines": {name: stop_line(text) for name, text in sorted(self.logs.items())},
            "relay_write_failures": sum(
                text.count("write failed") for name, text in self.logs.items() if "relay" in name
            ),
        }


def stop_line(log: str) -> str:
    """A collector's last line: what it received, emitted, found late, duplicated..."""
    lines = [line for line in log.splitlines() if "rlpulse collector stopped" in line]
    return lines[-1].split("stopped: ", 1)[-1] if lines else ""


def relay_rows(metrics: dict[str, float]) -> dict[str, float]:
    """The root's /metrics rows about its relays, and its partial and held-back counters."""
    keep = ("relay", "partial_steps", "held_back", "paused")
    return {k: v for k, v in metrics.items() if any(word in k for word in keep)}


def scenario(
    tmp: Path,
    *,
    steps: int,
    pace_s: float,
    freeze_s: float,
    root_config: dict | None = None,
    relay_config: dict | None = None,
    kill: bool = False,
    timeout_s: float = 300,
) -> Outcome:
    """Root, two relays, :data:`RANKS` ranks logging ``steps`` steps ``pace_s`` apart; relay
    :data:`FROZEN` frozen for ``freeze_s`` once the root has steps of every rank (``kill``:
    SIGKILLed instead, never to come back, and the root's /metrics read ``freeze_s`` later;
    the ranks behind it then give up at close). ``root_config`` and ``relay_config`` go on
    top of the defaults."""
    port = free_port()
    out = tmp / "root.jsonl"
    started = time.monotonic()
    root = start_collector(
        {
            "track_with": ["jsonl", "prometheus"],
            "tracker_kwargs": {"jsonl": {"path": str(out)}, "prometheus": {"port": port}},
            "state_dir": str(tmp / "root-state"),
            **(root_config or {}),
        },
        stderr=(tmp / "root.log").open("w"),
        stdout=subprocess.DEVNULL,
    )
    relays: list[CollectorProcess] = []
    procs: list = []
    try:
        for i in range(2):
            relays.append(
                start_collector(
                    {
                        "upstream": root.address,
                        "state_dir": str(tmp / f"relay{i}-state"),
                        **(relay_config or {}),
                    },
                    stderr=(tmp / f"relay{i}.log").open("w"),
                    stdout=subprocess.DEVNULL,
                )
            )
        stats_paths = [tmp / f"rank{rank}.json" for _, rank in LAYOUT]
        go = tmp / "go"
        procs = [
            SPAWN.Process(
                target=rank_after,
                args=(str(go), relays[rank % 2].address, "freeze", role, rank, RANKS, steps),
                kwargs={
                    "pause": pace_s,
                    "close_timeout_s": 5 if kill and rank % 2 == FROZEN else 120,
                    "stats_path": str(stats_paths[rank]),
                },
            )
            for role, rank in LAYOUT
        ]
        for p in procs:
            p.start()
        deadline = time.monotonic() + 120
        while not all(Path(f"{go}.{rank}").exists() for _, rank in LAYOUT):
            assert time.monotonic() < deadline, "the rank processes did not start"
            time.sleep(0.05)
        go.touch()  # every rank registers at once: none is late by liveness_s
        wait_lines(out, 3, 120)
        first = json.loads(out.read_text().splitlines()[0])
        assert not first["partial"], first  # a step of every rank: all four are under way
        frozen = relays[FROZEN].proc
        os.kill(frozen.pid, signal.SIGKILL if kill else signal.SIGSTOP)
        try:
            time.sleep(freeze_s)
            frozen_metrics = scrape(port)
        finally:
            if not kill:
                os.kill(frozen.pid, signal.SIGCONT)  # never left frozen
        if kill:
            frozen.wait()
        for p in procs:
            p.join(timeout_s)
            assert p.exitcode == 0, p.exitcode
        wait_lines(out, steps, timeout_s)
        final_metrics = scrape(port)
    finally:
        for p in procs:
            p.kill()
        for relay in relays:
            relay.stop()
        root.stop()
    records = [json.loads(line) for line in out.read_text().splitlines()]
    stats = [json.loads(path.read_text()) for path in stats_paths]
    logs = {p.stem: p.read_text() for p in tmp.glob("*.log")}
    return Outcome(records, frozen_metrics, final_metrics, stats, time.monotonic() - started, logs)


def rank_after(go: str, *args: Any, **kwargs: Any) -> None:
    """:func:`run_rank` once the file ``go`` exists (``go.<rank>`` says this one is ready)."""
    Path(f"{go}.{args[3]}").touch()
    while not Path(go).exists():
        time.sleep(0.01)
    run_rank(*args, **kwargs)


def wait_lines(path: Path, n: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not (path.exists() and len(path.read_text().splitlines()) >= n):
        assert time.monotonic() < deadline, f"{n} steps did not reach the root in {timeout_s} s"
        time.sleep(0.05)


def main() -> None:
    """The issue's trial: 400 steps at 0.1 s, relay 1 frozen for 30 s, defaults everywhere."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--pace", type=float, default=0.1)
    parser.add_argument("--freeze", type=float, default=30.0)
    parser.add_argument("--kill", action="store_true", help="SIGKILL the relay instead")
    parser.add_argument("--dir", type=Path, required=True)
    args = parser.parse_args()
    args.dir.mkdir(parents=True, exist_ok=True)
    outcome = scenario(
        args.dir, steps=args.steps, pace_s=args.pace, freeze_s=args.freeze, kill=args.kill
    )
    print(json.dumps(outcome.figures(), indent=1))


if __name__ == "__main__":
    main()
