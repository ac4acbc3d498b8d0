"""Faults injected into the demo trainer on purpose: a debugging aid, and the step ledger's
proof (docs/ledger.md). Off unless a step is set; not for training runs.

Each fault delays one step in a known place, so the ledger of that step must name it:

* ``slow_train_step``: actor_train rank ``slow_train_rank`` spends ``slow_train_s`` more in
  its ``train_step`` phase, after its last gradient all-reduce (a delay before it would make
  the other ranks wait inside their own all-reduce, inside their phase: no rank's span could
  show it) -> ``straggler``, that rank, ``actor_train/train_step``;
* ``slow_reward_step``: the reward worker's ``compute_rewards`` takes ``slow_reward_s`` more
  -> ``reward``, ``reward/0``;
* ``stall_sync_step``: actor_train rank 0's weight push (its ``model_update`` phase, the
  sending side) stalls ``stall_sync_s`` -> ``sync``, ``actor_train/0``;
* ``long_response_step``: the first prompt of the step's training generation gets a response
  of ``long_response_factor`` times ``rollout.max_new_tokens`` tokens (so at least that many
  times every other response), its end of sequence held back -> ``rollout_tail``,
  ``rollout/0``. The batch still cuts it to ``max_new_tokens`` (it trains as a truncated
  response), and its sampled log-probs are those of the held-back sampling.

``--set faults.slow_reward_step=4`` (any of them, with its seconds or factor) turns one on.

>>> FaultsConfig(slow_reward_step=4).delay("slow_reward", step=4)
1.0
>>> FaultsConfig().delay("slow_reward", step=4)
0.0
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from rlpulse.schemas.errors import ConfigError

PROMPT_ROOM = 16
"""Positions left for a prompt when the long response must fit the model (the demo's tasks'
prompts are a few characters, one token each)."""


@dataclass(frozen=True)
class FaultsConfig:
    """The trainer config's ``faults`` section (see the module docstring). ``-1``: off."""

    slow_train_step: int = -1
    slow_train_rank: int = 0
    slow_train_s: float = 1.0
    slow_reward_step: int = -1
    slow_reward_s: float = 1.0
    stall_sync_step: int = -1
    stall_sync_s: float = 1.0
    long_response_step: int = -1
    long_response_factor: int = 10

    def __post_init__(self) -> None:
        for name in (
            "slow_train_step",
            "slow_reward_step",
            "stall_sync_step",
            "long_response_step",
        ):
            if getattr(self, name) < -1:
                raise ConfigError(
                    f"faults.{name}", "must be a step (>= 0), or -1 for off", getattr(self, name)
                )
        for name in ("slow_train_s", "slow_reward_s", "stall_sync_s"):
            if not getattr(self, name) > 0:
                raise ConfigError(
                    f"faults.{name}", "must be a positive number of seconds", getattr(self, name)
                )
        if self.slow_train_rank < 0:
            raise ConfigError(
                "faults.slow_train_rank", "must be a rank (>= 0)", self.slow_train_rank
            )
        if self.long_response_factor < 2:
            raise ConfigError(
                "faults.long_response_factor", "must be at least 2", self.long_response_factor
            )

    def check(self, actor_train_ranks: int, max_new_tokens: int, positions: int) -> None:
        """What only the whole config can tell: the slow rank exists, the long response fits
        the model (``positions``: ``model.max_position_embeddings``)."""
        if self.slow_train_step >= 0 and self.slow_train_rank >= actor_train_ranks:
            raise ConfigError(
                "faults.slow_train_rank",
                f"must be below cluster.actor_train_ranks ({actor_train_ranks})",
                self.slow_train_rank,
            )
        tokens = self.long_tokens(max_new_tokens)
        if self.long_response_step >= 0 and tokens + PROMPT_ROOM > positions:
            raise ConfigError(
                "faults.long_response_factor",
                f"a response of {tokens} tokens (the factor x rollout.max_new_tokens) and a "
                f"prompt of up to {PROMPT_ROOM} do not fit model.max_position_embeddings "
                f"({positions}): raise it, or lower the factor or max_new_tokens",
                self.long_response_factor,
            )

    def long_tokens(self, max_new_tokens: int) -> int:
        """The long response's tokens."""
        return self.long_response_factor * max_new_tokens

    def delay(self, fault: str, step: int, rank: int = 0) -> float:
        """Seconds fault ``fault`` (``slow_train``, ``slow_reward``, ``stall_sync``) adds at
        ``step`` on ``rank`` (of actor_train, for ``slow_train``)."""
        at: int = getattr(self, f"{fault}_step")
        if at < 0 or at != step or (fault == "slow_train" and rank != self.slow_train_rank):
            return 0.0
        return float(getattr(self, f"{fault}_s"))

    def inject(self, fault: str, step: int, rank: int = 0) -> None:
        """Sleep :meth:`delay` seconds: the fault, where the caller stands."""
        seconds = self.delay(fault, step, rank)
        if seconds:
            time.sleep(seconds)
