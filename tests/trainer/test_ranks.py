"""Exactness across ranks: the same batch trained by 1 and by 2 data-parallel ranks gives the
same pooled metrics and the same weights.

The two ranks run in threads with an in-process all-reduce (``ThreadComm``) around the very
``PolicyTrainer``/``ValueTrainer`` code the Ray workers run; the gloo path is covered by
``test_comm.py`` and the full run. Pooling uses the producer's own reduction
(``producer.reduce.reduce_value``), the state that crosses the wire.
"""

from __future__ import annotations

import copy
import math
import threading
from typing import Any

import pytest
import torch

from producer.reduce import reduce_value
from schemas import metrics as m
from schemas.metrics import CATALOG
from schemas.reductions import Reduction
from tests.trainer.conftest import ThreadComm, ThreadGroup
from trainer import emit
from trainer.batch import RolloutBatch, shard
from trainer.comm import LocalComm
from trainer.model import ValueModel, build_policy
from trainer.policy_trainer import PolicyTrainer
from trainer.value_trainer import ValueTrainer

Pooled = dict[str, list[float]]  # name -> [sum, weight, min, max]


def pool(calls: list[dict[str, Any]]) -> Pooled:
    """Merge every logged value the way the collector does (sum/weight add, extremes)."""
    out: Pooled = {}
    for call in calls:
        for name, value in call.items():
            s, w, lo, hi, _ = (
                reduce_value(value)
                if not isinstance(value, (int, float))
                else (float(value), 1.0, float(value), float(value), 0)
            )
            acc = out.setdefault(name, [0.0, 0.0, math.nan, math.nan])
            acc[0] += s
            acc[1] += w
            acc[2] = min(acc[2], lo) if not math.isnan(acc[2]) else lo
            acc[3] = max(acc[3], hi) if not math.isnan(acc[3]) else hi
    return out


def run_ranks(world: int, make_trainer, train, batch: RolloutBatch, mini_batches: int):
    """Train ``world`` replicas on their shards in threads; returns (logged calls, models)."""
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
    return [c for rank_calls in calls for c in rank_calls], [t.model for t in trainers]


def assert_same(one: Pooled, two: Pooled, rel: float = 1e-4) -> None:
    assert one.keys() == two.keys()
    for name in one:
        s1, w1, lo1, hi1 = one[name]
        s2, w2, lo2, hi2 = two[name]
        reduction = CATALOG.resolve(name).reduction
        if reduction is Reduction.LAST:
            assert s1 / w1 == s2 / w2, name  # each rank logs the same value once
            continue
        if reduction is Reduction.SUM:
            assert s1 == s2, name  # counts add up over ranks to the same total
            continue
        assert w1 == w2, name  # same tokens (or samples) in total
        assert s1 / max(w1, 1e-12) == pytest.approx(s2 / max(w2, 1e-12), rel=rel, abs=1e-6), name
        for a, b in ((lo1, lo2), (hi1, hi2)):
            assert (math.isnan(a) and math.isnan(b)) or a == pytest.approx(b, rel=rel), name


def test_policy_metrics_and_weights_match_across_1_and_2_ranks(
    tiny_cfg, tokenizer, filled_batch: RolloutBatch
) -> None:
    base = build_policy(tiny_cfg.model, tokenizer, seed=0)
    mb = tiny_cfg.ppo.mini_batches
    # The two shards hold different numbers of loss tokens, so a mean of per-rank means
    # would not equal the pooled mean: the test can tell them apart.
    parts = [shard(filled_batch, r, 2, mb).split(mb) for r in range(2)]
    counts = [[int(p.loss_mask.sum()) for p in rank_parts] for rank_parts in parts]
    assert all(c > 0 for rank in counts for c in rank)
    assert counts[0][0] != counts[1][0] and counts[0][1] != counts[1][1], counts

    def make(comm):
        return PolicyTrainer(copy.deepcopy(base), tiny_cfg.ppo, comm)

    def train(trainer: PolicyTrainer, part: RolloutBatch) -> list[dict[str, Any]]:
        result = trainer.train(part, kl_coef=0.05)
        calls = [emit.policy_step(s, f) for s, f in zip(result.policy, result.sft, strict=True)]
        return [*calls, emit.policy_shard(part, result.lr)]

    calls1, models1 = run_ranks(1, make, train, filled_batch, mb)
    calls2, models2 = run_ranks(2, make, train, filled_batch, mb)
    one, two = pool(calls1), pool(calls2)
    for entry in (
        m.ACTOR_PG_LOSS,
        m.ACTOR_KL_LOSS,
        m.ACTOR_CLIPFRAC,
        m.ACTOR_RATIO,
        m.ACTOR_POSITIVE_SFT_LOSS,
        m.ACTOR_VALID_SAMPLES,
        m.SYSTEM_STEP_TOKENS,
    ):
        assert entry.name in one
    assert_same(one, two)
    # The update moved the weights, and both replicas moved exactly like the single rank.
    start = dict(base.named_parameters())
    for name, p in models1[0].named_parameters():
        assert not torch.equal(p, start[name]) or "embed" in name
        for replica in models2:
            torch.testing.assert_close(
                dict(replica.named_parameters())[name], p, rtol=1e-4, atol=1e-5
            )


def test_critic_metrics_match_across_1_and_2_ranks(
    tiny_cfg, tokenizer, filled_batch: RolloutBatch
) -> None:
    base = ValueModel.from_policy(build_policy(tiny_cfg.model, tokenizer, seed=0))
    mb = tiny_cfg.ppo.mini_batches

    def make(comm):
        return ValueTrainer(copy.deepcopy(base), tiny_cfg.ppo, comm)

    def train(trainer: ValueTrainer, part: RolloutBatch) -> list[dict[str, Any]]:
        result = trainer.train(part)
        return [emit.value_step(s) for s in result.stats]

    calls1, _ = run_ranks(1, make, train, filled_batch, mb)
    calls2, _ = run_ranks(2, make, train, filled_batch, mb)
    one, two = pool(calls1), pool(calls2)
    assert one[m.CRITIC_LOSS.name][1] > 0
    assert_same(one, two)
