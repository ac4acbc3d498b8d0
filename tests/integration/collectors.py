"""Real collector processes for the integration tests, started the ways several tests share:

- :func:`live_collector`: one collector with a jsonl and a Prometheus sink;
- :class:`Setup`: one configuration with a ``state_dir``, started, killed and restarted
  (:class:`Daemon`, or :class:`Refused` when it exits before listening);
- :func:`root` and :func:`relay`: the two tiers, with :func:`wait_for_steps` at the root;
- :data:`SPAWN`, to start producer processes; :func:`read_jsonl` and :func:`assert_matches`
  to read what a jsonl sink wrote.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from rlpulse.collector.config import CollectorConfig
from rlpulse.collector.launch import CollectorProcess, start_collector
from tests.support.net import free_port

SPAWN = mp.get_context("spawn")
"""Producer processes start fresh (no fork of the test process and its threads)."""


@dataclass
class Live:
    """A running collector with a jsonl sink (``out``) and a Prometheus sink (``port``); its
    stderr goes to ``log``."""

    collector: CollectorProcess
    port: int
    out: Path
    log: Path


@contextmanager
def live_collector(tmp_path: Path, **extra: Any) -> Iterator[Live]:
    """A collector (``settle_s`` 0, jsonl to ``tmp_path/out.jsonl``, Prometheus on a free
    port, stderr to ``tmp_path/collector.log``, ``extra`` config keys on top), stopped on
    leaving. It is listening on return; its /metrics may not be serving yet."""
    port = free_port()
    out = tmp_path / "out.jsonl"
    log = tmp_path / "collector.log"
    config = {
        "track_with": ["jsonl", "prometheus"],
        "tracker_kwargs": {"jsonl": {"path": str(out)}, "prometheus": {"port": port}},
        "settle_s": 0,
        **extra,
    }
    with log.open("w") as stderr:
        collector = start_collector(config, stderr=stderr, stdout=subprocess.DEVNULL)
    try:
        yield Live(collector, port, out, log)
    finally:
        collector.stop()


@dataclass
class Daemon:
    """A ``python -m rlpulse.collector`` process and where its stderr goes."""

    proc: subprocess.Popen
    log: Path

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        return self.proc.wait()

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()


@dataclass
class Refused:
    """A collector that exited before listening."""

    returncode: int
    stderr: str


class Setup:
    """One collector configuration (state_dir, a jsonl sink, a fixed address) in ``tmp``."""

    def __init__(self, tmp: Path, **extra: object) -> None:
        self.tmp = tmp
        self.out = tmp / "out.jsonl"
        self.state = tmp / "state"
        self.bind = f"tcp://127.0.0.1:{free_port()}"
        config = CollectorConfig.from_mapping(
            {
                "track_with": ["jsonl"],
                "tracker_kwargs": {"jsonl": {"path": str(self.out)}},
                "state_dir": str(self.state),
                "checkpoint_s": 0.2,
                "grace_s": 120,
                "liveness_s": 120,
                "settle_s": 0,
                **extra,
            }
        )
        self.config_path = tmp / "collector.yaml"
        self.config_path.write_text(yaml.safe_dump(config.to_mapping()))
        self.starts = 0

    def start(self) -> Daemon | Refused:
        """Start a collector; wait until it listens, or until it exits (a refusal)."""
        self.starts += 1
        ready = self.tmp / f"ready{self.starts}"
        log = self.tmp / f"collector{self.starts}.log"
        with log.open("w") as err:
            proc = subprocess.Popen(
                [
                    *(sys.executable, "-m", "rlpulse.collector", "--config", str(self.config_path)),
                    *("--bind", self.bind, "--ready-file", str(ready)),
                ],
                stdout=subprocess.DEVNULL,
                stderr=err,
            )
        deadline = time.monotonic() + 60
        while not ready.exists():
            if proc.poll() is not None:
                return Refused(proc.returncode, log.read_text())
            if time.monotonic() > deadline:
                proc.kill()
                pytest.fail("collector neither listened nor exited within 60s")
            time.sleep(0.02)
        return Daemon(proc, log)

    def started(self) -> Daemon:
        daemon = self.start()
        assert isinstance(daemon, Daemon), daemon
        return daemon

    def lines(self) -> list[dict]:
        if not self.out.exists():
            return []
        return [json.loads(line) for line in self.out.read_text().splitlines()]

    def wait_lines(self, n: int, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while len(self.lines()) < n:
            assert time.monotonic() < deadline, f"{len(self.lines())} of {n} steps written"
            time.sleep(0.05)


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def assert_matches(record: dict, want: dict[str, float]) -> None:
    for name, value in want.items():
        assert record["metrics"][name] == pytest.approx(value, rel=1e-9, abs=1e-12), name


def root(tmp_path: Path):
    out = tmp_path / "root.jsonl"
    config = {
        "track_with": ["jsonl"],
        "tracker_kwargs": {"jsonl": {"path": str(out)}},
        "state_dir": str(tmp_path / "root-state"),
        "settle_s": 0,
        "grace_s": 120,
        "liveness_s": 60,
        "max_open_steps": 1000,
    }
    log = (tmp_path / "root.log").open("a")
    return start_collector(config, stderr=log, stdout=subprocess.DEVNULL), out


def relay(tmp_path: Path, name: str, upstream: str, bind: str):
    config = {
        "upstream": upstream,
        "state_dir": str(tmp_path / f"{name}-state"),
        "settle_s": 1,
        "grace_s": 120,
        "liveness_s": 60,
        "max_open_steps": 1000,
        "checkpoint_s": 0.5,
    }
    log = (tmp_path / f"{name}.log").open("a")
    return start_collector(config, bind=bind, stderr=log, stdout=subprocess.DEVNULL)


def wait_for_steps(path: Path, run: str, steps: int, timeout_s: float = 120) -> None:
    """Wait until ``path`` (a jsonl sink's file) holds ``steps`` records of ``run``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if (
            path.exists()
            and sum(f'"run":"{run}"' in line for line in path.read_text().splitlines()) >= steps
        ):
            return
        time.sleep(0.2)
    raise AssertionError(f"{run}: {steps} steps did not reach the root in {timeout_s} s")
