"""A second ``python -m rlpulse.trainer`` under an existing ``--run`` is a new attempt, ``NAME-2``,
unless ``--resume`` (issue 21, item 4): it never appends the same steps to the first run's
metrics.jsonl by accident. (The whole trainer, twice: ``test_trainer_per_node.py``.)"""

from __future__ import annotations

from pathlib import Path

from rlpulse.trainer.config import TrainerConfig, load_config
from rlpulse.trainer.run import claim_run


def config(tmp_path: Path, run: str = "demo") -> TrainerConfig:
    return load_config(None, [f"output_dir={tmp_path}", f"run={run}"])


def test_a_new_name_is_taken_as_it_is(tmp_path: Path) -> None:
    claimed = claim_run(config(tmp_path))
    assert claimed.cfg.run == "demo" and claimed.notice() is None
    assert (tmp_path / "demo").is_dir()
    (tmp_path / "prepared" / "traces").mkdir(parents=True)  # a wrapper's collector wrote here
    (tmp_path / "prepared" / "metrics.jsonl").write_text("")
    assert claim_run(config(tmp_path, "prepared")).cfg.run == "prepared"  # no run saved yet


def test_a_name_that_ran_becomes_the_next_attempt(tmp_path: Path) -> None:
    (tmp_path / "demo").mkdir()
    (tmp_path / "demo" / "config.yaml").write_text("run: demo\n")  # what every run saves first
    (tmp_path / "demo" / "metrics.jsonl").write_text('{"run": "demo", "step": 0}\n')
    second = claim_run(config(tmp_path))
    assert second.cfg.run == "demo-2" and second.cfg.run_dir == tmp_path / "demo-2"
    assert second.cfg.run_dir.is_dir()  # claimed: a trainer started now gets demo-3
    notice = second.notice()
    assert notice is not None and "'demo' already exists" in notice
    assert "'demo-2'" in notice and "--resume" in notice
    assert claim_run(config(tmp_path)).cfg.run == "demo-3"


def test_resume_writes_into_the_existing_run(tmp_path: Path) -> None:
    (tmp_path / "demo").mkdir()
    (tmp_path / "demo" / "config.yaml").write_text("run: demo\n")
    claimed = claim_run(config(tmp_path), resume=True)
    assert claimed.cfg.run == "demo" and "(--resume)" in (claimed.notice() or "")
    assert not (tmp_path / "demo-2").exists()
