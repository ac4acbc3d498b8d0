"""A real TRL ``GRPOTrainer`` on CPU (tiny Llama from a config, local tokenizer and prompts)
streaming through ``RlpulseCallback`` to a real collector, in one process and in two
(``torchrun``): the collector's values against TRL's own ``log_history``, and the worker-side
metrics of the README against the tokens every process trained on."""

from __future__ import annotations

import json
import math
import os
import shlex
import socket
import subprocess
import sys
import time

import pytest
import yaml

pytest.importorskip(
    "trl", reason="TRL is not installed: `make install-integrations` (.venv-integrations)"
)

from rlpulse.schemas import metrics as M
from rlpulse.schemas.reductions import Stat
from tests.integrations.grpo_job import ROOT, load_example, recording
from tests.integrations.helpers import jsonl_collector, readme_block, records

PER_PROCESS = {"step_time", "train_runtime", "train_samples_per_second", "train_steps_per_second"}
"""What each process times itself (the rest TRL gathers: the same on every process)."""
ADV = M.CRITIC_ADVANTAGES.output_names()
LENGTH = M.RESPONSE_LENGTH.output_names()


def assert_matches_log_history(got: dict[int, dict], log_history: list[dict]) -> int:
    """Every number TRL logged is in the collector's record of its step, exactly; returns how
    many were compared."""
    compared = 0
    for entry in log_history:
        metrics = got[entry["step"]]["metrics"]
        for name, value in entry.items():
            if name == "step" or not isinstance(value, (int, float)) or not math.isfinite(value):
                continue
            assert metrics[name] == float(value), (entry["step"], name)
            compared += 1
    return compared


def assert_worker_side_exact(record: dict, seen: list[dict]) -> None:
    """The step's pooled advantages and lengths over every micro-batch and process."""
    advantages = [a for s in seen for a in s["advantages"]]
    lengths = [n for s in seen for n in s["lengths"]]
    metrics = record["metrics"]
    assert metrics[ADV[Stat.MEAN]] == pytest.approx(
        math.fsum(advantages) / len(advantages), abs=1e-9
    )
    assert metrics[ADV[Stat.MAX]] == max(advantages) and metrics[ADV[Stat.MIN]] == min(advantages)
    assert metrics[LENGTH[Stat.MEAN]] == pytest.approx(sum(lengths) / len(lengths), rel=1e-12)


