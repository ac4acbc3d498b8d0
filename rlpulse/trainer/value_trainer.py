"""The critic's side of PPO on one rank: values for a batch and the (clipped) value update.

Like :mod:`rlpulse.trainer.policy_trainer` it returns stats objects and leaves logging to the worker.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from rlpulse.trainer import ppo
from rlpulse.trainer.batch import RolloutBatch
from rlpulse.trainer.comm import Comm, all_reduce_gradients
from rlpulse.trainer.config import PPOConfig
from rlpulse.trainer.model import ValueModel, response_values


@dataclass(frozen=True)
class ValueTrainResult:
    stats: list[ppo.ValueStats]
    lr: float


class ValueTrainer:
    """A critic replica and its optimizer."""

    def __init__(self, model: ValueModel, cfg: PPOConfig, comm: Comm) -> None:
        self.model, self.cfg, self.comm = model, cfg, comm
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.critic_lr)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @torch.no_grad()
    def values(self, batch: RolloutBatch) -> Tensor:
        self.model.eval()
        dev = self.device
        return response_values(
            self.model, batch.input_ids.to(dev), batch.attention_mask.to(dev), batch.prompt_width
        ).cpu()

    def train(self, shard: RolloutBatch) -> ValueTrainResult:
        """Regress values on the returns for ``cfg.epochs`` over ``cfg.mini_batches``; the
        loss is per-sequence token means averaged over the global mini-batch's sequences
        (:data:`rlpulse.trainer.ppo.VALUE_MODE`)."""
        cfg = self.cfg
        assert shard.values is not None and shard.returns is not None
        self.model.train()
        stats: list[ppo.ValueStats] = []
        dev = self.device
        for _ in range(cfg.epochs):
            for mb in shard.split(cfg.mini_batches):
                assert mb.values is not None and mb.returns is not None, "critic needs both"
                mask = mb.loss_mask.to(dev)
                scale = ppo.AggScale.of(mask, all_reduce=self.comm.all_reduce_sum)
                if scale.tokens == 0:
                    continue
                vpred = response_values(
                    self.model, mb.input_ids.to(dev), mb.attention_mask.to(dev), mb.prompt_width
                )
                out = ppo.value_loss(
                    vpred,
                    mb.values.to(dev),
                    mb.returns.to(dev),
                    mask,
                    clip=cfg.value_clip,
                    scale=scale,
                )
                self.optimizer.zero_grad(set_to_none=True)
                out.loss.backward()
                all_reduce_gradients(self.model.parameters(), self.comm)
                torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.max_grad_norm)
                self.optimizer.step()
                stats.append(out.stats)
        self.model.eval()
        return ValueTrainResult(stats, self.optimizer.param_groups[0]["lr"])
