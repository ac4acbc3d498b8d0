"""A ROLL-shaped job on the stand-in (``tests/frameworks/rollstub``), run as its own process by
``test_roll.py``: the YAML block's hooks as Ray would call them (``ray_hook`` in the driver,
``worker_setup`` in the workers: here one process), two actor and two critic ranks holding 8
and 55 response tokens per step, a step skipped (no valid response), the driver's metrics of
the whole trained batch (``MetricsManager.add_all_metrics``) and a validation at even steps
(rlvr's ``val``), and the process exits without ``finish()``, as ROLL's pipelines do.

    python tests/frameworks/roll_standin_job.py ADDRESS RUN STEPS [--resume HISTORY.json] STATS.json [RECORDS.jsonl]
"""

from __future__ import annotations

import atexit
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch

STUB = Path(__file__).resolve().parent / "rollstub"
VOCAB = 11
PROMPT = 3
LENGTHS = {0: [[3, 5]], 1: [[12, 9, 11], [7, 0], [12, 4]]}
"""Per rank, its micro-batches' response lengths: 8 and 55 tokens."""
WIDTH = PROMPT + 12
SKIPPED = 1
"""The step ROLL skips: no response survives its filters, no worker trains."""
SAMPLES_K = 2
"""The driver's ``samples_k``: 2 best, 2 worst and 2 random of each batch's rows."""
VAL_ROWS = 5


class Config:
    """ROLL's pipeline config, as much of it as the hook reads."""

    def __init__(self, address: str, run: str, resume: bool) -> None:
        self.exp_name = "standin"
        self.track_with = "rlpulse"
        self.tracker_kwargs = {
            "address": address,
            "run": run,
            "config_dir": "runs/{run}",
            "producer": {"close_timeout_s": 10.0, "samples_k": SAMPLES_K},
        }
        self.loss_agg_mode = "token-mean"
        self.pg_clip = 0.2
        self.sequence_length = WIDTH
        self.resume_from_checkpoint = resume
        self.value_clip = None

    def to_dict(self) -> dict[str, Any]:
        return dict(vars(self))


def rank_data(step: int, rank: int) -> dict[str, Any]:
    """The tensors of one rank's batch at ``step`` (seeded: the test rebuilds them)."""
    g = torch.Generator().manual_seed(1000 * step + rank)
    rows = [n for mb in LENGTHS[rank] for n in mb]
    count = len(rows)
    response_mask = torch.zeros(count, WIDTH, dtype=torch.long)
    for i, n in enumerate(rows):
        response_mask[i, PROMPT : PROMPT + n] = 1
    input_ids = torch.randint(0, VOCAB, (count, WIDTH), generator=g)
    logits = torch.randn(count, WIDTH, VOCAB, generator=g, dtype=torch.float64)
    old = torch.randn(count, WIDTH - 1, generator=g, dtype=torch.float64) * 0.3
    mask = response_mask[:, 1:]
    labels = input_ids[:, 1:] * mask
    now = torch.log_softmax(logits[:, :-1], -1).gather(-1, labels.unsqueeze(-1)).squeeze(-1) * mask
    advantages = (
        torch.randn(count, 1, generator=g, dtype=torch.float64).expand(-1, WIDTH - 1) * mask
    )
    values_out = torch.randn(count, WIDTH, 1, generator=g, dtype=torch.float64)
    scores = torch.rand(count, generator=g, dtype=torch.float64)
    return {
        "input_ids": input_ids,
        "response_mask": response_mask,
        "old_log_probs": (now + old) * mask,
        "advantages": advantages,
        "values": torch.randn(count, WIDTH - 1, generator=g, dtype=torch.float64) * mask,
        "returns": torch.randn(count, WIDTH - 1, generator=g, dtype=torch.float64) * mask,
        "logits": logits,
        "values_out": values_out,
        "scores": scores,
    }


def driver_batch(step: int) -> tuple[dict[str, Any], dict[str, list[str]]]:
    """The whole trained batch the driver holds at ``step`` (both ranks' rows, in order), as
    ROLL's driver has it after the advantages: tensors, and per-row objects."""
    parts = [rank_data(step, r) for r in (0, 1)]
    tensors = {
        k: torch.cat([p[k] for p in parts])
        for k in ("input_ids", "response_mask", "advantages", "scores")
    }
    rows = tensors["input_ids"].shape[0]
    prompt = torch.zeros(rows, WIDTH, dtype=torch.bool)
    prompt[:, :PROMPT] = True
    tensors["prompt_mask"] = prompt
    tensors["attention_mask"] = (prompt | tensors["response_mask"].bool()).long()
    tensors["final_response_mask"] = tensors["response_mask"][:, 1:]
    rewards = torch.zeros(rows, WIDTH - 1, dtype=torch.float64)
    rewards[:, -1] = tensors["scores"]
    tensors["token_level_rewards"] = rewards
    domains = [
        ("math" if r == 0 else "code") for r in (0, 1) for _ in range(len(parts[r]["scores"]))
    ]
    return tensors, {"domain": domains, "tag": [f"{d}-tag" for d in domains]}


