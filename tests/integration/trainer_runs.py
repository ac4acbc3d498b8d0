"""Running the trainer for the integration tests: in the loopback network namespace when this
user may make one (Ray probes the network at start-up), from the repository root."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
"""The repository root, the trainer's working directory (its configs are relative to it)."""

# The collector, then the trainer attached to it by address, in one process tree.
RUNNER = """
import sys
from rlpulse.collector.launch import start_collector
from rlpulse.trainer.__main__ import main
out, run_dir, steps, batch, max_new, backend = sys.argv[1:7]
handle = start_collector({"track_with": ["jsonl"], "tracker_kwargs": {"jsonl": {"path": out}}})
try:
    code = main(["--config", "trainer/configs/reverse.yaml", "--steps", steps, "--run", "catalog",
                 "--collector", handle.address, "--output-dir", run_dir, "--no-progress",
                 "--set", "sft.steps=20", "--set", "task.val_prompts=16",
                 "--set", f"ppo.batch_size={batch}", "--set", f"rollout.max_new_tokens={max_new}",
                 "--set", f"rollout.backend={backend}", "--set", "model.num_heads=2"])
finally:
    handle.stop()
sys.exit(code)
"""


def netns_prefix() -> list[str]:
    """A loopback-only network namespace when this user may create one, else nothing."""
    if shutil.which("unshare") is None:
        return []
    probe = subprocess.run(
        ["unshare", "-n", "--", "sh", "-c", "ip link set lo up"], capture_output=True, check=False
    )
    if probe.returncode != 0:
        return []
    return ["unshare", "-n", "--", "sh", "-c", 'ip link set lo up && exec "$0" "$@"']


def trainer_cmd(run: str, output_dir: Path, steps: int, *overrides: str) -> list[str]:
    """``python -m rlpulse.trainer`` on the reverse task, in the loopback namespace when it can be,
    with ``--set`` for each of ``overrides``."""
    sets = [arg for override in overrides for arg in ("--set", override)]
    return [
        *netns_prefix(),
        sys.executable,
        "-m",
        "rlpulse.trainer",
        *("--config", "trainer/configs/reverse.yaml", "--steps", str(steps), "--run", run),
        *("--output-dir", str(output_dir), "--no-progress", *sets),
    ]
