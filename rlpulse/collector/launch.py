"""Start a collector as a child process and wait until it listens (tests, demo, trainer).

>>> # handle = start_collector({"track_with": ["jsonl"], "tracker_kwargs": {"jsonl": {"path": "o.jsonl"}}})
>>> # Producer(handle.address, ...); ...; handle.stop()
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from rlpulse.collector.config import CollectorConfig


class CollectorProcess:
    """A running collector daemon; ``stop()`` sends SIGTERM and waits for a clean exit."""

    def __init__(self, proc: subprocess.Popen, address: str, workdir: Path) -> None:
        self.proc = proc
        self.address = address
        self.workdir = workdir

    def stop(self, timeout: float = 30.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()

    def __enter__(self) -> CollectorProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _term_when_parent_dies() -> None:
    """In the child, before exec: SIGTERM when the process that started it dies."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


PR_SET_PDEATHSIG = 1


def start_collector(
    config: CollectorConfig | Mapping[str, Any],
    *,
    bind: str | None = "tcp://127.0.0.1:*",
    timeout: float = 30.0,
    stdout: Any = None,
    stderr: Any = None,
    env: Mapping[str, str] | None = None,
    die_with_parent: bool = False,
) -> CollectorProcess:
    """Run ``python -m rlpulse.collector`` with ``config`` (a :class:`CollectorConfig`, or its YAML
    form, checked here first: a bad one raises ConfigError naming the field); ``bind``
    overrides the config's, by default with a free loopback port (None keeps the config's).
    With ``die_with_parent`` (Linux) the collector gets SIGTERM when this process dies, even
    by SIGKILL: a collector run by a Ray actor goes with the actor."""
    if not isinstance(config, CollectorConfig):
        config = CollectorConfig.from_mapping(config)
    workdir = Path(tempfile.mkdtemp(prefix="rlpulse-collector-"))
    config_path = workdir / "collector.yaml"
    config_path.write_text(yaml.safe_dump(config.to_mapping()))
    ready = workdir / "ready"
    cmd = [
        sys.executable,
        "-m",
        "rlpulse.collector",
        "--config",
        str(config_path),
        "--ready-file",
        str(ready),
    ]
    if bind is not None:
        cmd += ["--bind", bind]
    proc = subprocess.Popen(
        cmd,
        stdout=stdout,
        stderr=stderr,
        env={**os.environ, **(env or {})},
        preexec_fn=_term_when_parent_dies if die_with_parent else None,
    )
    deadline = time.monotonic() + timeout
    while not ready.exists():
        if proc.poll() is not None:
            raise RuntimeError(f"collector exited with code {proc.returncode} before listening")
        if time.monotonic() > deadline:
            proc.kill()
            raise TimeoutError(f"collector did not start listening within {timeout}s")
        time.sleep(0.02)
    return CollectorProcess(proc, ready.read_text().strip(), workdir)
