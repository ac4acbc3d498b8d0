"""The trainer saves its resolved configuration beside its metrics, and ``compare`` reads it
with the README's ``--key`` (issue 17, item 4)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
import torch
import yaml

import rlpulse.trainer.run as trainer_run
from rlpulse.runtools.cli import main as run_tools
from rlpulse.schemas.record import StepRecord
from rlpulse.trainer.config import load_config


class Stop(Exception):
    """Raised in place of the heavy part of a run: everything before it has happened."""


def fail(*args: object, **kwargs: object) -> None:
    raise Stop


def start_run(tmp_path: Path, overrides: list[str], monkeypatch: pytest.MonkeyPatch) -> Path:
    """``train()`` up to the task build (no Ray workers), as ``python -m rlpulse.trainer`` calls it."""
    cfg = load_config(None, [f"output_dir={tmp_path}", "metrics=false", *overrides])
    monkeypatch.setattr(trainer_run, "build_task", fail)
    threads = torch.get_num_threads()  # train() sets the process's torch threads
    try:
        with pytest.raises(Stop):
            trainer_run.train(cfg)
    finally:
        torch.set_num_threads(threads)
    return cfg.run_dir


def test_train_saves_the_resolved_config_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    overrides = ["run=lr-high", "ppo.actor_lr=0.002", "ppo.epochs=3", "ppo.value_clip=null"]
    run_dir = start_run(tmp_path, overrides, monkeypatch)
    saved = run_dir / "config.yaml"
    assert saved.is_file()
    raw = yaml.safe_load(saved.read_text())
    assert raw["ppo"]["actor_lr"] == 0.002 and raw["ppo"]["value_clip"] is None
    # what ran, read back: the same configuration
    assert load_config(saved) == load_config(
        None, [f"output_dir={tmp_path}", "metrics=false", *overrides]
    )


def test_compare_reads_the_saved_config_beside_metrics(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    files = []
    for run, lr in (("lr-low", "0.0005"), ("lr-high", "0.002")):
        run_dir = start_run(tmp_path, [f"run={run}", f"ppo.actor_lr={lr}"], monkeypatch)
        record = StepRecord(run=run, step=0, metrics={"critic/score/mean": 0.5})
        (run_dir / "metrics.jsonl").write_text(json.dumps(record.to_json()) + "\n")
        files.append(str(run_dir / "metrics.jsonl"))
    out, err = io.StringIO(), io.StringIO()
    assert run_tools(["compare", *files, "--key", "ppo.actor_lr"], stdout=out, stderr=err) == 0
    assert err.getvalue() == ""
    rows = {line.split("|")[1].strip(): line for line in out.getvalue().splitlines()[2:]}
    assert "| 0.0005" in rows["lr-low"] and "| 0.002" in rows["lr-high"]
