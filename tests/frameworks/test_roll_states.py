"""The exact ROLL hook's maths (``roll_states``) against float64 truth over the pooled tokens of
micro-batches of unequal lengths, computed here with plain loops: every ``loss_agg_mode``,
token and sequence importance sampling, the train/infer filters, the critic. Needs torch only."""

from __future__ import annotations

import math
import random
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from rlpulse.producer.integrations import roll_config, roll_states as S  # noqa: E402
from rlpulse.producer.values import Fraction, Weighted  # noqa: E402
from rlpulse.schemas import metrics as M  # noqa: E402

WIDTH = 12


def merged(states: list[Any]) -> float:
    """The collector's merge of one name's states: pooled mean or pooled ratio."""
    if isinstance(states[0], Weighted):
        w = sum(float(s.weight) for s in states)
        return sum(float(s.value) * float(s.weight) for s in states) / w
    assert isinstance(states[0], Fraction)
    return sum(float(s.numerator) for s in states) / sum(float(s.denominator) for s in states)


def micro_batch(rng: random.Random, lengths: list[int]) -> dict[str, Any]:
    """Response-aligned tensors of sequences of the given lengths, right-padded to WIDTH."""
    rows = len(lengths)
    mask = torch.zeros(rows, WIDTH, dtype=torch.long)
    for i, n in enumerate(lengths):
        mask[i, :n] = 1
    g = torch.Generator().manual_seed(rng.randrange(1 << 30))
    old = -torch.rand(rows, WIDTH, generator=g, dtype=torch.float64) * 3
    logp = old + torch.randn(rows, WIDTH, generator=g, dtype=torch.float64) * 0.3
    ref = old + torch.randn(rows, WIDTH, generator=g, dtype=torch.float64) * 0.2
    infer = old + torch.randn(rows, WIDTH, generator=g, dtype=torch.float64) * 0.4
    adv = torch.randn(rows, 1, generator=g, dtype=torch.float64).expand(rows, WIDTH) * mask
    return {
        "mask": mask,
        "old": old * mask,
        "logp": logp * mask,
        "ref": ref * mask,
        "infer": infer * mask,
        "adv": adv,
    }


RANKS = [[[3, 5]], [[12, 9, 11], [7, 0], [12, 4]]]
"""Two ranks' micro-batches of sequence lengths: 8 and 55 response tokens."""


def batches(seed: int = 5) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    return [micro_batch(rng, mb) for rank in RANKS for mb in rank]


def pooled(per_token, mbs, mode: str, mask_key: str = "mask") -> float:
    """float64 truth of ``per_token(mb)[i][t]`` aggregated by ``mode`` over every sequence and
    token of every micro-batch, with loops."""
    tokens: list[float] = []
    seqs: list[float] = []
    for mb in mbs:
        mat, mask = per_token(mb), mb[mask_key]
        for i in range(mask.shape[0]):
            row = [float(mat[i, t]) for t in range(WIDTH) if mask[i, t]]
            tokens += row
            if row:
                seqs.append(
                    {
                        "seq-mean-token-sum": sum(row),
                        "seq-mean-token-mean": sum(row) / len(row),
                        "seq-mean-token-sum-norm": sum(row) / WIDTH,
                    }.get(mode, 0.0)
                )
    return sum(tokens) / len(tokens) if mode == "token-mean" else sum(seqs) / len(seqs)


def run_actor(mbs, settings: roll_config.ActorSettings, loss_masks=None) -> dict[str, list[Any]]:
    out: dict[str, list[Any]] = {}
    for k, mb in enumerate(mbs):
        t = S.ActorTensors(
            log_probs=mb["logp"],
            old_log_probs=mb["old"],
            ref_log_probs=mb["ref"],
            advantages=mb["adv"],
            loss_mask=mb["mask"] if loss_masks is None else loss_masks[k],
            base_mask=mb["mask"],
            infer_log_probs=mb["infer"],
        )
        for name, state in S.actor_states(t, settings).items():
            out.setdefault(name, []).append(state)
    return out


