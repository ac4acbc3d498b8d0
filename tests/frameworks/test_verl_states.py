"""The verl loss hook's maths (``rlpulse.producer.integrations.verl_states``) without verl:
which names are exact under a configuration, and each micro-batch's mergeable states."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from rlpulse.producer.integrations.verl_states import (  # noqa: E402
    PG_CLIPFRAC,
    PG_CLIPFRAC_LOWER,
    PG_LOSS,
    PPO_KL,
    VF_CLIPFRAC,
    VF_LOSS,
    VPRED_MEAN,
    exact_names,
    loss_state,
    value_states,
    vanilla_states,
)
from rlpulse.producer.values import Fraction, Weighted  # noqa: E402


def test_exact_names_follow_the_configuration() -> None:
    everything = (PG_LOSS, PG_CLIPFRAC, PG_CLIPFRAC_LOWER, PPO_KL, VF_LOSS, VF_CLIPFRAC, VPRED_MEAN)
    assert exact_names({}) == everything
    assert exact_names({"critic": {"strategy": "megatron"}}) == everything[:4]
    sp = {"actor_rollout_ref": {"actor": {"ulysses_sequence_parallel_size": 2}}}
    assert exact_names(sp) == everything[4:]
    summed = {"actor_rollout_ref": {"actor": {"loss_agg_mode": "token-sum"}}}
    assert exact_names(summed)[:3] == (PG_CLIPFRAC, PG_CLIPFRAC_LOWER, PPO_KL)
    other = {"actor_rollout_ref": {"actor": {"policy_loss": {"loss_mode": "gspo"}}}}
    assert exact_names(other) == everything[4:]


def test_loss_state_undoes_the_global_normalisation() -> None:
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]]).bool()  # 3 tokens, 2 sequences
    loss = torch.tensor(0.5)
    own = loss_state(loss, "token-mean", mask, 2, None, None)
    assert isinstance(own, Weighted) and float(own.value) == 0.5 and int(own.weight) == 3
    # verl divided the micro-batch's token sum by 12 global tokens over 2 ranks (6 each)
    token = loss_state(loss, "token-mean", mask, 2, 12, None)
    assert math.isclose(float(token.value), 0.5 * 6 / 3) and int(token.weight) == 3
    seq = loss_state(loss, "seq-mean-token-mean", mask, 2, None, 8)
    assert math.isclose(float(seq.value), 0.5 * 8 / 2 / 2) and int(seq.weight) == 2
    assert loss_state(loss, "token-sum", mask, 2, 12, 8) is None


class Config(dict):  # type: ignore[type-arg]
    """verl's actor config as the policy loss sees it: attributes, and ``get``."""

    def __init__(self) -> None:
        super().__init__(clip_ratio_c=3.0)
        self.clip_ratio, self.clip_ratio_low, self.clip_ratio_high = 0.2, None, None


def test_vanilla_states_count_clipped_tokens_and_pool_the_kl() -> None:
    old = torch.zeros(1, 4)
    new = torch.tensor([[0.5, -0.5, 0.0, 9.0]])  # ratios e^0.5, e^-0.5, 1, (masked out)
    adv = torch.tensor([[1.0, -1.0, 1.0, 1.0]])
    mask = torch.tensor([[1, 1, 1, 0]])
    states = vanilla_states(old, new, adv, mask, Config())
    kl = states[PPO_KL]
    assert math.isclose(float(kl.value), (-0.5 + 0.5 - 0.0) / 3, abs_tol=1e-12)
    assert int(kl.weight) == 3
    clip = states[PG_CLIPFRAC]
    assert isinstance(clip, Fraction) and (int(clip.numerator), int(clip.denominator)) == (2, 3)
    assert int(states[PG_CLIPFRAC_LOWER].numerator) == 0


def test_value_states_recover_the_clipped_count_and_the_prediction_mean() -> None:
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]]).bool()
    vpreds = torch.tensor([[1.0, 2.0, 100.0], [6.0, 100.0, 100.0]])
    clipfrac = torch.tensor(1 / (3 + 1e-8))  # verl's masked mean of one clipped token
    states = value_states(vpreds, clipfrac, mask)
    frac = states[VF_CLIPFRAC]
    assert (float(frac.numerator), int(frac.denominator)) == (1.0, 3)
    mean = states[VPRED_MEAN]
    assert math.isclose(float(mean.value), 3.0) and int(mean.weight) == 3
