"""Exactness across ranks: the same batch trained by 1, 2 and 3 data-parallel ranks gives the
same merged metrics and the same weights.

The ranks run in threads with an in-process all-reduce (``ThreadComm``) around the very
``PolicyTrainer``/``ValueTrainer`` code the Ray workers run; the gloo path is covered by
``test_comm.py`` and the full run. The models are float64 but their logits and values come
out as float32 (``rlpulse.trainer.model``), so the ranks agree to float32 rounding (1e-6), far below
what a wrong weighting moves; ``test_split_ranks.py`` checks the merge itself to 1e-9 on
float64 inputs. What the ranks log is reduced and merged as the producer and the collector do
(``tests.trainer.conftest.collect``).
"""

from __future__ import annotations

import copy
import dataclasses
import math
import threading
from collections.abc import Callable
from typing import Any

import pytest
import torch

from rlpulse.schemas import metrics as m
from rlpulse.trainer import emit
from rlpulse.trainer.batch import RolloutBatch, shard
from rlpulse.trainer.comm import Comm, LocalComm
from rlpulse.trainer.config import LOSS_AGG_MODES, TrainerConfig
from rlpulse.trainer.model import ValueModel, build_policy
from rlpulse.trainer.policy_trainer import PolicyTrainer
from rlpulse.trainer.value_trainer import ValueTrainer
from tests.trainer.conftest import ThreadComm, ThreadGroup, collect

WORLDS = (1, 2, 3)
TOL = 1e-6


def run_ranks(
    world: int,
    make_trainer: Callable[[Comm], Any],
    train: Callable[[Any, RolloutBatch], list[dict[str, Any]]],
    batch: RolloutBatch,
    mini_batches: int,
) -> tuple[list[list[dict[str, Any]]], list[torch.nn.Module]]:
    """Train ``world`` replicas on their shards in threads; returns (each rank's logged calls,
    the models)."""
    group = ThreadGroup(world)
    calls: list[list[dict[str, Any]]] = [[] for _ in range(world)]
    trainers = [
        make_trainer(LocalComm() if world == 1 else ThreadComm(group, r)) for r in range(world)
    ]
    errors: list[BaseException] = []

    def body(rank: int) -> None:
        try:
            calls[rank] = train(trainers[rank], shard(batch, rank, world, mini_batches))
        except BaseException as exc:  # surfaced below, not lost in the thread
            errors.append(exc)

    threads = [threading.Thread(target=body, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    return calls, [t.model for t in trainers]


def assert_same(one: dict[str, float], other: dict[str, float], world: int) -> None:
    assert one.keys() == other.keys()
    apart = {
        k: (one[k], other[k])
        for k in one
        if not math.isclose(one[k], other[k], rel_tol=TOL, abs_tol=TOL)
    }
    assert not apart, f"{world} ranks differ from 1: {apart}"


@pytest.fixture(scope="module")
def batch12(filled_batch: RolloutBatch) -> RolloutBatch:
    """12 rows of the filled batch: 2 mini-batches split over 1, 2 or 3 ranks."""
    return filled_batch.select(torch.arange(12))


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_policy_metrics_and_weights_match_across_1_2_and_3_ranks(
    tiny_cfg: TrainerConfig, tokenizer, batch12: RolloutBatch, mode: str
) -> None:
    cfg = dataclasses.replace(tiny_cfg.ppo, loss_agg_mode=mode)
    base = build_policy(tiny_cfg.model, tokenizer, seed=0).double()
    mb = cfg.mini_batches
    # The ranks' shards hold different numbers of loss tokens and sequences, so a mean of
    # per-rank means would not equal the pooled mean: the test can tell them apart.
    counts = {int(shard(batch12, r, 3, mb).loss_mask.sum()) for r in range(3)}
    assert len(counts) == 3, counts

    def make(comm: Comm) -> PolicyTrainer:
        return PolicyTrainer(copy.deepcopy(base), cfg, comm)

    def train(trainer: PolicyTrainer, part: RolloutBatch) -> list[dict[str, Any]]:
        result = trainer.train(part, kl_coef=0.05)
        calls = [emit.policy_step(s, f) for s, f in zip(result.policy, result.sft, strict=True)]
        return [*calls, emit.policy_shard(part, result.lr)]

    runs = {world: run_ranks(world, make, train, batch12, mb) for world in WORLDS}
    merged = {world: collect(calls) for world, (calls, _) in runs.items()}
    one = merged[1]
    for entry in (m.ACTOR_PG_LOSS, m.ACTOR_KL_LOSS, m.ACTOR_CLIPFRAC, m.ACTOR_POSITIVE_SFT_LOSS):
        assert entry.name in one
    assert {"actor/ratio_mean", "actor/ratio_max", "actor/ratio_min"} <= one.keys()
    assert one[m.ACTOR_VALID_SAMPLES.name] == int(batch12.valid.sum())  # type: ignore[union-attr]
    for world in WORLDS[1:]:
        assert_same(one, merged[world], world)
    # The update moved the weights, and every replica moved exactly like the single rank.
    start = dict(base.named_parameters())
    single = runs[1][1][0]
    for name, p in single.named_parameters():
        assert not torch.equal(p, start[name]) or "embed" in name
        for world in WORLDS[1:]:
            for replica in runs[world][1]:
                torch.testing.assert_close(
                    dict(replica.named_parameters())[name], p, rtol=TOL, atol=TOL
                )


def test_critic_metrics_match_across_1_2_and_3_ranks(
    tiny_cfg: TrainerConfig, tokenizer, batch12: RolloutBatch
) -> None:
    base = ValueModel.from_policy(build_policy(tiny_cfg.model, tokenizer, seed=0)).double()
    mb = tiny_cfg.ppo.mini_batches

    def make(comm: Comm) -> ValueTrainer:
        return ValueTrainer(copy.deepcopy(base), tiny_cfg.ppo, comm)

    def train(trainer: ValueTrainer, part: RolloutBatch) -> list[dict[str, Any]]:
        return [emit.value_step(s) for s in trainer.train(part).stats]

    merged = {world: collect(run_ranks(world, make, train, batch12, mb)[0]) for world in WORLDS}
    assert merged[1][m.CRITIC_LOSS.name] > 0
    for world in WORLDS[1:]:
        assert_same(merged[1], merged[world], world)