def val_batch(step: int) -> tuple[dict[str, Any], dict[str, list[str]]]:
    """The validation batch of ``step`` (what rlvr's validation scheduler returns)."""
    g = torch.Generator().manual_seed(7000 + step)
    ids = torch.randint(0, VOCAB, (VAL_ROWS, WIDTH), generator=g)
    lengths = torch.randint(1, WIDTH - PROMPT, (VAL_ROWS,), generator=g)
    response = torch.zeros(VAL_ROWS, WIDTH, dtype=torch.long)
    for i, n in enumerate(lengths.tolist()):
        response[i, PROMPT : PROMPT + n] = 1
    prompt = torch.zeros(VAL_ROWS, WIDTH, dtype=torch.bool)
    prompt[:, :PROMPT] = True
    tensors = {
        "input_ids": ids,
        "prompt_mask": prompt,
        "attention_mask": (prompt | response.bool()).long(),
        "response_mask": response,
        "scores": torch.randint(0, 2, (VAL_ROWS,), generator=g).double(),
    }
    return tensors, {"tag": [f"set{i % 2}" for i in range(VAL_ROWS)]}


def micro_batches(rank: int, tensor: Any) -> list[tuple[int, int, Any]]:
    out, start = [], 0
    for mb in LENGTHS[rank]:
        out.append((start, start + len(mb), tensor[start : start + len(mb)]))
        start += len(mb)
    return out


def emitted(records: Path, step: int, within_s: float) -> bool:
    """Whether the collector's jsonl holds ``step`` within ``within_s`` seconds."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if records.exists() and any(
            json.loads(line)["step"] == step for line in records.read_text().splitlines() if line
        ):
            return True
        time.sleep(0.1)
    return False


def main(argv: list[str]) -> None:
    address, run, steps, *rest = argv
    history = None
    if rest[0] == "--resume":
        history = json.loads(Path(rest[1]).read_text())
        rest = rest[2:]
    stats_path = Path(rest[0])
    records = Path(rest[1]) if len(rest) > 1 else None
    sys.path.insert(0, str(STUB))

    # What Ray does with the YAML block: the runtime-env hook in the driver's ray.init, the
    # worker setup hook in every worker process (one process here).
    from rlpulse.producer.integrations import roll as rlpulse_roll

    env = rlpulse_roll.ray_hook({"env_vars": {"A": "1"}})
    assert env["worker_process_setup_hook"] == rlpulse_roll.SETUP_HOOK, env
    rlpulse_roll.worker_setup()

    from roll.distributed.executor.cluster import Cluster
    from roll.distributed.scheduler.protocol import DataProto
    from roll.pipeline.base_worker import CriticWorker
    from roll.pipeline.rlvr.actor_worker import ActorWorker
    from roll.pipeline.rlvr.rlvr_pipeline import RLVRPipeline
    from roll.utils.metrics.metrics_manager import MetricsManager

    def validation(step: int) -> DataProto:
        tensors, objects = val_batch(step)
        return DataProto(batch=tensors, non_tensor_batch=objects, meta_info={"global_step": step})

    config = Config(address, run, resume=history is not None)
    logged: list[dict[str, Any]] = []
    pipeline: Any = None

    def dump() -> None:  # at exit, after the tracker closed (atexit runs the last first)
        stats_path.write_text(json.dumps({"logged": logged, "tracker": pipeline.tracker.stats()}))

    atexit.register(dump)
    pipeline = RLVRPipeline(config, log_history=history or (), val_batch=validation)
    actor = Cluster("actor_train", ActorWorker, 2)
    critic = Cluster("critic", CriticWorker, 2)
    for cluster in (actor, critic):
        cluster.call("initialize", (config,), (config,))
    first = 0 if history is None else len(history)
    for step in range(first, first + int(steps)):
        actor.call("start_model_update", (), ())
        metrics: dict[str, Any] = {"system/step": step, "actor/lr@last": 1e-6}
        if step % 2 == 0:  # rlvr validates at the start of the step, every eval_steps
            metrics.update(pipeline.val(global_step=step))
        if step == SKIPPED:
            metrics["mask/final_mask_sum_eq_0"] = 1
        else:
            data = [rank_data(step, r) for r in (0, 1)]
            protos = [
                DataProto(
                    batch={k: v for k, v in d.items() if k not in ("logits", "values_out")},
                    meta_info={"global_step": step},
                )
                for d in data
            ]
            tokens = sum(int(d["response_mask"].sum()) for d in data)
            sequences = sum(int((d["response_mask"].sum(-1) > 0).sum()) for d in data)
            out = actor.call(
                "train_step",
                *[
                    (protos[r], micro_batches(r, data[r]["logits"]), (tokens, sequences))
                    for r in (0, 1)
                ],
            )
            for name in out[0]:
                values = [v for rank in out for v in rank[name]]
                # ROLL's driver: @sum tagged values summed (one optimizer step), the rest averaged
                metrics[name] = sum(values) if name.endswith("@sum") else sum(values) / len(values)
            critic_out = critic.call(
                "train_step",
                *[(protos[r], micro_batches(r, data[r]["values_out"])) for r in (0, 1)],
            )
            for name in critic_out[0]:
                values = [v for rank in critic_out for v in rank[name]]
                metrics[name] = sum(values) / len(values)
            metrics["mask/final_mask_sum_eq_0"] = 0
            manager = MetricsManager()  # the driver's metrics of the whole trained batch
            tensors, objects = driver_batch(step)
            manager.add_all_metrics(step, DataProto(batch=tensors, non_tensor_batch=objects))
            metrics.update(manager.get_metrics())
        pipeline.tracker.log(values=metrics, step=step)
        logged.append(metrics)
        if step == SKIPPED and records is not None:
            # Before any worker works again: the collector must not be waiting for them.
            logged[-1]["emitted_before_next_step"] = emitted(records, step, within_s=20.0)
    # No finish(): ROLL's pipelines never call it; the tracker closes at exit.


if __name__ == "__main__":
    main(sys.argv[1:])
