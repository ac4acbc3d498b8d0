"""verl's actor and critic updates on CPU, with verl's own loss functions, for the exact loss hook
(tests and the benchmark only; imported only when verl is installed).

verl 0.9 trains only on CUDA or NPU engines and generates only with vLLM, SGLang or TensorRT-LLM
servers, none of which runs here. What runs is the rest of a PPO step as verl's code does it:

* the driver: verl's ``RayPPOTrainer._update_actor`` and ``_update_critic`` (the real methods,
  called on a stand-in trainer holding verl's composed config and the step), which turn the
  batch into verl's no-padding TensorDict and hand it to the worker groups;
* the workers, two data-parallel ranks in Ray actors of the job (so Ray ran the setup hook in
  them): the loss bound as verl's ``ActorRolloutRefWorker.init_model`` binds it
  (``functools.partial(engine_workers.ppo_loss, config=...)``), the critic's sent by the driver
  as ``RayPPOTrainer`` sends it (``partial(value_loss, config=...)``); verl's mini-batch iterator
  (``tu.make_iterator``, shuffled for the critic), the global token count all-reduced over the
  ranks (gloo) and the micro-batches of ``prepare_micro_batches`` (dynamic batch size for the
  critic) as ``FSDPEngine.forward_backward_batch`` makes them;
  the model's log-probs and values are given (``new_log_probs``, ``vpreds`` in the batch), laid
  out as verl's model outputs (nested, shifted by one token);
* verl's aggregation of the workers' metrics: ``Metric.aggregate_dp`` per mini-batch
  (``TrainingWorker.train_mini_batch``), then the driver's ``reduce_metrics``.

``truth`` recomputes every metric in float64 over the step's tokens, from the batch alone.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import types
from collections import defaultdict
from functools import partial
from itertools import chain
from pathlib import Path
from typing import Any

import numpy as np
import ray
import torch
from omegaconf import DictConfig, OmegaConf
from verl import DataProto

PROMPT, RESPONSE = 4, 12
ROWS = 12
"""Rows of a step's batch: the first half goes to rank 0 (short responses), the rest to rank 1."""
OVERRIDES = [
    "algorithm.adv_estimator=gae",
    "actor_rollout_ref.rollout.n=1",
    "actor_rollout_ref.actor.ppo_mini_batch_size=6",  # 2 mini-batches of 3 rows per rank
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1",
    "actor_rollout_ref.actor.clip_ratio_high=0.28",
    "actor_rollout_ref.actor.clip_ratio_c=1.5",  # dual clip active on some tokens
    "actor_rollout_ref.actor.shuffle=false",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=1",
    "critic.ppo_mini_batch_size=6",
    "critic.ppo_micro_batch_size_per_gpu=1",
    "critic.shuffle=true",  # verl's shuffled mini-batches
    "trainer.n_gpus_per_node=2",
]
"""verl overrides of the job: a critic (GAE), asymmetric clipping, ragged micro-batches."""
EXACT = (
    "actor/pg_loss",
    "actor/pg_clipfrac",
    "actor/pg_clipfrac_lower",
    "actor/ppo_kl",
    "critic/vf_loss",
    "critic/vf_clipfrac",
    "critic/vpred_mean",
)


