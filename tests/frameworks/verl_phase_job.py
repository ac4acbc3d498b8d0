"""verl's PPO step on CPU through verl's own driver methods and worker classes, for the phase,
sample and mismatch hooks (tests only; imported only when verl is installed).

verl 0.9 trains only on CUDA or NPU engines, so the model is the one thing given: a
:class:`CpuEngine` (a ``BaseEngine`` of verl's) whose "forward" lays out log-probs and values
the batch carries (``policy_log_probs``, ``policy_values``) as verl's model outputs, and which
moves nothing but counts its loads (``to``) when offloading is on. Everything around it is
verl's:

* the driver: ``RayPPOTrainer._compute_old_log_prob``, ``_compute_ref_log_prob``,
  ``_compute_values``, ``_update_critic``, ``_update_actor`` (the real methods, on a stand-in
  trainer holding verl's composed config, the step and a tokenizer), in ``fit()``'s order,
  batches joined with ``DataProto.union``;
* the workers, two ranks in Ray actors of a job whose setup hook is ``register`` (``RANK`` and
  ``WORLD_SIZE`` as verl's worker group sets them, gloo between them): verl's
  ``ActorRolloutRefWorker`` (actor and reference) and ``TrainingWorker`` (critic) with their
  own methods (``compute_log_prob``, ``compute_ref_log_prob``, ``update_actor``,
  ``update_weights``, ``infer_batch``, ``train_mini_batch``), their engine contexts
  (``BaseEngineCtx``: the offload moves), verl's micro-batches, loss functions and
  ``postprocess_batch_func``; built around the engine without their ``init_model`` (which
  builds CUDA engines);
* the dispatch: verl's own split of a batch over the ranks (``_split_args_kwargs_data_proto``)
  and concatenation of their outputs (``_concat_data_proto_or_future``);
* the generation: verl's ``AgentLoopManager`` and two ``AgentLoopWorker`` actors running its
  single-turn agent loop (chat template, tokens, padding, its output batch); the vLLM server
  they would call is a stand-in (:class:`Server`) answering every prompt with the same tokens.
"""

from __future__ import annotations

import json
import os
import time
import types
from contextlib import nullcontext
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import ray
import torch
from omegaconf import DictConfig
from verl import DataProto
from verl.workers.engine.base import BaseEngine, BaseEngineCtx

from tests.frameworks.verl_loss_job import critic_config, model_output, stub_rollout_server_modules

stub_rollout_server_modules()  # verl's agent loop imports its servers' modules, absent here
from verl.experimental.agent_loop.agent_loop import (  # noqa: E402
    AgentLoopManager,
    AgentLoopWorker,
)
from verl.workers.rollout.replica import TokenOutput  # noqa: E402

PROMPT, RESPONSE, ROWS = 4, 8, 8
LOAD_S = 0.02
"""How long the stand-in engine's every move between the CPU and the device takes."""
OVERRIDES = [
    "algorithm.adv_estimator=gae",
    "actor_rollout_ref.rollout.n=1",
    "actor_rollout_ref.actor.use_kl_loss=true",  # a reference policy
    "actor_rollout_ref.actor.ppo_mini_batch_size=4",  # 2 mini-batches of 2 rows per rank
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2",
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=2",
    "critic.ppo_mini_batch_size=4",
    "critic.ppo_micro_batch_size_per_gpu=1",
    "trainer.n_gpus_per_node=2",
]


