"""critic: the value model (policy backbone plus a value head)."""

from __future__ import annotations

from pathlib import Path

import torch

from rlpulse.schemas.topology import COMPUTE_VALUES, CRITIC, DO_CHECKPOINT, TRAIN_STEP
from rlpulse.trainer import emit
from rlpulse.trainer.batch import RolloutBatch
from rlpulse.trainer.comm import LocalComm
from rlpulse.trainer.model import ValueModel, build_policy
from rlpulse.trainer.offload import StateMover
from rlpulse.trainer.value_trainer import ValueTrainer
from rlpulse.trainer.workers.base import Worker, WorkerSpec


class CriticWorker(Worker):
    """Starts from the (warm-started) policy's backbone with a zero-initialised head."""

    role = CRITIC

    def __init__(self, spec: WorkerSpec, weights: dict[str, torch.Tensor]) -> None:
        super().__init__(spec)
        policy = build_policy(self.cfg.model, self.tokenizer, seed=self.cfg.seed)
        policy.load_state_dict(weights)
        self.model = ValueModel.from_policy(policy)
        self.model.eval()
        self.trainer = ValueTrainer(self.model, self.cfg.ppo, LocalComm())
        self.mover = StateMover(
            self.model, self.trainer.optimizer, self.device, enabled=self.cfg.cluster.offload
        )

    def compute_values(self, step: int, batch: RolloutBatch) -> torch.Tensor:
        with self.phase(COMPUTE_VALUES, step, self.mover):
            values = self.trainer.values(batch)
        self.producer.log(emit.values(values, batch.response_mask), step)
        return values

    def train_step(self, step: int, batch: RolloutBatch) -> dict[str, float]:
        with self.phase(TRAIN_STEP, step, self.mover):
            result = self.trainer.train(batch)
        for stats in result.stats:
            self.producer.log(emit.value_step(stats), step)
        self.producer.log({emit.m.CRITIC_LR.name: result.lr}, step)
        return {
            "optimizer_steps": float(len(result.stats)),
            "loss_part": sum(s.loss.part for s in result.stats),
        }

    def checkpoint(self, step: int, directory: str) -> str:
        out = Path(directory) / "critic"
        with self.phase(DO_CHECKPOINT, step, self.mover):
            out.mkdir(parents=True, exist_ok=True)
            torch.save(
                {
                    "step": step,
                    "model": self.model.state_dict(),
                    "optimizer": self.trainer.optimizer.state_dict(),
                },
                out / "critic.pt",
            )
        return str(out)