def stub_rollout_server_modules() -> None:
    """verl's ``ray_trainer`` imports its rollout router and server (cachetools, uvicorn,
    fastapi), which the CPU environment lacks and the update path never uses: empty stand-ins,
    only where the real module is missing."""

    def missing(name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return type(name, (), {"__init__": lambda self, *a, **k: None})

    for name in ("cachetools", "uvicorn", "fastapi"):
        if name not in sys.modules and importlib.util.find_spec(name) is None:
            module = types.ModuleType(name)
            module.__getattr__ = missing  # type: ignore[method-assign]
            sys.modules[name] = module


def make_batch(step: int) -> DataProto:
    """A step's batch in verl's padded layout (left-padded prompts, right-padded responses),
    with the model's new log-probs and value predictions given. Response lengths differ
    between the ranks and between their mini-batches."""
    g = torch.Generator().manual_seed(100 + step)
    half = ROWS // 2
    response_len = torch.cat(
        [
            torch.randint(1, 4, (half,), generator=g),  # rank 0: 1..3 tokens
            torch.randint(4, RESPONSE + 1, (half,), generator=g),  # rank 1: 4..12 tokens
        ]
    )
    response_len[half - 3 : half] = 1  # rank 0's second mini-batch: 1 token each
    prompt_len = torch.randint(1, PROMPT + 1, (ROWS,), generator=g)
    prompt_mask = (torch.arange(PROMPT) >= PROMPT - prompt_len[:, None]).long()
    response_mask = (torch.arange(RESPONSE) < response_len[:, None]).long()
    attention_mask = torch.cat([prompt_mask, response_mask], dim=1)
    position_ids = (attention_mask.cumsum(1) - 1).clamp(min=0)
    prompts = torch.randint(4, 40, (ROWS, PROMPT), generator=g)
    responses = torch.randint(4, 40, (ROWS, RESPONSE), generator=g)
    old = -torch.rand(ROWS, RESPONSE, generator=g) * 3
    values = torch.randn(ROWS, RESPONSE, generator=g)
    shape = (ROWS, RESPONSE)
    return DataProto.from_single_dict(
        {
            "prompts": prompts,
            "responses": responses,
            "input_ids": torch.cat([prompts, responses], dim=1),
            "attention_mask": attention_mask,
            "position_ids": position_ids,
            "response_mask": response_mask,
            "old_log_probs": old,
            "new_log_probs": old + 0.4 * torch.randn(shape, generator=g),
            "advantages": torch.randn(shape, generator=g),
            "values": values,
            "vpreds": values + 0.8 * torch.randn(shape, generator=g),
            "returns": values + torch.randn(shape, generator=g),
        }
    )


def truth(batch: DataProto, config: DictConfig) -> dict[str, float]:
    """Every exact metric over all the step's response tokens, in float64, from the batch."""
    b = {k: v.double() for k, v in batch.batch.items()}
    mask = b["response_mask"].bool()
    actor = config.actor_rollout_ref.actor
    low, high = actor.clip_ratio_low, actor.clip_ratio_high
    log_ratio = torch.clamp(b["new_log_probs"] - b["old_log_probs"], -20.0, 20.0)
    ratio, adv = torch.exp(log_ratio), b["advantages"]
    loss1, loss2 = -adv * ratio, -adv * torch.clamp(ratio, 1 - low, 1 + high)
    clipped = torch.maximum(loss1, loss2)
    loss3 = -adv * actor.clip_ratio_c
    pg = torch.where(adv < 0, torch.minimum(loss3, clipped), clipped)
    c = config.critic.cliprange_value
    vpred, values, returns = b["vpreds"], b["values"], b["returns"]
    vclipped = torch.clamp(vpred, values - c, values + c)
    vf1, vf2 = (vpred - returns) ** 2, (vclipped - returns) ** 2

    def mean(x: torch.Tensor) -> float:
        return (x.double() * mask).sum().item() / mask.sum().item()

    return {
        "actor/pg_loss": mean(pg),
        "actor/pg_clipfrac": mean(torch.gt(loss2, loss1)),
        "actor/pg_clipfrac_lower": mean(torch.gt(clipped, loss3) & (adv < 0)),
        "actor/ppo_kl": mean(-log_ratio),
        "critic/vf_loss": 0.5 * mean(torch.maximum(vf1, vf2)),
        "critic/vf_clipfrac": mean(torch.gt(vf2, vf1)),
        "critic/vpred_mean": mean(vpred),
    }


def model_output(padded: torch.Tensor, micro_batch: Any) -> torch.Tensor:
    """``padded`` (rows, response) as verl's model outputs: one jagged row per sequence of its
    prompt and response tokens, the response's values shifted left by one token."""
    attention = micro_batch["attention_mask"]
    prompt = micro_batch["prompts"].shape[1]
    response_len = attention[:, prompt:].sum(1)
    lengths = attention.sum(1)
    offsets = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)])
    values = torch.zeros(int(lengths.sum()), dtype=padded.dtype)
    for i in range(len(lengths)):
        end, n = int(offsets[i + 1]), int(response_len[i])
        values[end - n - 1 : end - 1] = padded[i, :n]
    return torch.nested.nested_tensor_from_jagged(values.requires_grad_(), offsets=offsets)


