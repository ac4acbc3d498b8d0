"""reward: the verifier. Scores responses against the task's reference answers."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from rlpulse.schemas.topology import COMPUTE_REWARDS, REWARD
from rlpulse.trainer.task import is_correct, score
from rlpulse.trainer.workers.base import Worker


class RewardWorker(Worker):
    role = REWARD

    def compute_rewards(
        self, step: int, responses: Sequence[str], answers: Sequence[str]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Per response: the score in [0, 1] and whether the answer is exactly right."""
        # A rule-based verifier has no model state to move, so this phase has no onload or
        # offload to time (a reward *model* would pass its StateMover like the other roles).
        with self.producer.phase(f"{self.role}/{COMPUTE_REWARDS}", step=step):
            scores = torch.tensor([score(r, a) for r, a in zip(responses, answers, strict=True)])
            correct = torch.tensor(
                [is_correct(r, a) for r, a in zip(responses, answers, strict=True)]
            )
            self.cfg.faults.inject("slow_reward", step)
        return scores, correct
