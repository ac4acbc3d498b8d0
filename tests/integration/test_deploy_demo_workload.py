"""deploy/demo_workload.py against deploy/collector.yaml emits no partial step (issue 17,
item 5): every role keeps to one schedule, so the steps open at once stay few.

Scaled down to run in seconds: 50 steps, and ``max_open_steps: 6`` instead of the shipped 64.
The old workload's roles drifted apart by a step in five (the driver slept less per step than
the slowest actor_train rank), so more than ``max_open_steps`` stayed open after a few hundred
steps with the shipped config, and after about 30 here; the shipped 600-step run emitted
about a third of its steps partial."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import yaml

from rlpulse.collector.launch import start_collector

ROOT = Path(__file__).resolve().parents[2]
STEPS = 50


def test_no_partial_step(tmp_path: Path) -> None:
    config = yaml.safe_load((ROOT / "deploy" / "collector.yaml").read_text())
    out = tmp_path / "metrics.jsonl"
    config["tracker_kwargs"] = {"jsonl": {"path": str(out)}}
    config["track_with"] = ["jsonl"]
    config["state_dir"] = str(tmp_path / "state")
    config["max_open_steps"] = 6
    del config["bind"]  # a free loopback port (start_collector's default)
    with (tmp_path / "collector.log").open("w") as log:
        collector = start_collector(config, stderr=log, stdout=subprocess.DEVNULL)
    try:
        workload = subprocess.run(
            [
                sys.executable,
                "deploy/demo_workload.py",
                "--steps",
                str(STEPS),
                "--driver-delay",
                "0.5",
                "--address",
                collector.address,
            ],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert workload.returncode == 0, workload.stderr
    finally:
        assert collector.stop() == 0
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["step"] for r in records] == list(range(STEPS))
    partial = [(r["step"], r["missing"]) for r in records if r["partial"]]
    assert not partial, f"{len(partial)} partial steps: {partial[:5]}"
    assert {r["ranks"] for r in records} == {4}
    stop_line = (tmp_path / "collector.log").read_text().strip().splitlines()[-1]
    assert " 0 late," in stop_line, stop_line
