"""``rlpulse.collector.onray`` run the way a user runs it (issue 21): a driver script per run, each
starting a fresh local Ray cluster, so every run's Ray job id is ``01000000``.

* the ``RayCollectors`` snippet of docs/runs-and-relays.md, as written: ``collectors.stop()`` right after the
  workers finish must forward and write every step (it kept them in the state directory);
* two runs in a row with the same ``state_root`` and run name: the second must write its own
  steps (it inherited the first's state, keyed by the job id, and wrote nothing).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.docs import doc_block

pytest.importorskip("ray")

ROOT = Path(__file__).resolve().parents[2]
RANKS, STEPS = 2, 3
pytestmark = pytest.mark.timeout(300)

PRELUDE = textwrap.dedent(
    """
    import json, sys, tempfile
    import ray

    run, offset, state_root = sys.argv[1], float(sys.argv[2]), sys.argv[3]
    ray.init(_node_ip_address="127.0.0.1", include_dashboard=False, num_cpus=2,
             runtime_env={"env_vars": {"RAY_USAGE_STATS_ENABLED": "0"}})
    tempfile.tempdir = state_root  # the collectors' default state_root: the temp directory


    @ray.remote(num_cpus=0)
    def rank_worker(rank):
        from rlpulse.producer import Producer, Weighted
        from rlpulse.schemas import metrics as M

        p = Producer(run=run, role="actor_train", rank=rank, world_size=RANKS)  # no address
        for step in range(STEPS):
            p.log({M.ACTOR_PG_LOSS.name: Weighted(offset + rank + step, 1)}, step=step)
        p.close()
        return p.address


    def run_workers():
        return ray.get([rank_worker.remote(rank) for rank in range(RANKS)])
    """
)

EPILOGUE = textwrap.dedent(
    """
    stopped = getattr(collectors, "stopped", None)
    print(json.dumps({
        "used": used,
        "relays": list(collectors.relay_addresses.values()),
        "left": stopped.left if stopped is not None else None,
    }))
    """
)


def readme_snippet() -> str:
    """The Python block of the "On Ray" section (docs/runs-and-relays.md)."""
    return doc_block(
        "docs/runs-and-relays.md", "### On Ray: a relay per node, found by the workers", "python"
    )


def with_workers(snippet: str) -> str:
    """``snippet`` with its placeholder comment for the workers replaced by real ones."""
    lines = snippet.splitlines()
    (i,) = [n for n, line in enumerate(lines) if line.startswith("# ... workers")]
    lines[i] = "used = run_workers()"
    return "\n".join(lines) + "\n"


def drive(tmp_path: Path, collectors_code: str, run: str, offset: float) -> dict:
    """Run a driver script (a process of its own, a fresh Ray cluster) in ``tmp_path``."""
    script = tmp_path / "driver.py"
    consts = f"RANKS, STEPS = {RANKS}, {STEPS}\n"
    script.write_text(consts + PRELUDE + with_workers(collectors_code) + EPILOGUE)
    state_root = tmp_path / "state"
    state_root.mkdir(exist_ok=True)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RAY_USAGE_STATS_ENABLED": "0"}
    done = subprocess.run(
        [sys.executable, str(script), run, str(offset), str(state_root)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def steps_of(path: Path, run: str) -> list[dict]:
    return [r for r in map(json.loads, path.read_text().splitlines()) if r["run"] == run]


def check(records: list[dict], offset: float) -> None:
    """Every step once, in order, from both ranks, with this run's values."""
    assert [r["step"] for r in records] == list(range(STEPS))
    for r in records:
        assert not r["partial"] and r["ranks"] == RANKS, r["missing"]
        want = offset + (RANKS - 1) / 2 + r["step"]  # the mean over the ranks
        assert r["metrics"]["actor/pg_loss"] == pytest.approx(want, rel=1e-12)


def test_the_readme_snippet_as_written_writes_every_step(tmp_path: Path) -> None:
    out = drive(tmp_path, readme_snippet(), "readme", offset=0.0)
    assert sorted(out["used"]) == sorted(out["relays"]) * RANKS  # found the node's relay
    check(steps_of(tmp_path / "metrics.jsonl", "readme"), offset=0.0)
    assert out["left"] == []


COLLECTORS = """
from rlpulse.collector.onray import RayCollectors, RayCollectorsConfig

collectors = RayCollectors.start(
    RayCollectorsConfig(
        root={
            "track_with": ["jsonl"],
            "tracker_kwargs": {"jsonl": {"path": "metrics.jsonl"}},
            "settle_s": 0,
        }
    )
)
# ... workers
collectors.stop()
"""


def test_a_second_run_in_a_row_writes_its_own_steps(tmp_path: Path) -> None:
    """Same directory, same ``state_root``, same run name, same Ray job id: each run's root
    emits and writes its own steps (root ``settle_s: 0``, so even a stop that kept open
    steps would have written them)."""
    drive(tmp_path, COLLECTORS, "twice", offset=0.0)
    check(steps_of(tmp_path / "metrics.jsonl", "twice"), offset=0.0)
    out = drive(tmp_path, COLLECTORS, "twice", offset=100.0)
    records = steps_of(tmp_path / "metrics.jsonl", "twice")
    assert len(records) == 2 * STEPS, "the second run wrote its steps after the first's"
    check(records[:STEPS], offset=0.0)
    check(records[STEPS:], offset=100.0)
    assert out["left"] == []
    attempts = sorted((tmp_path / "state" / "rlpulse-ray").iterdir())
    assert len(attempts) == 2 and all(a.name.startswith("01000000-") for a in attempts)
    for attempt in attempts:
        report = json.loads((attempt / "root" / "stopped.json").read_text())
        assert report["steps_emitted"] == STEPS and report["late"] == 0, report