def critic_config(config: DictConfig) -> Any:
    """verl's critic config object, as ``RayPPOTrainer`` builds it, without its model section
    (the model is not built here; the loss does not read it)."""
    from verl.utils.config import omega_conf_to_dataclass

    section = OmegaConf.to_container(config.critic, resolve=True)
    section.pop("model")
    return omega_conf_to_dataclass(OmegaConf.create(section))


@ray.remote(num_cpus=0)
class Rank:
    """One data-parallel rank of verl's actor and critic workers (``RANK``, ``WORLD_SIZE`` set as
    verl's worker group sets them)."""

    def __init__(self, config: DictConfig, port: int) -> None:
        import torch.distributed as dist
        from verl.utils.config import omega_conf_to_dataclass

        stub_rollout_server_modules()
        from verl.workers import engine_workers

        self.rank, self.world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        dist.init_process_group(
            "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=self.rank, world_size=self.world
        )
        # ActorRolloutRefWorker.init_model: the loss bound once, at worker init.
        actor_config = omega_conf_to_dataclass(config.actor_rollout_ref.actor)
        self.actor_loss = partial(engine_workers.ppo_loss, config=actor_config)
        self.critic_loss = None
        self.hooked = bool(getattr(engine_workers.ppo_loss, "_rlpulse_loss_hook", False))

    def actor_hooked(self) -> bool:
        return self.hooked

    def set_loss_fn(self, loss_fn: Any) -> bool:
        """``critic_wg.set_loss_fn``: the driver's ``partial(value_loss, config=...)``."""
        self.critic_loss = loss_fn
        return bool(getattr(loss_fn.func, "_rlpulse_loss_hook", False))

    def train_mini_batch(self, data: Any, role: str) -> list[dict[str, Any]]:
        """``TrainingWorker.train_mini_batch`` and ``FSDPEngine.forward_backward_batch``, with the
        model's outputs given: per mini-batch, verl's metrics of each micro-batch."""
        import torch.distributed as dist
        from verl.utils import tensordict_utils as tu
        from verl.utils.metric import Metric
        from verl.workers.engine.utils import prepare_micro_batches

        loss_fn = self.actor_loss if role == "actor" else self.critic_loss
        mini_batch_size = tu.pop(data, key="mini_batch_size")
        epochs = tu.pop(data, key="epochs", default=1)
        seed = tu.pop(data, key="seed", default=42)
        loader = tu.pop(data, key="dataloader_kwargs", default={})
        iterator = tu.make_iterator(
            data,
            mini_batch_size=mini_batch_size // self.world,
            epochs=epochs,
            seed=seed + self.rank,
            dataloader_kwargs=loader,
        )
        outputs = []
        for mini_batch in iterator:
            tokens = mini_batch["loss_mask"].sum()
            dist.all_reduce(tokens)  # verl's, for the loss's global normalisation
            tu.assign_non_tensor(mini_batch, batch_num_tokens=tokens.item(), dp_size=self.world)
            # the actor: one row per micro-batch; the critic: verl's dynamic batch size (rows
            # regrouped by token count; as many micro-batches on every rank, which verl agrees
            # on with a CUDA all-reduce: fixed here)
            tu.assign_non_tensor(
                mini_batch,
                use_dynamic_bsz=role == "critic",
                max_token_len_per_gpu=24,
                micro_batch_size_per_gpu=1,
            )
            micro_batches, _ = prepare_micro_batches(
                mini_batch, same_micro_num_in_dp=True, min_num_micro_batch=3
            )
            metrics: dict[str, Any] = defaultdict(list)
            for micro in micro_batches:
                if role == "actor":
                    output = {"log_probs": model_output(micro["new_log_probs"], micro)}
                else:
                    output = {"values": model_output(micro["vpreds"], micro)}
                loss, micro_metrics = loss_fn(model_output=output, data=micro, dp_group=None)
                loss.backward()
                for key, value in micro_metrics.items():
                    if isinstance(value, Metric):
                        metrics.setdefault(key, Metric(value.aggregation)).extend(value)
                    else:
                        metrics[key].append(value)
            outputs.append(dict(metrics))
        return outputs

    def producers_closed(self) -> int:
        """Close this process's worker producers (what the process's exit does); how many."""
        from rlpulse.producer.integrations import verl as rlpulse_verl

        producers = list(rlpulse_verl._WORKER_PRODUCERS.values())
        for producer in producers:
            producer.close()
        return len(producers)


