"""The trainer with ``cluster.collectors: per_node``: a relay on the Ray node and a root
(``rlpulse.collector.onray``), every worker finding the relay by itself. The run's metrics.jsonl,
written by the root, has every step complete, from every worker, with the metrics of every
role; the relay's log shows the workers registered with it, not with the root directly.

Run again under the same ``--run`` (issue 21), the trainer starts a new attempt, ``NAME-2``,
with a directory and metrics of its own; with ``--resume`` it adds to the first run's
``metrics.jsonl``, and its collectors, though in the same ``state_root`` under the same Ray
job id (``01000000``, every fresh local cluster's), start from nothing and write every step.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.integration.trainer_runs import REPO, trainer_cmd

pytestmark = pytest.mark.timeout(1800)  # three trainer runs
STEPS = 2


OVERRIDES = (
    "cluster.collectors=per_node",
    "sft.steps=10",
    "task.val_prompts=8",
    "ppo.batch_size=16",
    "rollout.max_new_tokens=4",
    "rollout.backend=hf",  # what these runs test is the collectors: no vLLM engine start-up
)
ROLES = {"actor_train", "critic", "reference", "rollout", "reward", "driver"}


def train(tmp_path: Path, *flags: str) -> str:
    """``python -m rlpulse.trainer --run pernode`` with ``flags``; its standard output."""
    cmd = trainer_cmd("pernode", tmp_path, STEPS, *OVERRIDES)
    proc = subprocess.run(
        [*cmd, *flags], cwd=REPO, capture_output=True, text=True, timeout=600, check=False
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc.stdout


def check_complete(records: list[dict]) -> None:
    for record in records:
        assert not record["partial"], record["missing"]
        assert {role for joined in record["roles"].values() for role in joined.split("+")} >= ROLES


def read(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_per_node_collectors_write_every_step_complete_run_after_run(tmp_path: Path) -> None:
    train(tmp_path)
    run_dir = tmp_path / "pernode"
    records = read(run_dir / "metrics.jsonl")
    assert [r["step"] for r in records] == list(range(STEPS))
    check_complete(records)
    relays = list((run_dir / "collectors").glob("rlpulse-ray/*/relay-*/collector.log"))
    assert len(relays) == 1, "one Ray node, one relay"
    registered = relays[0].read_text().count("registered (host")
    assert registered == 7, "2 actor_train ranks, critic, reference, rollout, reward, driver"

    # The same --run again: a new attempt, said first, written apart.
    out = train(tmp_path)
    assert out.splitlines()[0].startswith("trainer: run 'pernode' already exists"), out
    assert "new attempt, 'pernode-2'" in out and "run pernode-2: 2 steps" in out
    again = read(tmp_path / "pernode-2" / "metrics.jsonl")
    assert [r["step"] for r in again] == list(range(STEPS))
    assert {r["run"] for r in again} == {"pernode-2"}
    check_complete(again)
    assert read(run_dir / "metrics.jsonl") == records, "the first run's file is untouched"

    # --resume: into the first run's directory, by collectors that inherit nothing.
    out = train(tmp_path, "--resume")
    assert "run pernode: 2 steps" in out and "new attempt" not in out
    resumed = read(run_dir / "metrics.jsonl")
    assert [r["step"] for r in resumed] == [*range(STEPS), *range(STEPS)]
    check_complete(resumed[STEPS:])
    attempts = sorted((run_dir / "collectors" / "rlpulse-ray").iterdir())
    assert len(attempts) == 2, "a state directory per start, not per Ray job id"
    for attempt in attempts:
        report = json.loads((attempt / "root" / "stopped.json").read_text())
        assert report["steps_emitted"] == STEPS and report["late"] == 0, report