@pytest.mark.parametrize("mode", S.MODES)
def test_actor_losses_equal_pooled_truth_in_every_mode(mode: str) -> None:
    mbs = batches()
    settings = roll_config.ActorSettings(
        loss_agg_mode=mode,
        use_kl_loss=True,
        kl_loss_coef=0.1,
        rl_loss_coef=2.0,
        weighted=True,
        norm_width=WIDTH,
    )
    got = run_actor(mbs, settings)

    def ratio(mb):
        return (mb["logp"] - mb["old"]).exp()

    def pg(mb):
        r = ratio(mb)
        return -torch.min(r * mb["adv"], r.clamp(0.8, 1.2) * mb["adv"])

    def kl(mb):
        d = mb["ref"] - mb["logp"]
        return torch.clamp(d.exp() - d - 1, -10, 10)

    want = {
        M.ACTOR_PG_LOSS.name: pooled(pg, mbs, mode),
        M.ACTOR_WEIGHTED_PG_LOSS.name: pooled(pg, mbs, mode),
        M.ACTOR_KL_LOSS.name: pooled(kl, mbs, mode),
        M.ACTOR_TOTAL_LOSS.name: pooled(lambda mb: 2.0 * (pg(mb) + 0.1 * kl(mb)), mbs, mode),
        M.ACTOR_APPROXKL.name: pooled(lambda mb: 0.5 * (mb["logp"] - mb["old"]) ** 2, mbs, mode),
        M.ACTOR_POLICYKL.name: pooled(lambda mb: mb["logp"] - mb["old"], mbs, mode),
        S.RATIO_MEAN: pooled(ratio, mbs, "seq-mean-token-mean"),
        M.ACTOR_PPO_RATIO_CLIPFRAC.name: pooled(
            lambda mb: ((ratio(mb) < 0.8) | (ratio(mb) > 1.2)).double(), mbs, "token-mean"
        ),
        M.ACTOR_CLIPFRAC.name: pooled(
            lambda mb: (ratio(mb).clamp(0.8, 1.2) * mb["adv"] < ratio(mb) * mb["adv"]).double(),
            mbs,
            "seq-mean-token-mean" if mode == "seq-mean-token-mean" else "token-mean",
        ),
    }
    for name, value in want.items():
        assert merged(got[name]) == pytest.approx(value, rel=1e-12, abs=1e-12), name
    # the pooled value is not a mean of the micro-batches' values where they differ in size
    means = [float(s.value) for s in got[M.ACTOR_PG_LOSS.name]]
    assert abs(sum(means) / len(means) - want[M.ACTOR_PG_LOSS.name]) > 1e-3


def test_sequence_importance_sampling_clip_fractions_count_loss_tokens_only() -> None:
    mbs = batches(seed=11)
    got = run_actor(mbs, roll_config.ActorSettings(importance="seq", clip_low=0.05, clip_high=0.05))

    def seq_ratio(mb):
        mask = mb["mask"].bool()
        lr = torch.where(mask, mb["logp"] - mb["old"], 0.0).sum(-1) / mask.sum(-1).clamp(min=1)
        return lr.exp().unsqueeze(-1).expand(-1, WIDTH)

    want = pooled(
        lambda mb: ((seq_ratio(mb) < 0.95) | (seq_ratio(mb) > 1.05)).double(), mbs, "token-mean"
    )
    assert merged(got[M.ACTOR_PPO_RATIO_CLIPFRAC.name]) == pytest.approx(want, rel=1e-12)


def test_filters_pass_rates_and_final_mask_are_over_response_tokens() -> None:
    mbs = batches(seed=3)
    corr = roll_config.Correction(
        is_weight=True,
        weight_type="token",
        upper_bound=1.2,
        has_filters=True,
        filters=(
            roll_config.Filter("token", ratio=(0.8, 1.25)),
            roll_config.Filter("geometric", diff=(-0.05, 0.05)),
        ),
    )
    states: dict[str, list[Any]] = {}
    for mb in mbs:
        out, _, _ = S.correction_states(corr, mb["old"], mb["infer"], mb["mask"])
        for name, state in out.items():
            states.setdefault(name, []).append(state)

    def token_ratio(mb):
        return (mb["old"] - mb["infer"]).exp()

    def geo_diff(mb):
        d = mb["old"].exp() - mb["infer"].exp()
        mask = mb["mask"].bool()
        return (
            (torch.where(mask, d, 0.0).sum(-1) / mask.sum(-1).clamp(min=1))
            .unsqueeze(-1)
            .expand(-1, WIDTH)
        )

    ok_ratio = lambda mb: ((token_ratio(mb) >= 0.8) & (token_ratio(mb) <= 1.25)).double()  # noqa: E731
    ok_diff = lambda mb: ((geo_diff(mb) >= -0.05) & (geo_diff(mb) <= 0.05)).double()  # noqa: E731
    want = {
        S.ratio_mask_mean("token"): pooled(ok_ratio, mbs, "token-mean"),
        S.diff_mask_mean("geometric"): pooled(ok_diff, mbs, "token-mean"),
        S.FINAL_MASK_MEAN: pooled(lambda mb: ok_ratio(mb) * ok_diff(mb), mbs, "token-mean"),
        S.IS_WEIGHT_CLIPFRAC: pooled(
            lambda mb: (token_ratio(mb) > 1.2).double(), mbs, "token-mean"
        ),
        S.ratio_mean("sequence"): pooled(
            lambda mb: (
                torch.where(mb["mask"].bool(), mb["old"] - mb["infer"], 0.0)
                .sum(-1, keepdim=True)
                .exp()
                .expand(-1, WIDTH)
            ),
            mbs,
            "seq-mean-token-mean",
        ),
    }
    for name, value in want.items():
        got = merged(states[name])
        assert 0 <= got <= 1 or name == S.ratio_mean("sequence")
        assert got == pytest.approx(value, rel=1e-12), name