class WorkerGroup:
    """The driver's handle on the ranks, as verl's worker groups dispatch: the batch split in
    contiguous chunks, one per rank; the metrics gathered as ``train_mini_batch`` does
    (``Metric.aggregate_dp`` over ranks per mini-batch)."""

    def __init__(self, ranks: list[Any], role: str) -> None:
        self.ranks, self.role = ranks, role

    def set_loss_fn(self, loss_fn: Any) -> list[bool]:
        return ray.get([r.set_loss_fn.remote(loss_fn) for r in self.ranks])

    def update_actor(self, data: Any) -> Any:
        return self._train(data)

    def train_mini_batch(self, data: Any) -> Any:
        result = self._train(data)
        return types.SimpleNamespace(get=lambda: result)

    def _train(self, data: Any) -> Any:
        from verl.utils import tensordict_utils as tu
        from verl.utils.metric import Metric
        from verl.utils.py_functional import append_to_dict

        shards = tu.chunk_tensordict(data, len(self.ranks))
        per_rank = ray.get(
            [
                r.train_mini_batch.remote(s, self.role)
                for r, s in zip(self.ranks, shards, strict=True)
            ]
        )
        metrics: dict[str, list] = {}
        for mini_batches in zip(*per_rank, strict=True):
            output = {}
            for key in mini_batches[0]:
                values = [m[key] for m in mini_batches]
                output[key] = (
                    Metric.aggregate_dp(values)
                    if isinstance(values[0], Metric)
                    else list(chain.from_iterable(values))
                )
            append_to_dict(metrics, output)
        metrics["mfu"] = [0.0]
        return tu.get_tensordict(tensor_dict={}, non_tensor_dict={"metrics": metrics})


def run_steps(config: DictConfig, steps: int, port: int, tracking: Any = None) -> dict[str, Any]:
    """``steps`` PPO updates (actor and critic) on two ranks through verl's own update methods;
    verl's reduced metrics of each step (what ``fit()`` logs) are logged to ``tracking``.
    Returns verl's values, the truth, and what the ranks said about the hook."""
    import time

    from verl.utils.metric import reduce_metrics
    from verl.workers.utils.losses import value_loss

    stub_rollout_server_modules()
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer

    ranks = [
        Rank.options(runtime_env={"env_vars": {"RANK": str(r), "WORLD_SIZE": "2"}}).remote(
            config, port
        )
        for r in range(2)
    ]
    # RayPPOTrainer.init_workers: the critic's loss, bound on the driver, sent to the workers.
    critic_hooked = ray.get(
        [r.set_loss_fn.remote(partial(value_loss, config=critic_config(config))) for r in ranks]
    )
    trainer = types.SimpleNamespace(
        config=config,
        actor_rollout_wg=WorkerGroup(ranks, "actor"),
        critic_wg=WorkerGroup(ranks, "critic"),
        global_steps=0,
    )
    verl_values, truths, seconds = {}, {}, []
    for step in range(1, steps + 1):
        trainer.global_steps = step
        batch = make_batch(step)
        start = time.perf_counter()
        critic = RayPPOTrainer._update_critic(trainer, batch)
        actor = RayPPOTrainer._update_actor(trainer, batch)
        seconds.append(time.perf_counter() - start)
        metrics = {
            **reduce_metrics(critic.meta_info["metrics"]),
            **reduce_metrics(actor.meta_info["metrics"]),
        }
        if tracking is not None:
            tracking.log(data=metrics, step=step)
        verl_values[step] = {k: float(np.asarray(metrics[k])) for k in EXACT if k in metrics}
        truths[step] = truth(make_batch(step), config)
        meta_left = sorted(batch.meta_info)
    closed = ray.get([r.producers_closed.remote() for r in ranks])
    return {
        "verl": verl_values,
        "truth": truths,
        "step_s": seconds,
        "actor_hooked": ray.get([r.actor_hooked.remote() for r in ranks]),
        "critic_hooked": critic_hooked,
        "producers": closed,
        "meta_left": meta_left,
    }


