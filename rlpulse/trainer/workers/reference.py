"""reference: the frozen starting policy that the KL penalty measures against."""

from __future__ import annotations

import torch

from rlpulse.schemas.topology import COMPUTE_LOG_PROBS, REFERENCE
from rlpulse.trainer import emit
from rlpulse.trainer.batch import RolloutBatch
from rlpulse.trainer.model import build_policy, response_logits, token_log_probs
from rlpulse.trainer.offload import StateMover
from rlpulse.trainer.workers.base import Worker, WorkerSpec


class ReferenceWorker(Worker):
    role = REFERENCE

    def __init__(self, spec: WorkerSpec, weights: dict[str, torch.Tensor]) -> None:
        super().__init__(spec)
        self.model = build_policy(self.cfg.model, self.tokenizer, seed=self.cfg.seed)
        self.model.load_state_dict(weights)
        self.model.eval().requires_grad_(False)
        self.mover = StateMover(self.model, None, self.device, enabled=self.cfg.cluster.offload)

    @torch.no_grad()
    def compute_log_probs(self, step: int, batch: RolloutBatch) -> torch.Tensor:
        with self.phase(COMPUTE_LOG_PROBS, step, self.mover):
            dev = next(self.model.parameters()).device
            ids = batch.input_ids.to(dev)
            logits = response_logits(
                self.model, ids, batch.attention_mask.to(dev), batch.prompt_width
            )
            log_probs = token_log_probs(logits, ids[:, batch.prompt_width :]).cpu()
        self.producer.log(emit.ref_log_probs(log_probs, batch.response_mask), step)
        return log_probs