class CpuEngine(BaseEngine):
    """verl's engine interface on CPU with the model's outputs given (see the module text)."""

    def __init__(self, kind: str, offload: bool) -> None:
        self.kind = kind
        self.offload = offload
        self.moves: list[str] = []
        self.mode = None

    @property
    def is_param_offload_enabled(self) -> bool:
        return self.offload

    @property
    def is_optimizer_offload_enabled(self) -> bool:
        return self.offload

    def initialize(self) -> None:
        pass

    def train_mode(self, **kwargs: Any) -> BaseEngineCtx:
        return BaseEngineCtx(self, "train", **kwargs)

    def eval_mode(self, **kwargs: Any) -> BaseEngineCtx:
        return BaseEngineCtx(self, "eval", **kwargs)

    def to(
        self, device: str, model: bool = True, optimizer: bool = True, grad: bool = True
    ) -> None:
        self.moves.append(device)
        time.sleep(LOAD_S)

    def get_data_parallel_rank(self) -> int:
        return torch.distributed.get_rank()

    def get_data_parallel_size(self) -> int:
        return torch.distributed.get_world_size()

    def get_data_parallel_group(self) -> Any:
        return torch.distributed.group.WORLD

    def is_mp_src_rank_with_outputs(self) -> bool:
        return True

    def disable_adapter(self) -> Any:
        return nullcontext()

    def optimizer_zero_grad(self) -> None:
        pass

    def optimizer_step(self) -> float:
        return 0.0

    def lr_scheduler_step(self) -> float:
        return 1e-6

    def get_per_tensor_param(self, **kwargs: Any) -> Any:
        return iter([("lm_head.weight", torch.zeros(2, 2))]), None

    def forward_backward_batch(
        self, data: Any, loss_function: Any, forward_only: bool = False
    ) -> Any:
        """As verl's FSDP engine: the global token count (gloo all-reduce), verl's
        micro-batches, the loss function on each, backward, ``postprocess_batch_func``."""
        from verl.utils import tensordict_utils as tu
        from verl.workers.engine.utils import postprocess_batch_func, prepare_micro_batches

        tokens = data["loss_mask"].sum()
        torch.distributed.all_reduce(tokens)
        tu.assign_non_tensor(
            data, batch_num_tokens=tokens.item(), dp_size=self.get_data_parallel_size()
        )
        micro_batches, indices = prepare_micro_batches(data=data, same_micro_num_in_dp=True)
        outputs = []
        for micro in micro_batches:
            if self.kind == "value_model":
                out = {"values": model_output(micro["policy_values"], micro)}
            else:
                out = {
                    "log_probs": model_output(micro["policy_log_probs"], micro),
                    "entropy": model_output(-micro["policy_log_probs"], micro),
                }
            if loss_function is not None:
                loss, metrics = loss_function(model_output=out, data=micro, dp_group=None)
            else:
                loss, metrics = torch.zeros(()), {}
            if not forward_only:
                loss.backward()
            detached = {k: v.detach() for k, v in out.items()}
            outputs.append(
                {"model_output": detached, "loss": loss.detach().item(), "metrics": metrics}
            )
        return postprocess_batch_func(output_lst=outputs, indices=indices, data=data)


