"""The trainer with ``cluster.collectors: per_node``: a relay on the Ray node and a root
(``collector.onray``), every worker finding the relay by itself. The run's metrics.jsonl,
written by the root, has every step complete, from every worker, with the metrics of every
role; the relay's log shows the workers registered with it, not with the root directly."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.integration.test_trainer_catalog import REPO, trainer_cmd

pytestmark = pytest.mark.timeout(900)
STEPS = 2


def test_per_node_collectors_write_every_step_complete(tmp_path: Path) -> None:
    cmd = trainer_cmd(
        "pernode",
        tmp_path,
        STEPS,
        "cluster.collectors=per_node",
        "sft.steps=10",
        "task.val_prompts=8",
        "ppo.batch_size=16",
        "rollout.max_new_tokens=4",
    )
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=900, check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    run_dir = tmp_path / "pernode"
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == list(range(STEPS))
    roles = {"actor_train", "critic", "reference", "rollout", "reward", "driver"}
    for record in records:
        assert not record["partial"], record["missing"]
        assert {role for joined in record["roles"].values() for role in joined.split("+")} >= roles
    relays = list((run_dir / "collectors").glob("rlpulse-ray/*/relay-*/collector.log"))
    assert len(relays) == 1, "one Ray node, one relay"
    registered = relays[0].read_text().count("registered (host")
    assert registered == 7, "2 actor_train ranks, critic, reference, rollout, reward, driver"
