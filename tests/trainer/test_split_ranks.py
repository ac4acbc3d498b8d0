"""One ragged batch split over 1, 2 and 3 data-parallel ranks: every merged metric is the same
within 1e-9, and equals the peers' formula applied to the whole batch.

Each rank runs the trainer's loss functions (:mod:`rlpulse.trainer.ppo`) on its shard
(:func:`rlpulse.trainer.batch.shard_indices`) with the global scale of each mini-batch, as the trainers
do after their all-reduce; :mod:`rlpulse.trainer.emit` turns the stats into producer values, which are
reduced as a producer reduces them (:func:`rlpulse.producer.reduce.reduce_value`) and merged by the
collector's own :class:`~rlpulse.collector.runs.aggregator.Aggregator`. The expected values are computed in
numpy over the whole batch, written from verl's formulation (``compute_policy_loss_vanilla``,
``agg_loss``, ``kl_penalty``) and ROLL's (``agg_loss``, ``compute_approx_kl``, the critic's
``loss_func``), independently of :mod:`rlpulse.trainer.ppo`.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
import torch
from torch import Tensor

from rlpulse.schemas import metrics as m
from rlpulse.trainer import emit, ppo
from rlpulse.trainer.batch import RolloutBatch, shard_indices
from rlpulse.trainer.config import LOSS_AGG_MODES
from tests.trainer.conftest import collect

LENGTHS = [7, 3000, 12, 950, 31, 2999, 64, 8, 1500, 300, 7, 77]
LENGTHS += [2048, 19, 640, 9, 1200, 45, 2500, 16, 700, 3000, 150, 11]
B, WIDTH, MINI_BATCHES = len(LENGTHS), max(LENGTHS), 2
# Rows 0-3 are rank 0's whole part of mini-batch 0 when 3 ranks share it: that rank has no
# loss token there, and its extremes and shares must not disturb the merge.
INVALID = [0, 1, 2, 3, 13]
CLIP_LOW, CLIP_HIGH, CLIP_C, VALUE_CLIP = 0.2, 0.28, 3.0, 0.2
KL_COEF, ENTROPY_COEF, SFT_COEF = 0.05, 0.01, 0.1
TOL = 1e-9


def ragged() -> dict[str, Any]:
    """Per-token and per-sample fields of the whole batch, float64."""
    g = torch.Generator().manual_seed(11)

    def randn(*shape: int) -> Tensor:
        return torch.randn(*shape, generator=g, dtype=torch.float64)

    mask = (torch.arange(WIDTH) < torch.tensor(LENGTHS).unsqueeze(-1)).double()
    valid = torch.ones(B, dtype=torch.bool)
    valid[INVALID] = False
    logp = -3.0 * torch.rand(B, WIDTH, generator=g, dtype=torch.float64)
    old = logp + 0.3 * randn(B, WIDTH)
    ref = logp + 0.5 * randn(B, WIDTH)
    adv = randn(B, WIDTH)
    # Ratios of e^2 ~ 7.4 with negative advantages: the dual clip (c = 3) acts.
    old[5, :50] = logp[5, :50] - 2.0
    adv[5, :50] = -adv[5, :50].abs()
    # Two outlier tokens whose k3 (e^15, e^30) the +-10 clamp bounds.
    ref[6, 3] = logp[6, 3] + 15.0
    ref[9, 0] = logp[9, 0] + 30.0
    values = randn(B, WIDTH)
    return {
        "mask": mask,
        "loss_mask": mask * valid.double().unsqueeze(-1),
        "valid": valid,
        "logp": logp,
        "old": old,
        "ref": ref,
        "adv": adv,
        "entropy": torch.rand(B, WIDTH, generator=g, dtype=torch.float64),
        "values": values,
        "vpred": values + 0.3 * randn(B, WIDTH),
        "returns": randn(B, WIDTH),
        "weights": 0.5 + torch.rand(B, generator=g, dtype=torch.float64),
        "positive": torch.rand(B, generator=g) > 0.5,
    }


def rollout_batch(d: dict[str, Any]) -> RolloutBatch:
    """The same data as the batch the driver hands out (for the sample accounting)."""
    return RolloutBatch(
        input_ids=torch.zeros(B, 2 + WIDTH, dtype=torch.long),
        attention_mask=torch.cat([torch.ones(B, 2), d["mask"].float()], dim=1),
        response_mask=d["mask"],
        prompt_width=2,
        valid=d["valid"],
        sample_weights=d["weights"],
    )


def global_scales(masks: list[Tensor]) -> list[ppo.AggScale]:
    """Each rank's ``AggScale.of`` when the all-reduce sums every rank's counts."""
    total = sum(torch.stack([x.sum(), (x.sum(-1) > 0).sum()]).double() for x in masks)
    assert isinstance(total, Tensor)
    return [ppo.AggScale.of(x, all_reduce=lambda t: t.copy_(total)) for x in masks]


def rank_calls(d: dict[str, Any], world: int, mode: str) -> list[list[dict[str, Any]]]:
    """Every ``log()`` call of every rank: one per optimizer step (policy and value), then the
    shard's sample accounting."""
    rows = [shard_indices(B, r, world, MINI_BATCHES).view(MINI_BATCHES, -1) for r in range(world)]
    calls: list[list[dict[str, Any]]] = [[] for _ in range(world)]
    for k in range(MINI_BATCHES):
        parts = [rows[r][k] for r in range(world)]
        scales = global_scales([d["loss_mask"][i] for i in parts])
        for r, (i, scale) in enumerate(zip(parts, scales, strict=True)):
            mask = d["loss_mask"][i]
            nll = -d["logp"][i]
            positive = d["positive"][i]
            out = ppo.policy_loss(
                d["logp"][i],
                d["old"][i],
                d["adv"][i],
                mask,
                clip_low=CLIP_LOW,
                clip_high=CLIP_HIGH,
                scale=scale,
                mode=mode,
                clip_ratio_c=CLIP_C,
                sample_weights=d["weights"][i],
                ref_log_probs=d["ref"][i],
                kl_coef=KL_COEF,
                entropy=d["entropy"][i],
                entropy_coef=ENTROPY_COEF,
                sft_nll=nll * positive.double().unsqueeze(-1),
                sft_coef=SFT_COEF,
            )
            value = ppo.value_loss(
                d["vpred"][i], d["values"][i], d["returns"][i], mask, clip=VALUE_CLIP, scale=scale
            )
            calls[r].append(emit.policy_step(out.stats, ppo.sft_stats(nll, mask, positive)))
            calls[r].append(emit.value_step(value.stats))
    batch = rollout_batch(d)
    for r in range(world):
        calls[r].append(emit.policy_shard(batch.select(rows[r].reshape(-1)), lr=1e-3))
    return calls


