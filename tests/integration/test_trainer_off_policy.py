"""One step off-policy, for real: ``python -m rlpulse.trainer --set ppo.off_policy_steps=1``
attached to a collector (issue 26.2). Step t trains on the batch the policy of step t - 1
generated (step 0 on its own), so ``async/staleness`` is 0 at step 0 and 1 after; the
rollout engine's log-probs against the trainer's are reported every step. The rollout is HF
generate (``rollout.backend=hf``), as it was when the default model was one vLLM's CPU build
refuses: vLLM's own rollouts are test_trainer_catalog.py's.

The on-policy run (staleness 0 at every step) is tests/integration/test_trainer_catalog.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest

from rlpulse.schemas import metrics as m
from tests.integration.trainer_runs import REPO, netns_prefix

pytestmark = pytest.mark.timeout(900)

STEPS = 3
RUNNER = """
import sys
from rlpulse.collector.launch import start_collector
from rlpulse.trainer.__main__ import main
out, run_dir, steps = sys.argv[1:4]
handle = start_collector({"track_with": ["jsonl"], "tracker_kwargs": {"jsonl": {"path": out}}})
try:
    code = main(["--config", "trainer/configs/reverse.yaml", "--steps", steps, "--run", "stale",
                 "--collector", handle.address, "--output-dir", run_dir, "--no-progress",
                 "--set", "sft.steps=5", "--set", "task.val_prompts=8", "--set", "val_every=0",
                 "--set", "ppo.batch_size=16", "--set", "ppo.off_policy_steps=1",
                 "--set", "rollout.backend=hf"])
finally:
    handle.stop()
sys.exit(code)
"""


@pytest.fixture(scope="module")
def records(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("offpolicy")
    out = tmp / "metrics.jsonl"
    cmd = [*netns_prefix(), sys.executable, "-c", RUNNER, str(out), str(tmp / "runs"), str(STEPS)]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=900, check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return [json.loads(line) for line in out.read_text().splitlines()]


def _outputs(entry: Any, record: dict[str, Any]) -> dict[str, float]:
    return {
        stat.value: record["metrics"][name]
        for stat, name in entry.output_names().items()
        if name in record["metrics"]
    }


def test_staleness_is_one_step_once_the_pipeline_is_full(records: list[dict[str, Any]]) -> None:
    assert [r["step"] for r in records] == list(range(STEPS))
    for record in records:
        expected = 0.0 if record["step"] == 0 else 1.0
        got = _outputs(m.ASYNC_STALENESS, record)
        assert {"mean", "max", "min"} <= set(got), sorted(record["metrics"])
        assert set(got.values()) == {expected}, (record["step"], got)


def test_rollout_and_trainer_log_probs_are_compared_every_step(
    records: list[dict[str, Any]],
) -> None:
    for record in records:
        diff = _outputs(m.ROLLOUT_LOGPROB_DIFF, record)
        ratio = _outputs(m.ROLLOUT_PROB_RATIO, record)
        assert {"mean", "max", "min"} <= set(diff) and {"mean", "max", "min"} <= set(ratio)
        assert diff["min"] <= diff["mean"] <= diff["max"]
        assert ratio["min"] > 0.0
        if record["step"] == 0:
            # the rollout ran the weights the trainer scores with (temperature 1, no top_p):
            # they differ only by numerics
            assert max(abs(diff["min"]), abs(diff["max"])) < 1e-3, diff
        else:
            # one update later the trainer's policy has moved: the difference shows it
            assert diff["max"] - diff["min"] > 1e-4, diff
    assert not any(r["partial"] for r in records)