def make_batch(step: int) -> DataProto:
    """A step's batch after generation and scoring, in verl's padded layout: left-padded
    prompts (two rollouts of each), right-padded responses, the engine's log-probs of the sampled tokens
    (``rollout_log_probs``), the model's (``policy_log_probs``: what the trainer's forward
    gives) and values, scores and advantages; the weights' version of each sample
    (``max_global_steps``), half of them a step behind."""
    g = torch.Generator().manual_seed(200 + step)
    response_len = torch.randint(1, RESPONSE + 1, (ROWS,), generator=g)
    prompt_len = torch.randint(1, PROMPT + 1, (ROWS // 2,), generator=g).repeat_interleave(2)
    prompt_mask = (torch.arange(PROMPT) >= PROMPT - prompt_len[:, None]).long()
    response_mask = (torch.arange(RESPONSE) < response_len[:, None]).long()
    attention_mask = torch.cat([prompt_mask, response_mask], dim=1)
    # two rollouts of each prompt, as GRPO's n = 2 gives them
    prompts = torch.randint(4, 30, (ROWS // 2, PROMPT), generator=g).repeat_interleave(2, 0)
    prompts *= prompt_mask
    responses = torch.randint(4, 30, (ROWS, RESPONSE), generator=g) * response_mask
    policy = -torch.rand(ROWS, RESPONSE, generator=g) * 3
    scores = torch.zeros(ROWS, RESPONSE)
    scores[torch.arange(ROWS), response_len - 1] = torch.rand(ROWS, generator=g)
    shape = (ROWS, RESPONSE)
    batch = DataProto.from_single_dict(
        {
            "prompts": prompts,
            "responses": responses,
            "input_ids": torch.cat([prompts, responses], dim=1),
            "attention_mask": attention_mask,
            "position_ids": (attention_mask.cumsum(1) - 1).clamp(min=0),
            "response_mask": response_mask,
            "rollout_log_probs": policy + 0.05 * torch.randn(shape, generator=g),
            "policy_log_probs": policy,
            "policy_values": torch.randn(shape, generator=g),
            "token_level_scores": scores,
            "token_level_rewards": scores,
            "advantages": torch.randn(shape, generator=g) * response_mask,
            "returns": torch.randn(shape, generator=g) * response_mask,
        }
    )
    versions = np.array([step - 1 - (i % 2) for i in range(ROWS)], dtype=object)
    batch.non_tensor_batch["max_global_steps"] = versions
    batch.non_tensor_batch["uid"] = np.array([f"u{step}-{i}" for i in range(ROWS)], dtype=object)
    batch.meta_info["global_token_num"] = attention_mask.sum(-1).tolist()
    return batch


class Server:
    """A stand-in for verl's vLLM servers, the LLM client its agent loop workers call: every
    prompt is answered with the tokens ``w5 w6 </s>`` and their log-probs."""

    async def generate(
        self, request_id: str, prompt_ids: Any, sampling_params: Any, **kw: Any
    ) -> Any:
        return TokenOutput(token_ids=[5, 6, 2], log_probs=[-0.5, -1.0, -0.25], extra_fields={})


class AgentWorker(AgentLoopWorker):
    """verl's agent loop worker, as a class of this module: a Ray worker process imports this
    module (which stands in for the servers' modules) before verl's agent loop."""


class AgentManager(AgentLoopManager):
    """verl's ``AgentLoopManager``, starting :class:`AgentWorker` actors (verl's hook for a
    worker class of one's own). The Ray actor class is made here, when the manager is, as
    verl's is: in the driver, after the setup hook (Ray copies the class's methods then)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.agent_loop_workers_class = ray.remote(AgentWorker)
        super().__init__(*args, **kwargs)


def generation_batch(step: int) -> DataProto:
    """Four prompts as verl's dataset gives them to the rollout (``raw_prompt`` messages), at
    the driver's step."""
    prompts = [[{"role": "user", "content": f"w{4 + i} w{10 + i}"}] for i in range(4)]
    return DataProto.from_single_dict(
        {"raw_prompt": np.array(prompts, dtype=object)}, meta_info={"global_steps": step}
    )


def close_producers(worker: Any) -> list[str]:
    """Run in a worker actor (``__ray_call__``): close its process's worker producers (what
    the process's exit does); their roles."""
    from rlpulse.producer.integrations import verl as rlpulse_verl

    for producer in rlpulse_verl._WORKER_PRODUCERS.values():
        producer.close()
    return sorted(key[0] for key in rlpulse_verl._WORKER_PRODUCERS)


class Sender:
    """A stand-in for verl's checkpoint engine: ``update_weights`` outside verl's "naive" mode
    hands the weights to it (verl's disaggregated path)."""

    async def send_weights(self, params: Any, global_steps: Any = None) -> dict[str, Any]:
        for _ in params:
            pass
        return {}


class Workers:
    """One rank of verl's hybrid actor-and-reference worker and of its critic worker (a Ray
    actor as :data:`Rank`, or in the test's process)."""

    def __init__(self, config: DictConfig, port: int, actor_offload: bool) -> None:
        stub_rollout_server_modules()
        from verl.workers import engine_workers as ew
        from verl.workers.utils.losses import ppo_loss

        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        torch.distributed.init_process_group(
            "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
        )
        from verl.utils.config import omega_conf_to_dataclass

        actor_config = omega_conf_to_dataclass(config.actor_rollout_ref.actor)
        self.actor = training_worker(ew, CpuEngine("language_model", actor_offload))
        self.actor.loss_fn = partial(ppo_loss, config=actor_config)
        self.hybrid = object.__new__(ew.ActorRolloutRefWorker)
        self.hybrid.__dict__.update(
            actor=self.actor,
            ref=training_worker(ew, CpuEngine("language_model", False)),
            config=config.actor_rollout_ref,
            enable_routing_replay=False,
            checkpoint_engine=Sender(),
            profiler=None,
        )
        self.critic = training_worker(ew, CpuEngine("value_model", False))

    def set_loss_fn(self, loss_fn: Any) -> None:
        self.critic.set_loss_fn(loss_fn)

    def call(self, worker: str, method: str, data: Any) -> Any:
        return getattr(getattr(self, worker), method)(data)

    async def update_weights(self, step: int) -> Any:
        return await self.hybrid.update_weights(global_steps=step, mode="rlpulse-test")

    def moves(self) -> list[str]:
        return list(self.actor.engine.moves)

    def producers_closed(self) -> list[str]:
        return close_producers(self)


Rank = ray.remote(num_cpus=0)(Workers)


def training_worker(ew: Any, engine: CpuEngine) -> Any:
    """verl's ``TrainingWorker`` around ``engine``, as its ``__init__`` leaves it (engine
    settings: a micro-batch of 1 row to train, 2 to infer)."""
    from verl.utils.profiler import DistProfiler

    worker = object.__new__(ew.TrainingWorker)
    worker.__dict__.update(
        engine=engine,
        engine_config=types.SimpleNamespace(
            use_dynamic_bsz=False,
            max_token_len_per_gpu=None,
            infer_max_token_len_per_gpu=None,
            micro_batch_size_per_gpu=1,
            infer_micro_batch_size_per_gpu=2,
            use_fused_kernels=False,
            forward_only=False,
        ),
        model_config={"use_remove_padding": True},
        flops_counter=types.SimpleNamespace(estimate_flops=lambda *a, **k: (0.0, 1.0)),  # mfu 0
        device_name="cpu",
        loss_fn=None,
        profiler=DistProfiler(rank=torch.distributed.get_rank(), config=None),  # disabled
    )
    return worker


def on_ray(ranks: list[Any], worker: str, method: str, shards: list[Any]) -> list[Any]:
    """Each shard to its rank's Ray actor, at once."""
    return ray.get([r.call.remote(worker, method, s) for r, s in zip(ranks, shards, strict=True)])


class WorkerGroup:
    """The driver's handle on one worker of every rank, dispatching as verl's ``nd`` compute
    modes do (the batch split in contiguous chunks, the outputs concatenated); ``invoke``
    runs the shards (:func:`on_ray`, or in the test's process)."""

    def __init__(self, ranks: list[Any], worker: str, invoke: Any = on_ray) -> None:
        self.ranks, self.worker, self.invoke = ranks, worker, invoke

    def _call(self, method: str, data: Any) -> Any:
        from verl.single_controller.base.decorator import (
            _concat_data_proto_or_future,
            _split_args_kwargs_data_proto,
        )

        (shards,), _ = _split_args_kwargs_data_proto(len(self.ranks), data)
        return _concat_data_proto_or_future(self.invoke(self.ranks, self.worker, method, shards))

    def __getattr__(self, method: str) -> Any:
        call = partial(self._call, method)
        if method in ("infer_batch", "train_mini_batch"):  # verl's blocking=False: a future
            return lambda data: types.SimpleNamespace(get=lambda: call(data))
        return call


def run_steps(config: DictConfig, steps: int, port: int, tracking: Any, offload: bool) -> dict:
    """``steps`` PPO steps through verl's driver methods on two ranks; verl's update metrics
    are logged to ``tracking`` as ``fit()`` logs them. Returns what the test checks against."""
    from transformers import AutoTokenizer

    stub_rollout_server_modules()
    from verl.workers.utils.losses import value_loss

    ranks = [
        Rank.options(runtime_env={"env_vars": {"RANK": str(r), "WORLD_SIZE": "2"}}).remote(
            config, port, offload
        )
        for r in range(2)
    ]
    ray.get(
        [r.set_loss_fn.remote(partial(value_loss, config=critic_config(config))) for r in ranks]
    )
    trainer = stand_in_trainer(
        config, ranks, AutoTokenizer.from_pretrained(os.environ["TOKENIZER_DIR"])
    )
    rollout = AgentManager.create(config=config, llm_client=Server())
    batches = {}
    for step in range(1, steps + 1):
        generated = rollout.generate_sequences(generation_batch(step))
        assert len(generated) == 4
        batch, metrics = ppo_step(trainer, step)
        ray.get([r.update_weights.remote(step) for r in ranks])
        if tracking is not None:
            tracking.log(data=metrics, step=step)
        batches[step] = {k: v.tolist() for k, v in batch.batch.items()}
        batches[step]["max_global_steps"] = batch.non_tensor_batch["max_global_steps"].tolist()
    return {
        "batches": batches,
        "moves": ray.get(ranks[0].moves.remote()),
        "roles": ray.get([r.producers_closed.remote() for r in ranks]),
        "rollout_roles": ray.get(
            [w.__ray_call__.remote(close_producers) for w in rollout.agent_loop_workers]
        ),
    }


def stand_in_trainer(
    config: DictConfig, ranks: list[Any], tokenizer: Any, invoke: Any = on_ray
) -> Any:
    """What verl's ``RayPPOTrainer`` methods read of their trainer: its config, step, tokenizer
    and worker groups (the reference in its own group of the same ranks)."""
    return types.SimpleNamespace(
        config=config,
        global_steps=0,
        ref_in_actor=False,
        tokenizer=tokenizer,
        actor_rollout_wg=WorkerGroup(ranks, "hybrid", invoke),
        ref_policy_wg=WorkerGroup(ranks, "hybrid", invoke),
        critic_wg=WorkerGroup(ranks, "critic", invoke),
    )


def ppo_step(trainer: Any, step: int) -> tuple[DataProto, dict[str, Any]]:
    """One step of ``fit()``'s worker calls through verl's driver methods (the weight update
    is the caller's): the batch it trained on and verl's reduced update metrics."""
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer
    from verl.utils.metric import reduce_metrics

    trainer.global_steps = step
    batch = make_batch(step)
    old, _ = RayPPOTrainer._compute_old_log_prob(trainer, batch)
    batch = batch.union(old)
    batch = batch.union(RayPPOTrainer._compute_ref_log_prob(trainer, batch))
    batch = batch.union(RayPPOTrainer._compute_values(trainer, batch))
    critic = RayPPOTrainer._update_critic(trainer, batch)
    actor = RayPPOTrainer._update_actor(trainer, batch)
    metrics = {
        **reduce_metrics(critic.meta_info["metrics"]),
        **reduce_metrics(actor.meta_info["metrics"]),
    }
    return batch, metrics


def write_model(directory: Path) -> Path:
    """A model directory verl's model config reads (a tiny Llama's ``config.json``, no
    weights) with :func:`write_tokenizer`'s tokenizer."""
    from transformers import LlamaConfig

    write_tokenizer(directory)
    LlamaConfig(
        vocab_size=40,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=64,
        architectures=["LlamaForCausalLM"],
    ).save_pretrained(directory)
    return directory


def write_tokenizer(directory: Path) -> Path:
    """A word-level tokenizer of ``w4``...``w39`` (and four special tokens) with a plain chat
    template, saved for ``AutoTokenizer`` (nothing downloaded)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, "<unk>": 3, **{f"w{i}": i for i in range(4, 40)}}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core,
        pad_token="<pad>",
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
    )
    # each message's content, then the generation prompt (nothing): what verl's agent loop
    # applies to a conversation before sending its tokens to the server
    tokenizer.chat_template = "{% for m in messages %}{{ m['content'] }} {% endfor %}"
    tokenizer.save_pretrained(directory)
    return directory


def dump(result: dict, path: Path) -> None:
    path.write_text(json.dumps(result))
