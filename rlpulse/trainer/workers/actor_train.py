"""actor_train: the policy being optimised, one data-parallel rank per worker."""

from __future__ import annotations

from pathlib import Path

import torch

from rlpulse.schemas.topology import (
    ACTOR_TRAIN,
    COMPUTE_LOG_PROBS,
    DO_CHECKPOINT,
    MODEL_UPDATE,
    TRAIN_STEP,
)
from rlpulse.trainer import emit
from rlpulse.trainer.batch import RolloutBatch
from rlpulse.trainer.comm import Comm, LocalComm, TorchDistComm, free_port
from rlpulse.trainer.model import build_policy
from rlpulse.trainer.offload import StateMover
from rlpulse.trainer.policy_trainer import LogProbs, PolicyTrainer
from rlpulse.trainer.workers.base import Worker, WorkerSpec


class ActorTrainWorker(Worker):
    """Holds a policy replica and its optimizer; all ranks start from the same weights."""

    role = ACTOR_TRAIN

    def __init__(self, spec: WorkerSpec, weights: dict[str, torch.Tensor]) -> None:
        super().__init__(spec)
        self.model = build_policy(self.cfg.model, self.tokenizer, seed=self.cfg.seed)
        self.model.load_state_dict(weights)
        self.model.eval()
        self.comm: Comm = LocalComm()
        self.trainer = PolicyTrainer(self.model, self.cfg.ppo, self.comm)
        self.mover = StateMover(
            self.model, self.trainer.optimizer, self.device, enabled=self.cfg.cluster.offload
        )

    # -- data-parallel group -------------------------------------------------------------

    def rendezvous_port(self) -> int:
        return free_port("0.0.0.0")

    def init_comm(self, init_method: str, backend: str = "gloo") -> bool:
        """Join the role's process group (every rank calls this at once; it blocks until all
        have joined). ``backend``: ``nccl`` where each rank has a GPU of its own (the driver
        decides), else ``gloo``."""
        if self.spec.world_size > 1:
            if self.device.type != "cuda":
                backend = "gloo"
            self.comm = TorchDistComm(init_method, self.spec.rank, self.spec.world_size, backend)
            self.trainer.comm = self.comm
        return True

    # -- phases --------------------------------------------------------------------------

    def compute_log_probs(self, step: int, shard: RolloutBatch) -> LogProbs:
        """Old-policy log-probs and entropy of this rank's shard."""
        with self.phase(COMPUTE_LOG_PROBS, step, self.mover):
            out = self.trainer.log_probs(shard)
        self.producer.log(
            emit.old_log_probs(
                out.log_probs, out.entropy, shard.response_mask, shard.rollout_log_probs
            ),
            step,
        )
        return out

    def train_step(self, step: int, shard: RolloutBatch, kl_coef: float) -> dict[str, float]:
        """PPO update on this rank's shard; logs every optimizer step's stats.
        Returns a small summary for the progress bar."""
        with self.phase(TRAIN_STEP, step, self.mover):
            result = self.trainer.train(shard, kl_coef)
            # after the last all-reduce, so that only this rank is slower (faults.py)
            self.cfg.faults.inject("slow_train", step, self.spec.rank)
        for stats, sft in zip(result.policy, result.sft, strict=True):
            self.producer.log(emit.policy_step(stats, sft), step)
        self.producer.log(emit.policy_shard(shard, result.lr), step)
        # This rank's terms of each optimizer step's global pg_loss: summed over ranks and
        # divided by the number of steps, the mean over steps that actor/pg_loss reports.
        return {
            "optimizer_steps": float(len(result.policy)),
            "pg_loss_part": sum(s.pg_loss.part for s in result.policy),
        }

    def export_weights(self, step: int) -> dict[str, torch.Tensor]:
        """The policy weights for the rollout engine (model_update, sending side)."""
        with self.phase(MODEL_UPDATE, step, self.mover):
            state = {k: v.detach().to("cpu", copy=True) for k, v in self.model.state_dict().items()}
            self.cfg.faults.inject("stall_sync", step)  # rank 0 alone pushes the weights
        return state

    def checkpoint(self, step: int, directory: str) -> str | None:
        """Rank 0 writes the policy in HuggingFace format (``save_pretrained``, with the
        tokenizer, loadable by ``AutoModelForCausalLM``) and the optimizer state; every rank
        times the phase (the replicas are identical, so one copy is the checkpoint)."""
        out = Path(directory) / "actor"
        with self.phase(DO_CHECKPOINT, step, self.mover):
            if self.spec.rank != 0:
                return None
            out.mkdir(parents=True, exist_ok=True)
            self.model.save_pretrained(out)
            self.tokenizer.save_pretrained(out)
            torch.save(
                {"step": step, "optimizer": self.trainer.optimizer.state_dict()},
                out / "optimizer.pt",
            )
        return str(out)

    def close(self) -> dict[str, int]:
        self.comm.close()
        return super().close()