# ---------------------------------------------------------------------------------------------
# The peers' formulas over the whole batch, in numpy


def agg_np(x: np.ndarray, mask: np.ndarray, mode: str) -> float:
    """verl's and ROLL's ``agg_loss`` over one global mini-batch."""
    per_seq_tokens = mask.sum(-1)
    seqs = (per_seq_tokens > 0).sum()
    if mode == "token-mean":
        return float((x * mask).sum() / mask.sum())
    if mode == "seq-mean-token-sum":
        return float((x * mask).sum(-1).sum() / seqs)
    if mode == "seq-mean-token-mean":
        nonempty = per_seq_tokens > 0
        means = (x * mask).sum(-1)[nonempty] / per_seq_tokens[nonempty]
        return float(means.sum() / seqs)
    assert mode == "seq-mean-token-sum-norm"
    return float((x * mask).sum() / mask.shape[-1])


def expected(d: dict[str, Any], mode: str) -> dict[str, float]:
    n = {k: v.numpy() for k, v in d.items() if isinstance(v, Tensor)}
    lp, old, adv, mask = n["logp"], n["old"], n["adv"], n["loss_mask"]
    ratio = np.exp(lp - old)
    # verl compute_policy_loss_vanilla
    pg1 = -adv * ratio
    pg2 = -adv * np.clip(ratio, 1 - CLIP_LOW, 1 + CLIP_HIGH)
    clip_pg1 = np.maximum(pg1, pg2)
    pg3 = -adv * CLIP_C
    pg = np.where(adv < 0, np.minimum(pg3, clip_pg1), clip_pg1)
    weighted = pg * n["weights"][:, None]
    r = n["ref"] - lp
    k3 = np.clip(np.exp(r) - r - 1, -10, 10)
    nll = -lp
    total = weighted + KL_COEF * k3 - ENTROPY_COEF * n["entropy"]
    total = total + SFT_COEF * nll * n["positive"][:, None]
    fraction = "seq-mean-token-mean" if mode == "seq-mean-token-mean" else "token-mean"
    # ROLL's critic loss_func
    vclip = np.clip(n["vpred"], n["values"] - VALUE_CLIP, n["values"] + VALUE_CLIP)
    e1, e2 = (n["vpred"] - n["returns"]) ** 2, (vclip - n["returns"]) ** 2
    high, low = ratio > 1 + CLIP_HIGH, ratio < 1 - CLIP_LOW
    per_step = {  # name -> (per-token values, aggregation)
        m.ACTOR_PG_LOSS.name: (pg, mode),
        m.ACTOR_WEIGHTED_PG_LOSS.name: (weighted, mode),
        m.ACTOR_KL_LOSS.name: (k3, mode),
        m.ACTOR_TOTAL_LOSS.name: (total, mode),
        m.ACTOR_APPROXKL.name: (0.5 * (lp - old) ** 2, mode),
        m.ACTOR_POLICYKL.name: (lp - old, mode),
        m.ACTOR_CLIPFRAC.name: ((pg2 > pg1).astype(float), fraction),
        m.ACTOR_PG_CLIPFRAC_LOWER.name: (
            ((clip_pg1 > pg3) & (adv < 0)).astype(float),
            "token-mean",
        ),
        m.ACTOR_PPO_RATIO_HIGH_CLIPFRAC.name: (high.astype(float), "token-mean"),
        m.ACTOR_PPO_RATIO_LOW_CLIPFRAC.name: (low.astype(float), "token-mean"),
        m.ACTOR_PPO_RATIO_CLIPFRAC.name: ((high | low).astype(float), "token-mean"),
        "actor/ratio_mean": (ratio, "seq-mean-token-mean"),
        m.CRITIC_LOSS.name: (0.5 * np.maximum(e1, e2), "seq-mean-token-mean"),
        m.CRITIC_ERROR.name: (e1, "seq-mean-token-mean"),
        m.CRITIC_VPRED.name: (n["vpred"], "seq-mean-token-mean"),
        m.CRITIC_VALUE.name: (n["values"], "seq-mean-token-mean"),
        m.CRITIC_CLIPFRAC.name: ((e2 > e1).astype(float), "seq-mean-token-mean"),
    }
    per_mb = B // MINI_BATCHES
    out = {
        # ROLL divides the sum of the steps' values by the number of optimizer steps.
        name: float(
            np.mean(
                [
                    agg_np(
                        x[k * per_mb : (k + 1) * per_mb], mask[k * per_mb : (k + 1) * per_mb], how
                    )
                    for k in range(MINI_BATCHES)
                ]
            )
        )
        for name, (x, how) in per_step.items()
    }
    on = mask > 0
    out["actor/ratio_max"] = float(ratio[on].max())
    out["actor/ratio_min"] = float(ratio[on].min())
    pos = n["positive"][:, None] & on
    out[m.ACTOR_SFT_LOSS.name] = float(nll[on].mean())
    out[m.ACTOR_POSITIVE_SFT_LOSS.name] = float(nll[pos].mean())
    out[m.ACTOR_NEGATIVE_SFT_LOSS.name] = float(nll[on & ~pos].mean())
    out[m.ACTOR_VALID_SAMPLES.name] = float(B - len(INVALID))
    out[m.ACTOR_TOTAL_SAMPLES.name] = float(B)
    out[m.ACTOR_VALID_SAMPLE_RATIO.name] = (B - len(INVALID)) / B
    out[m.SYSTEM_STEP_TOKENS.name] = float(2 * B + n["mask"].sum())
    out["actor/sample_weights_mean"] = float(n["weights"].mean())
    return out


