"""TRL with and without rlpulse: step time, and TRL's own loss metrics against the truth.

A real ``GRPOTrainer`` (the tiny CPU job of ``tests/frameworks/grpo_job.py``) runs under
``torchrun --nproc_per_node 2``, in turn with no callback (``off``), with
``RlpulseCallback(exact=False)`` (TRL's values only, ``driver``) and with ``RlpulseCallback()``
(``on``), streaming to a real collector, ``--rounds`` times each. Per
run, the median of TRL's own ``step_time`` over the steps after the first; per mode, the
median of the runs. One more run (``test``) records every micro-batch and compares, per
step and name, TRL's logged value and the collector's with the token-pooled truth
recomputed from the micro-batches. Step times of a tiny CPU job on a shared machine are
noisy, so the hook's own cost per micro-batch is also timed in process (``hook_cost``). Needs ``.venv-integrations``::

    .venv-integrations/bin/python -m benchmarks.integrations_overhead --steps 8 --rounds 2

Writes ``benchmarks/results/integrations_overhead.json``.

``--framework verl`` measures verl the same way: verl's own actor and critic updates on two
data-parallel ranks through ``run_ppo`` on Ray (``tests/frameworks/verl_loss_job.py``: verl's
``_update_actor``/``_update_critic``, ``ppo_loss``/``value_loss`` on verl's micro-batches; the
model's outputs given, as verl has no CPU engine), with no setup hook (``off``), with the
hook and ``RLPULSE_VERL_EXACT=0`` (verl's values only, ``driver``) and with the hook (``on``).
The step time is the driver's wall time of the two updates; ``hook_cost`` times verl's loss
functions on one micro-batch with and without the hook. Writes
``benchmarks/results/integrations_overhead_verl.json`` (same fields; ``verl`` for ``trl``)::

    .venv-integrations/bin/python -m benchmarks.integrations_overhead --framework verl --steps 8
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from benchmarks.common import free_port, median, write_json

ROOT = Path(__file__).resolve().parents[1]
JOB = ROOT / "tests" / "frameworks" / "grpo_job.py"
MODES = ("off", "driver", "on")
"""No callback; ``RlpulseCallback(exact=False)`` (TRL's values only); ``RlpulseCallback()``."""
EXACT = ("loss", "entropy", "clip_ratio/low_mean", "clip_ratio/high_mean", "clip_ratio/region_mean")


def torchrun(out: Path, run: str, mode: str, steps: int, address: str | None) -> list[dict]:
    """One two-process run of the job; rank 0's and rank 1's records."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo"}
    env["PYTHONPATH"] = f"{ROOT}:{env.get('PYTHONPATH', '')}"
    if address is not None:
        env["RLPULSE_ADDRESS"] = address
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node=2",
        "--master_addr=127.0.0.1",
        f"--master_port={free_port()}",
        str(JOB),
        str(out),
        run,
        mode,
        str(steps),
    ]
    done = subprocess.run(command, cwd=out, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{mode} run failed:\n{done.stderr[-3000:]}")
    return [json.loads((out / f"{mode}-rank{r}.json").read_text()) for r in (0, 1)]


def step_times(record: dict) -> list[float]:
    """TRL's ``step_time`` of every step after the first (which pays for warm-up)."""
    return [e["step_time"] for e in record["log_history"] if "step_time" in e and e["step"] > 1]


def differences(ranks: list[dict], collected: dict[int, dict]) -> dict[str, dict[str, float]]:
    """Per name: the largest |TRL - truth| and |rlpulse - truth| over the steps."""
    out: dict[str, dict[str, float]] = {n: {"trl": 0.0, "rlpulse": 0.0} for n in EXACT}
    for entry in ranks[0]["log_history"]:
        if "loss" not in entry or entry["step"] not in collected:
            continue
        step = entry["step"]
        seen = [s for r in ranks for s in r["seen"] if s["step"] == step]
        for name in EXACT:
            total = math.fsum(s["truth"][name][0] for s in seen)
            truth = total / sum(s["truth"][name][1] for s in seen)
            mine = collected[step]["metrics"][name]
            out[name]["trl"] = max(out[name]["trl"], abs(entry[name] - truth))
            out[name]["rlpulse"] = max(out[name]["rlpulse"], abs(mine - truth))
    return out


class _Accelerator:
    num_processes = 1

    def reduce(self, tensor: Any, reduction: str = "sum") -> Any:
        return tensor


class _Trainer:
    """A GRPO micro-batch's share of work that the hook sees: five (sum, count) pairs handed
    to ``accelerator.reduce`` and a loss, as ``GRPOTrainer._compute_loss`` (dapo) makes."""

    loss_type = "dapo"
    current_gradient_accumulation_steps = 2
    args = type("Args", (), {"steps_per_generation": 2})()

    def __init__(self) -> None:
        import torch

        self.torch = torch
        self.accelerator = _Accelerator()
        self.state = type("State", (), {"global_step": 0})()
        self.pair = torch.tensor([3.5, 7.0])

    def compute_loss(self, model: Any, inputs: Any) -> Any:
        for _ in range(4):
            self.accelerator.reduce(self.pair * 1.0, reduction="sum")
        return self.pair[0] * 0.5


def hook_cost(address: str, calls: int = 3000) -> dict[str, float]:
    """Microseconds per training micro-batch that the hook adds (wrapped minus plain
    ``compute_loss``), with a real producer sending to the collector at ``address``."""
    import time

    import torch

    from rlpulse.producer.client import Producer
    from rlpulse.producer.integrations.trl_loss import CLIP_LOW, ENTROPY, LossHook

    hook = LossHook(
        ((ENTROPY, "mean"), (CLIP_LOW, "fraction"), ("a", "fraction"), ("b", "fraction")), "tokens"
    )
    model = type("Model", (), {"training": True})()
    inputs = {"completion_mask": torch.ones(4, 8), "num_items_in_batch": torch.tensor(64.0)}
    trainer = _Trainer()
    run = f"bench-hook-{os.getpid()}"
    producer = Producer(address, run=run, role="trl", reductions=hook.reductions())
    timings = {}
    try:
        for label in ("plain", "hooked"):
            detach = hook.attach(trainer, producer) if label == "hooked" else (lambda: None)
            start = time.perf_counter()
            for i in range(calls):
                trainer.state.global_step = i // 8
                trainer.compute_loss(model, inputs)
            timings[label] = (time.perf_counter() - start) / calls * 1e6
            detach()
    finally:
        producer.close()
    return {**timings, "added_us": timings["hooked"] - timings["plain"]}


VERL_MODES = {
    "off": ["trainer.logger=[console]"],
    "driver": [
        "trainer.logger=[console,rlpulse]",
        "+ray_kwargs.ray_init.runtime_env.env_vars.RLPULSE_VERL_EXACT='0'",
    ],
    "on": ["trainer.logger=[console,rlpulse]"],
}
"""No setup hook; the hook with verl's values only; the hook (the README's command)."""


def verl_hook_cost(address: str, calls: int = 300) -> dict[str, float]:
    """Microseconds per actor and critic micro-batch that the hook adds to verl's
    ``ppo_loss`` + ``value_loss`` (hooked minus plain), with a real producer."""
    import time
    from functools import partial

    from hydra import compose, initialize_config_module
    from verl.utils.config import omega_conf_to_dataclass
    from verl.workers.utils import losses

    from rlpulse.producer.client import Producer
    from rlpulse.producer.integrations.verl_loss import LossHook
    from rlpulse.producer.integrations.verl_states import REDUCTIONS
    from tests.frameworks.verl_loss_job import (
        OVERRIDES,
        critic_config,
        local_micro_batches,
        make_batch,
        model_output,
    )

    with initialize_config_module("verl.trainer.config", version_base=None):
        config = compose("ppo_trainer", overrides=OVERRIDES)
    actor_config = omega_conf_to_dataclass(config.actor_rollout_ref.actor)
    micro = local_micro_batches(make_batch(1), step=1)[0]
    outputs = (
        {"log_probs": model_output(micro["new_log_probs"], micro)},
        {"values": model_output(micro["vpreds"], micro)},
    )
    run = f"bench-verl-hook-{os.getpid()}"
    producers = {
        role: Producer(address, run=run, role=role, reductions=REDUCTIONS)
        for role in ("actor", "critic")
    }
    hook = LossHook(lambda role, run, address: producers[role])
    timings = {}
    try:
        for label in ("plain", "hooked"):
            if label == "hooked":
                hook.install()
            actor = partial(losses.ppo_loss, config=actor_config)
            critic = partial(losses.value_loss, config=critic_config(config))
            start = time.perf_counter()
            for _ in range(calls):
                actor(model_output=outputs[0], data=micro, dp_group=None)
                critic(model_output=outputs[1], data=micro, dp_group=None)
            timings[label] = (time.perf_counter() - start) / calls * 1e6
    finally:
        hook.uninstall()
        for producer in producers.values():
            producer.close()
    return {**timings, "added_us": timings["hooked"] - timings["plain"]}


@contextlib.contextmanager
def _collector(prefix: str) -> Iterator[tuple[Path, Path, str]]:
    """A collector daemon writing jsonl into a fresh folder: (folder, jsonl, address)."""
    from rlpulse.collector.launch import start_collector

    work = Path(tempfile.mkdtemp(prefix=prefix))
    jsonl = work / "metrics.jsonl"
    config = {"track_with": ["jsonl"], "tracker_kwargs": {"jsonl": {"path": str(jsonl)}}}
    with (work / "collector.log").open("w") as log:
        collector = start_collector(config, stderr=log, stdout=subprocess.DEVNULL)
        try:
            yield work, jsonl, collector.address
        finally:
            collector.stop()


def verl_main(args: argparse.Namespace) -> dict[str, Any]:
    from tests.frameworks.verl_loss_job import EXACT, SETUP_HOOK, run_job

    times: dict[str, list[float]] = {mode: [] for mode in VERL_MODES}
    exact: dict[str, Any] = {}
    with _collector("rlpulse-integrations-verl-") as (work, jsonl, address):
        for round_ in range(args.rounds):
            for mode, overrides in VERL_MODES.items():
                hook = [] if mode == "off" else [SETUP_HOOK]
                run = f"bench-verl-{mode}-{round_}"
                result = run_job(work, run, args.steps, [*overrides, *hook], address)
                times[mode].append(median(result["step_s"][1:]))  # after the first step
                if mode == "on":
                    exact = result
        cost = verl_hook_cost(address)
    lines = [json.loads(line) for line in jsonl.read_text().splitlines()]
    collected = {r["step"]: r for r in lines if r["run"] == f"bench-verl-on-{args.rounds - 1}"}
    out: dict[str, dict[str, float]] = {n: {"verl": 0.0, "rlpulse": 0.0} for n in EXACT}
    for step, truth in exact["truth"].items():
        for name in EXACT:
            verl_value = exact["verl"][step][name]
            mine = collected[int(step)]["metrics"][name]
            out[name]["verl"] = max(out[name]["verl"], abs(verl_value - truth[name]))
            out[name]["rlpulse"] = max(out[name]["rlpulse"], abs(mine - truth[name]))
    medians = {mode: median(runs) for mode, runs in times.items()}
    result = {
        "framework": "verl",
        "steps": args.steps,
        "rounds": args.rounds,
        "step_time_s": {**medians, "runs": times},
        "overhead": {mode: medians[mode] / medians["off"] - 1.0 for mode in list(VERL_MODES)[1:]},
        "hook_us_per_micro_batch": cost,
        "max_abs_difference_from_truth": out,
    }
    path = write_json("integrations_overhead_verl", result)
    print(json.dumps(result, indent=1))
    print(f"written to {path}")
    return result


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--framework", choices=("trl", "verl"), default="trl")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args(argv)
    if args.framework == "verl":
        return verl_main(args)
    times: dict[str, list[float]] = {mode: [] for mode in MODES}
    with _collector("rlpulse-integrations-") as (work, jsonl, address):
        for round_ in range(args.rounds):
            for mode in MODES:
                ranks = torchrun(work, f"bench-{mode}-{round_}", mode, args.steps, address)
                times[mode].append(median(step_times(ranks[0])))
        ranks = torchrun(work, "bench-exact", "test", args.steps, address)
        cost = hook_cost(address)
    lines = [json.loads(line) for line in jsonl.read_text().splitlines()]
    collected = {r["step"]: r for r in lines if r["run"] == "bench-exact"}
    medians = {mode: median(runs) for mode, runs in times.items()}
    result = {
        "framework": "trl",
        "steps": args.steps,
        "rounds": args.rounds,
        "step_time_s": {**medians, "runs": times},
        "overhead": {mode: medians[mode] / medians["off"] - 1.0 for mode in MODES[1:]},
        "hook_us_per_micro_batch": cost,
        "max_abs_difference_from_truth": differences(ranks, collected),
    }
    path = write_json("integrations_overhead", result)
    print(json.dumps(result, indent=1))
    print(f"written to {path}")
    return result


if __name__ == "__main__":
    main()