def test_grpo_in_one_process_matches_log_history(tmp_path, monkeypatch) -> None:
    example = load_example()
    namespace: dict = {}
    with jsonl_collector(tmp_path) as (collector, out):
        monkeypatch.setenv("RLPULSE_ADDRESS", collector.address)
        monkeypatch.chdir(tmp_path)  # the callback saves runs/<run>/config.yaml here
        exec(readme_block("### TRL"), namespace)  # the README's callback and trainer
        rlpulse = namespace["rlpulse"]
        tokenizer = example.build_tokenizer()
        trainer = recording(namespace["ExactGRPOTrainer"])(
            model=example.tiny_model(tokenizer),
            reward_funcs=example.reward_length,
            args=example.grpo_config(str(tmp_path / "trainer"), steps=3),
            train_dataset=example.prompts(),
            processing_class=tokenizer,
            callbacks=[rlpulse],
        )
        trainer.seen = []
        trainer.train()
        assert rlpulse.producer is None  # closed at the end of training
    got = records(out)
    assert sorted(got) == [1, 2, 3]
    assert all(
        r["run"] == "grpo-tiny" and not r["partial"] and r["ranks"] == 1 for r in got.values()
    )
    log_history = trainer.state.log_history
    assert assert_matches_log_history(got, log_history) >= 3 * 20
    for step, record in got.items():
        assert_worker_side_exact(record, [s for s in trainer.seen if s["step"] == step])
        (train_log,) = [e for e in log_history if e["step"] == step and "loss" in e]
        # TRL's own (gathered) mean completion length is the pooled one here too.
        assert record["metrics"][LENGTH[Stat.MEAN]] == pytest.approx(
            train_log["completions/mean_length"], rel=1e-6
        )
    assert rlpulse.stats()["repeated"] == 0  # the final summary repeats epoch, same value
    saved = yaml.safe_load((tmp_path / "runs" / "grpo-tiny" / "config.yaml").read_text())
    assert saved["training_args"]["learning_rate"] == trainer.args.learning_rate
    assert saved["model"]["model_type"] == "llama" and saved["model"]["hidden_size"] == 16


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_grpo_in_two_processes_streams_every_rank(tmp_path) -> None:
    run = "grpo-two"
    with jsonl_collector(tmp_path) as (collector, out):
        env = {
            **os.environ,
            "RLPULSE_ADDRESS": collector.address,
            "OMP_NUM_THREADS": "1",
            "GLOO_SOCKET_IFNAME": "lo",
        }
        command = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc_per_node=2",
            "--master_addr=127.0.0.1",
            f"--master_port={free_port()}",
            str(ROOT / "tests" / "integrations" / "grpo_job.py"),
            str(tmp_path),
            run,
        ]
        done = subprocess.run(
            command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=280
        )
        assert done.returncode == 0, done.stderr[-4000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert [r["world_size"] for r in ranks] == [2, 2]
    got = records(out)
    assert sorted(got) == [1, 2, 3]
    assert all(r["run"] == run and not r["partial"] and r["ranks"] == 2 for r in got.values())
    main, other = ranks[0]["log_history"], ranks[1]["log_history"]
    assert assert_matches_log_history(got, main) >= 3 * 20
    # TRL's values are the same on both processes, but for each process's own clock.
    for a, b in zip(main, other, strict=True):
        differ = {k for k in a if a[k] != b.get(k)}
        assert differ <= PER_PROCESS, differ
    for step, record in got.items():
        seen = [s for r in ranks for s in r["seen"] if s["step"] == step]
        assert {len(s["lengths"]) for s in seen} == {4} and len(seen) == 4  # 2 x 2 micro-batches
        assert_worker_side_exact(record, seen)


def readme_commands() -> list[str]:
    """The README's TRL commands (its bash block), one per line, comments left out."""
    block = readme_block("### TRL", lang="bash")
    return [line.split("#")[0].strip() for line in block.splitlines() if line.split("#")[0].strip()]


def test_the_example_options_reach_the_script_through_torchrun() -> None:
    """torchrun's parser refuses an option after the script that abbreviates two of its own
    (issue 21: ``--run`` could be ``--run-path`` or ``--run_path``)."""
    from torch.distributed.run import get_args_parser

    options = [o for a in load_example().arguments()._actions for o in a.option_strings]
    script_args = [arg for o in options if o.startswith("--") for arg in (o, "x")]
    parsed = get_args_parser().parse_args(["--nproc_per_node", "2", "grpo.py", *script_args])
    assert parsed.training_script_args == script_args


def test_the_readme_commands_run_as_written(tmp_path) -> None:
    """The README's commands, typed in a checkout (here: a directory whose ``examples`` is
    the repository's): the collector from ``examples/trl/collector.yaml``, then the
    ``torchrun`` line as written; the ``python`` line's options parse."""
    collector_line, python_line, torchrun_line = readme_commands()
    assert collector_line.endswith("&") and torchrun_line.startswith("RLPULSE_ADDRESS=")
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    bin_dir = os.path.dirname(sys.executable)
    env = {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",  # python and torchrun of this environment
        "PYTHONPATH": str(ROOT),
        "OMP_NUM_THREADS": "1",
        "GLOO_SOCKET_IFNAME": "lo",  # a loopback-only test namespace has no other interface
    }
    ready = tmp_path / "ready"
    command = collector_line.rstrip("&").split()
    assert command[:2] == ["rlpulse", "collector"]
    log = (tmp_path / "collector.log").open("w")
    collector = subprocess.Popen(
        [os.path.join(bin_dir, "rlpulse"), *command[1:], "--ready-file", str(ready)],
        cwd=tmp_path,
        env=env,
        stderr=log,
        stdout=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30
        while not ready.exists():
            assert collector.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        done = subprocess.run(
            torchrun_line,
            shell=True,
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=280,
            check=False,
        )
        assert done.returncode == 0, done.stderr[-4000:]
    finally:
        collector.terminate()
        assert collector.wait(30) == 0
        log.close()
    args = load_example().arguments().parse_args(shlex.split(python_line)[3:])
    assert args.run_name == "grpo-tiny"
    got = [json.loads(line) for line in (tmp_path / "runs/grpo-tiny/metrics.jsonl").open()]
    assert [r["step"] for r in got] == [1, 2, 3]
    assert all(r["run"] == "grpo-tiny-2" and r["ranks"] == 2 and not r["partial"] for r in got)