def close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=TOL, abs_tol=TOL)


@pytest.fixture(scope="module")
def data() -> dict[str, Any]:
    return ragged()


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_one_ragged_batch_merges_the_same_over_1_2_and_3_ranks(
    data: dict[str, Any], mode: str
) -> None:
    by_world = {world: collect(rank_calls(data, world, mode)) for world in (1, 2, 3)}
    want = expected(data, mode)
    one = by_world[1]
    for world in (2, 3):
        assert by_world[world].keys() == one.keys()
        apart = {
            k: (one[k], by_world[world][k]) for k in one if not close(one[k], by_world[world][k])
        }
        assert not apart, f"{world} ranks differ from 1: {apart}"
    for world, got in by_world.items():
        wrong = {k: (got[k], v) for k, v in want.items() if not close(got[k], v)}
        assert not wrong, f"{world} ranks, {mode}: merged vs the peers' formula: {wrong}"
    # The batch exercises what it claims to: the dual clip, the KL clamp, ragged shares.
    assert want[m.ACTOR_PG_CLIPFRAC_LOWER.name] > 0
    assert want[m.ACTOR_CLIPFRAC.name] > 0 and want[m.CRITIC_CLIPFRAC.name] > 0


def test_the_peers_formulas_tell_the_weightings_apart(data: dict[str, Any]) -> None:
    # Per-sequence and per-token means of this batch are far apart, so a metric merged with
    # the wrong weighting could not pass the test above.
    n = {k: v.numpy() for k, v in data.items() if isinstance(v, Tensor)}
    err = (n["vpred"] - n["returns"]) ** 2
    half = slice(0, B // MINI_BATCHES)
    per_seq = agg_np(err[half], n["loss_mask"][half], "seq-mean-token-mean")
    per_token = agg_np(err[half], n["loss_mask"][half], "token-mean")
    assert abs(per_seq - per_token) > 1e-3
    modes = {mode: expected(data, mode)[m.ACTOR_PG_LOSS.name] for mode in LOSS_AGG_MODES}
    assert len({round(v, 6) for v in modes.values()}) == 4, modes