def test_segment_mean_is_the_mean_of_each_run_of_the_mask() -> None:
    values = torch.tensor([[1.0, 3.0, 5.0, 7.0, 9.0, 11.0]])
    mask = torch.tensor([[0, 1, 1, 0, 1, 0]])
    assert S.segment_mean(values, mask).tolist() == [[0.0, 4.0, 4.0, 0.0, 9.0, 0.0]]


@pytest.mark.parametrize("value_clip", [None, 0.1])
def test_critic_statistics_are_sequence_means_pooled_over_the_step(value_clip) -> None:
    mbs = batches(seed=8)
    states: dict[str, list[Any]] = {}
    for mb in mbs:
        values, old, ret = mb["logp"], mb["old"], mb["ref"]
        out = S.critic_states(values, old, ret, mb["mask"], roll_config.CriticSettings(value_clip))
        for name, state in out.items():
            states.setdefault(name, []).append(state)

    def clipped(mb):
        return torch.clip(mb["logp"], mb["old"] - value_clip, mb["old"] + value_clip)

    def loss(mb):
        err = (mb["logp"] - mb["ref"]) ** 2
        return 0.5 * (err if value_clip is None else torch.max(err, (clipped(mb) - mb["ref"]) ** 2))

    seq = "seq-mean-token-mean"
    assert merged(states[M.CRITIC_LOSS.name]) == pytest.approx(pooled(loss, mbs, seq), rel=1e-12)
    assert merged(states[M.CRITIC_VPRED.name]) == pytest.approx(
        pooled(lambda mb: mb["logp"], mbs, seq)
    )
    err = pooled(lambda mb: (mb["logp"] - mb["ref"]) ** 2, mbs, seq)
    assert merged(states[M.CRITIC_ERROR.name]) == pytest.approx(err, rel=1e-12)
    clip = merged(states[M.CRITIC_CLIPFRAC.name])
    if value_clip is None:  # ROLL reports the squared error here; the clip fraction is 0
        assert clip == 0.0 and not math.isclose(err, 0.0)
    else:
        want = pooled(
            lambda mb: ((clipped(mb) - mb["ref"]) ** 2 > (mb["logp"] - mb["ref"]) ** 2).double(),
            mbs,
            seq,
        )
        assert clip == pytest.approx(want, rel=1e-12)


def test_settings_from_rolls_config_and_the_driver_names() -> None:
    config = {
        "loss_agg_mode": "token-mean",
        "use_pg_clip_range": True,
        "pg_clip_low": 0.1,
        "pg_clip_high": 0.3,
        "sequence_length": 13,
        "importance_sampling": "seq",
        "train_infer_correction": {
            "filters": [
                {
                    "enabled": True,
                    "agg_type": "token",
                    "ratio_enabled": True,
                    "ratio_low": 0.5,
                    "ratio_high": 2.0,
                }
            ]
        },
    }
    s = roll_config.actor_settings(config, agentic=False)
    assert (s.clip_low, s.clip_high, s.norm_width, s.importance) == (0.1, 0.3, 12, "seq")
    assert s.correction is not None and s.correction.filters[0].ratio == (0.5, 2.0)
    names = S.worker_side(config)
    assert M.ACTOR_TOTAL_LOSS.name in names and S.FINAL_MASK_MEAN in names
    assert M.ACTOR_TOTAL_LOSS.name not in S.worker_side({**config, "entropy_loss_coef": 0.01})
