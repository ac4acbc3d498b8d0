"""The demo trainer run for the step ledger's proofs: ``python -m rlpulse.trainer`` on the tiny
reverse task, attached to a collector started beside it in one process tree (in the loopback
network namespace when this user may make one), its records read back from jsonl."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

from rlpulse.schemas import ledger as L
from tests.integration.trainer_runs import REPO, netns_prefix

RUNNER = """
import sys
from rlpulse.collector.launch import start_collector
from rlpulse.trainer.__main__ import main
out, run_dir, config, steps, *sets = sys.argv[1:]
handle = start_collector({"track_with": ["jsonl"], "tracker_kwargs": {"jsonl": {"path": out}}})
try:
    code = main(["--config", config, "--steps", steps, "--run", "ledger",
                 "--collector", handle.address, "--output-dir", run_dir, "--no-progress",
                 *[a for s in sets for a in ("--set", s)]])
finally:
    handle.stop()
sys.exit(code)
"""
TINY = (
    "sft.steps=5",
    "task.val_prompts=8",
    "val_every=0",
    "ppo.batch_size=16",
    "model.num_heads=2",
    "model.max_position_embeddings=128",
)
"""The shortest run that still has every role and phase: 16 responses a step, no validation
but the last step's (with the checkpoint)."""


def run_trainer(
    tmp: Path,
    steps: int,
    *overrides: str,
    config: str = "trainer/configs/reverse.yaml",
    tiny: bool = True,
    timeout_s: int = 900,
) -> list[dict[str, Any]]:
    """The run's step records, in order: ``config`` with :data:`TINY` (unless not ``tiny``)
    and ``overrides``."""
    out = tmp / "metrics.jsonl"
    cmd = [*netns_prefix(), sys.executable, "-c", RUNNER, str(out), str(tmp / "runs"), config]
    cmd.append(str(steps))
    # Ray's own temp dir, short: its sockets' paths must fit a Unix socket's 107 bytes
    with tempfile.TemporaryDirectory(prefix="ray", dir="/tmp") as ray_tmp:
        proc = subprocess.run(
            [*cmd, *(TINY if tiny else ()), *overrides],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
            env={**os.environ, "RAY_TMPDIR": ray_tmp},
        )
    assert proc.returncode == 0, proc.stderr[-4000:]
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["step"] for r in records] == list(range(steps))
    return records


def buckets(record: dict[str, Any]) -> dict[str, float]:
    return {b: record["metrics"][L.LEDGER_BUCKET.format(bucket=b)] for b in L.BUCKETS}


def assert_sums_to_wall(records: list[dict[str, Any]]) -> None:
    """In every step the buckets sum to the wall time within 1%."""
    for r in records:
        wall = r["metrics"][L.LEDGER_WALL.name]
        assert sum(buckets(r).values()) == pytest.approx(wall, rel=0.01), r["step"]
        assert all(v >= 0 for v in buckets(r).values()), r["step"]


def cause(record: dict[str, Any]) -> dict[str, Any] | None:
    return record.get("ledger", {}).get("cause")


def item_seconds(record: dict[str, Any], item: str) -> float:
    return L.items(record["metrics"]).get(item, 0.0)