@ray.remote
class UpdateTaskRunner:
    """Given to verl's ``run_ppo`` as its ``task_runner_class``: in the Ray actor where verl's
    PPO driver runs (Ray ran the setup hook here and in the ranks), build ``Tracking`` as
    ``fit()`` does and run :func:`run_steps`; the result goes to the JSON file ``PROBE_OUT``."""

    def run(self, config: DictConfig) -> None:
        from verl.utils.tracking import Tracking

        steps = int(os.environ.get("STEPS", "2"))
        tracking = None
        if os.environ.get("WITH_TRACKING", "1") == "1":
            tracking = Tracking(
                project_name=config.trainer.project_name,
                experiment_name=config.trainer.experiment_name,
                default_backend=config.trainer.logger,
                config=OmegaConf.to_container(config, resolve=True),
            )
        result = run_steps(config, steps, int(os.environ["GLOO_PORT"]), tracking)
        if tracking is not None:
            tracking.finish()
        with open(os.environ["PROBE_OUT"], "w") as f:
            json.dump(result, f)


def local_micro_batches(batch: DataProto, step: int, run: str = "r") -> list[Any]:
    """The micro-batches (one rank of one, 3 rows each) of ``batch`` as verl's engine hands them
    to the loss, with the step and run the hooked driver adds."""
    from verl.utils import tensordict_utils as tu
    from verl.workers.engine.utils import prepare_micro_batches
    from verl.workers.utils.padding import left_right_2_no_padding

    td = left_right_2_no_padding(batch.to_tensordict())
    tu.assign_non_tensor(
        td,
        global_batch_size=len(batch),
        global_steps=step,
        rlpulse={"step": step, "run": run, "address": None},
        dp_size=1,
        batch_num_tokens=int(td["loss_mask"].sum()),
        use_dynamic_bsz=False,
        micro_batch_size_per_gpu=3,
    )
    micro_batches, _ = prepare_micro_batches(td, same_micro_num_in_dp=True)
    return list(micro_batches)


SETUP_HOOK = (
    "+ray_kwargs.ray_init.runtime_env.worker_process_setup_hook="
    "rlpulse.producer.integrations.verl.register"
)
ENV = "+ray_kwargs.ray_init.runtime_env.env_vars"


def run_job(
    work: Path, run: str, steps: int, overrides: list[str], address: str | None
) -> dict[str, Any]:
    """:class:`UpdateTaskRunner` through verl's ``run_ppo`` on a local Ray (loopback only, no
    dashboard), with ``overrides`` (the logger, the setup hook...); the job's result."""
    import socket

    from hydra import compose, initialize_config_module
    from verl.trainer.main_ppo import run_ppo

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    probe = work / f"{run}.json"
    overrides = [
        *OVERRIDES,
        *overrides,
        "trainer.project_name=rlpulse-tests",
        f"trainer.experiment_name={run}",
        f"{ENV}.PROBE_OUT={probe}",
        f"{ENV}.GLOO_PORT='{port}'",
        f"{ENV}.STEPS='{steps}'",
        f"+trainer.rlpulse.config_dir='{work}/runs/{{run}}'",
        "ray_kwargs.ray_init.num_cpus=2",
        "+ray_kwargs.ray_init.include_dashboard=false",
        "+ray_kwargs.ray_init._node_ip_address=127.0.0.1",
        "+ray_kwargs.ray_init.address=local",  # a cluster of its own, never another's on /tmp/ray
    ]
    if address is not None:
        overrides.append(f"{ENV}.RLPULSE_ADDRESS={address}")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    with initialize_config_module("verl.trainer.config", version_base=None):
        config = compose("ppo_trainer", overrides=overrides)
    try:
        run_ppo(config, task_runner_class=UpdateTaskRunner)
    finally:
        ray.shutdown()
    return json.loads(probe.read_text())
