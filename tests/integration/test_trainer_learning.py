"""Learning: a short seeded PPO run raises the held-out validation score by at least 0.2
(about a minute on 2 CPU cores, several when they are busy: slow)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from rlpulse.schemas import metrics as m
from tests.integration.trainer_runs import REPO, trainer_cmd

STEPS = 30


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_ppo_raises_the_validation_score(tmp_path: Path) -> None:
    cmd = trainer_cmd("learn", tmp_path, STEPS, "val_every=10")
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=1700, check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    records = [
        json.loads(line) for line in (tmp_path / "learn" / "metrics.jsonl").read_text().splitlines()
    ]
    val = [
        (r["step"], r["metrics"][m.VAL_SCORE.name + "/mean"])
        for r in records
        if m.VAL_SCORE.name + "/mean" in r["metrics"]
    ]
    assert [s for s, _ in val] == [0, 10, 20, STEPS - 1]
    start, end = val[0][1], val[-1][1]
    print(f"val/score/mean by step: {val}")
    assert end >= start + 0.2, val
