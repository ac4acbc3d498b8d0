"""examples/verl/README.md's commands, typed in the environment it tells the user to activate
(this one, .venv-integrations: verl and rlpulse; issue 45, item 8). Its last step, ``rlpulse
report``, failed there: the environment had no matplotlib (the ``report`` extra).

The collector line, ``kill %1 && wait`` and the report line run as written, in bash, from a
checkout (a directory whose ``examples`` is the repository's). The ``run_ppo.sh`` line needs a
GPU engine, a model and data; in its place verl's ``Tracking`` with the ``rlpulse`` backend
(what ``run_ppo.sh`` turns on in verl's driver) logs three steps of the run ``$RUN``, to the
collector ``run_ppo.sh`` defaults to. tests/frameworks/test_verl.py checks ``run_ppo.sh``'s
overrides against verl's config.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip(
    "verl", reason="verl is not installed: `make install-integrations` (.venv-integrations)"
)

from tests.docs import doc_block
from tests.frameworks.helpers import ROOT, records

README = "examples/verl/README.md"

STAND_IN = textwrap.dedent(
    """
    import os

    from verl.utils.tracking import Tracking

    from rlpulse.producer.integrations import verl as rlpulse_verl
    from tests.frameworks.verl_job import driver_metrics

    rlpulse_verl.register()
    run = os.environ["RUN"]  # run_ppo.sh: trainer.experiment_name="$RUN"
    config = {"trainer": {"experiment_name": run, "logger": ["console", "rlpulse"]}}
    tracking = Tracking("examples", run, ["console", "rlpulse"], config=config)
    for step in range(3):
        tracking.log(data=driver_metrics(step), step=step)
    tracking.finish()
    """
)


def test_the_examples_commands_run_as_written_report_included(tmp_path: Path) -> None:
    block = doc_block(README, "# verl's PPO trainer, streaming to rlpulse", "bash")
    lines = block.strip().splitlines()
    assert lines[1].startswith("RUN=gsm8k-ppo examples/verl/run_ppo.sh ")
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    (tmp_path / "stand_in.py").write_text(STAND_IN)
    lines[1] = f"RUN=gsm8k-ppo {sys.executable} stand_in.py   # for run_ppo.sh (needs GPUs)"
    bin_dir = os.path.dirname(sys.executable)
    env = {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",  # as after `source .venv-integrations/...`
        "PYTHONPATH": str(ROOT),
    }
    done = subprocess.run(
        ["bash", "-e", "-c", "\n".join(lines)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    got = records(tmp_path / "runs" / "gsm8k-ppo" / "metrics.jsonl")
    assert sorted(got) == [0, 1, 2]
    assert all(r["run"] == "gsm8k-ppo" and not r["partial"] for r in got.values())
    png = tmp_path / "runs" / "gsm8k-ppo" / "metrics-report.png"
    assert png.stat().st_size > 0, done.stdout
