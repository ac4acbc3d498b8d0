"""The rollout engine's log-probs against the trainer's, and the staleness of trained samples
(issue 26.2): what transformers' generate reports for the tokens it sampled, what the trainer
logs from the two tensors, and what the collector makes of it across ranks."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from rlpulse.producer import Masked
from rlpulse.schemas import metrics as m
from rlpulse.schemas.errors import ConfigError
from rlpulse.trainer import emit
from rlpulse.trainer.config import PPOConfig, TrainerConfig
from rlpulse.trainer.model import build_policy, response_logits, token_log_probs
from rlpulse.trainer.policy_trainer import PolicyTrainer
from rlpulse.trainer.rollout import assemble_batch, generate_hf
from rlpulse.trainer.task import AdditionTask
from tests.trainer.conftest import collect

PROMPTS = [p.prompt for p in AdditionTask(9, 8, seed=1).sample(12)]


def _generate(cfg: TrainerConfig, tokenizer, **sampling: float | bool):
    torch.manual_seed(3)
    policy = build_policy(cfg.model, tokenizer, seed=0)
    args = {"temperature": 1.0, "top_p": 1.0, "greedy": False, **sampling}
    gen = generate_hf(policy, tokenizer, PROMPTS, max_new_tokens=5, **args)
    trainer = PolicyTrainer(policy, cfg.ppo, comm=None)  # type: ignore[arg-type]
    return gen, trainer.log_probs(gen.batch)


def test_sampling_log_probs_are_the_trainers_up_to_numerics(tiny_cfg: TrainerConfig, tokenizer):
    gen, trainer = _generate(tiny_cfg, tokenizer)
    rollout = gen.batch.rollout_log_probs
    assert rollout is not None and rollout.shape == gen.batch.response_mask.shape
    mask = gen.batch.response_mask.bool()
    assert mask.sum() > len(PROMPTS)  # several tokens per response
    assert (rollout[~mask] == 0).all()  # padding after EOS carries nothing
    # Same weights, temperature 1, no top_p: the KV-cached generate and the trainer's full
    # forward pass agree up to float rounding.
    assert torch.allclose(rollout[mask], trainer.log_probs[mask], atol=1e-4)


def test_a_sampling_temperature_shows_as_a_mismatch(tiny_cfg: TrainerConfig, tokenizer):
    gen, trainer = _generate(tiny_cfg, tokenizer, temperature=0.5)
    batch, mask = gen.batch, gen.batch.response_mask.bool()
    # The engine reports the distribution it sampled from, logits / 0.5; the trainer's is at
    # temperature 1, so they differ by exactly that.
    policy = build_policy(tiny_cfg.model, tokenizer, seed=0).eval()
    with torch.no_grad():
        logits = response_logits(policy, batch.input_ids, batch.attention_mask, batch.prompt_width)
    tempered = token_log_probs(logits / 0.5, batch.input_ids[:, batch.prompt_width :])
    assert torch.allclose(batch.rollout_log_probs[mask], tempered[mask], atol=1e-4)
    diff = batch.rollout_log_probs - trainer.log_probs
    assert diff[mask].abs().max() > 0.05


def test_greedy_decoding_reports_no_log_probs(tiny_cfg: TrainerConfig, tokenizer):
    gen, _ = _generate(tiny_cfg, tokenizer, greedy=True)
    assert gen.batch.rollout_log_probs is None


def test_engine_log_probs_are_cut_at_eos_like_the_tokens(tokenizer):
    eos = tokenizer.eos_token_id
    ids, mask = torch.tensor([[5], [5]]), torch.ones(2, 1)
    gen = assemble_batch(
        ids, mask, [[7, eos, 7], [7, 7, 7]], 3, tokenizer, [[-0.5, -0.25, -9.0], [-1, -2, -3]]
    )
    assert gen.batch.rollout_log_probs.tolist() == [[-0.5, -0.25, 0.0], [-1.0, -2.0, -3.0]]


def test_the_logged_difference_is_rollout_minus_trainer_pooled_over_ranks() -> None:
    rollout = torch.tensor([[-1.0, -2.0, -3.0], [-0.5, -0.5, 0.0], [-2.0, -1.0, -1.0]])
    trainer = torch.tensor([[-1.0, -1.5, -2.0], [-0.5, -1.0, -4.0], [-2.5, -1.0, -1.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0], [1, 0, 0]], dtype=torch.float32)
    entropy = torch.ones(3, 3)
    ranks = [[0, 1], [2]]  # ragged: rank 0 holds 5 tokens, rank 1 one
    got = collect(
        [
            [emit.old_log_probs(trainer[r], entropy[r], mask[r], rollout[r])]
            for r in (torch.tensor(rows) for rows in ranks)
        ]
    )
    diff = (rollout - trainer)[mask.bool()]  # [0, -0.5, -1, 0, 0.5, 0.5]
    assert got["rollout/logprob_diff/mean"] == pytest.approx(float(diff.mean()))
    assert got["rollout/logprob_diff/max"] == pytest.approx(0.5)
    assert got["rollout/logprob_diff/min"] == pytest.approx(-1.0)
    assert got["rollout/prob_ratio/max"] == pytest.approx(float(torch.exp(torch.tensor(1.0))))
    assert got["rollout/prob_ratio/mean"] == pytest.approx(float(torch.exp(-diff).mean()))
    # zeros are reported as zeros: the p50 of [-1, -0.5, 0, 0, 0.5, 0.5] is 0 (rank 3 of 6)
    if "rollout/logprob_diff/p50" in got:
        assert got["rollout/logprob_diff/p50"] == pytest.approx(0.0, abs=1e-6)


def test_no_engine_log_probs_no_mismatch_metrics() -> None:
    out = emit.old_log_probs(torch.zeros(2, 3), torch.ones(2, 3), torch.ones(2, 3))
    assert set(out) == {m.CRITIC_OLD_LOG_PROB.name, m.CRITIC_ENTROPY.name}


@pytest.mark.parametrize("behind", [0, 1, 3])
def test_staleness_is_token_weighted_steps_behind(behind: int) -> None:
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0]], dtype=torch.float32)
    out = emit.staleness(behind, mask)
    value = out[m.ASYNC_STALENESS.name]
    assert isinstance(value, Masked) and int(value.mask.sum()) == 4
    got = collect([[out]])
    assert got["async/staleness/mean"] == got["async/staleness/max"] == behind
    assert got["async/staleness/min"] == behind


def test_off_policy_steps_is_validated_and_defaults_to_on_policy() -> None:
    assert PPOConfig().off_policy_steps == 0
    assert dataclasses.replace(PPOConfig(), off_policy_steps=1).off_policy_steps == 1
    with pytest.raises(ConfigError, match=r"ppo\.off_policy_steps"):
        PPOConfig(off_policy_steps=-1)
