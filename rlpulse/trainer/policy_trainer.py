"""The policy's side of PPO on one data-parallel rank: log-probs and the clipped-surrogate update.

No Ray and no producer here: :class:`PolicyTrainer` returns stats objects, and the worker
(:mod:`rlpulse.trainer.workers.actor_train`) logs them. That keeps the data-parallel maths testable in
plain processes (see ``tests/trainer/test_ranks.py``).

>>> # trainer = PolicyTrainer(policy, ppo_cfg, LocalComm())
>>> # result = trainer.train(shard, kl_coef=0.02)   # -> PolicyTrainResult
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor
from transformers import LlamaForCausalLM

from rlpulse.trainer import ppo
from rlpulse.trainer.batch import RolloutBatch
from rlpulse.trainer.comm import Comm, all_reduce_gradients
from rlpulse.trainer.config import PPOConfig
from rlpulse.trainer.model import entropy_from_logits, response_logits, token_log_probs


@dataclass(frozen=True)
class LogProbs:
    """Per-token log-probabilities of the responses and the policy's entropy there."""

    log_probs: Tensor
    entropy: Tensor


@dataclass(frozen=True)
class PolicyTrainResult:
    """One entry per optimizer step (mini-batch x epoch)."""

    policy: list[ppo.PolicyStats]
    sft: list[ppo.SFTStats]
    lr: float


def _on(batch: RolloutBatch, device: torch.device) -> tuple[Tensor, Tensor, Tensor]:
    ids = batch.input_ids.to(device)
    return ids, batch.attention_mask.to(device), ids[:, batch.prompt_width :]


class PolicyTrainer:
    """A policy replica, its optimizer, and the ranks it averages gradients with."""

    def __init__(self, model: LlamaForCausalLM, cfg: PPOConfig, comm: Comm) -> None:
        self.model, self.cfg, self.comm = model, cfg, comm
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.actor_lr)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @torch.no_grad()
    def log_probs(self, batch: RolloutBatch) -> LogProbs:
        """Scores of ``batch``'s responses under the current weights (no update)."""
        self.model.eval()
        ids, mask, tokens = _on(batch, self.device)
        logits = response_logits(self.model, ids, mask, batch.prompt_width)
        return LogProbs(token_log_probs(logits, tokens).cpu(), entropy_from_logits(logits).cpu())

    def train(self, shard: RolloutBatch, kl_coef: float) -> PolicyTrainResult:
        """PPO epochs over this rank's shard, split into ``cfg.mini_batches`` mini-batches.

        Shard part i is this rank's slice of global mini-batch i (``rlpulse.trainer.batch.shard``), so
        every optimizer step sees the same global mini-batch whatever the number of ranks.
        """
        cfg = self.cfg
        assert shard.old_log_probs is not None and shard.advantages is not None
        self.model.train()
        policy_stats: list[ppo.PolicyStats] = []
        sft: list[ppo.SFTStats] = []
        kl_in_loss = kl_coef if cfg.kl_placement == "loss" else 0.0
        device = self.device
        for _ in range(cfg.epochs):
            for mb in shard.split(cfg.mini_batches):
                mask = mb.loss_mask.to(device)
                # Every rank divides by the global counts of this mini-batch, so the
                # all-reduced (summed) gradient is the gradient of the global loss.
                scale = ppo.AggScale.of(mask, cfg.loss_scale_factor, self.comm.all_reduce_sum)
                if scale.tokens == 0:
                    continue  # the same decision on every rank: nothing valid to learn from
                ids, attn, tokens = _on(mb, device)
                logits = response_logits(self.model, ids, attn, mb.prompt_width)
                log_probs = token_log_probs(logits, tokens)
                entropy = entropy_from_logits(logits)
                if cfg.entropy_coef == 0:
                    entropy = entropy.detach()  # measured, not optimised
                positive = _positive(mb).to(device)
                assert mb.old_log_probs is not None and mb.advantages is not None
                nll = -log_probs
                out = ppo.policy_loss(
                    log_probs,
                    mb.old_log_probs.to(device),
                    mb.advantages.to(device),
                    mask,
                    clip_low=cfg.clip_low,
                    clip_high=cfg.clip_high,
                    scale=scale,
                    mode=cfg.loss_agg_mode,
                    clip_ratio_c=cfg.clip_ratio_c,
                    sample_weights=None
                    if mb.sample_weights is None
                    else mb.sample_weights.to(device),
                    ref_log_probs=None if mb.ref_log_probs is None else mb.ref_log_probs.to(device),
                    kl_coef=kl_in_loss,
                    entropy=entropy,
                    entropy_coef=cfg.entropy_coef,
                    sft_nll=nll * positive.float().unsqueeze(-1),
                    sft_coef=cfg.sft_loss_coef,
                )
                self.optimizer.zero_grad(set_to_none=True)
                out.loss.backward()
                all_reduce_gradients(self.model.parameters(), self.comm)
                # After the all-reduce every rank holds the same gradient: the same norm, the
                # same clipping, the same step, so the replicas stay identical.
                torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.max_grad_norm)
                self.optimizer.step()
                policy_stats.append(out.stats)
                sft.append(ppo.sft_stats(nll.detach(), mask, positive))
        self.model.eval()
        return PolicyTrainResult(policy_stats, sft, self.optimizer.param_groups[0]["lr"])


def _positive(batch: RolloutBatch) -> Tensor:
    """Positively rewarded samples; without rewards, none."""
    if batch.positive is not None:
        return batch.positive
    if batch.rewards is None:
        return torch.zeros(batch.size, dtype=torch.bool)
    return batch.rewards > 0
