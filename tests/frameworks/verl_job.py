"""What verl's PPO driver logs, made by verl's own metric code, and a TaskRunner for verl's
``run_ppo`` that builds ``Tracking`` the way ``RayPPOTrainer.fit`` does (tests only).

Imported only when verl is installed.
"""

from __future__ import annotations

import json
import os
from typing import Any

import ray
import torch
from omegaconf import DictConfig, OmegaConf
from verl import DataProto
from verl.trainer.ppo.metric_utils import (
    compute_data_metrics,
    compute_throughout_metrics,
    compute_timing_metrics,
)
from verl.utils.metric import reduce_metrics

PROMPT, RESPONSE, BATCH = 5, 7, 6


def driver_metrics(step: int) -> dict[str, Any]:
    """One step's metrics as verl's driver assembles them: ``compute_data_metrics``,
    ``compute_timing_metrics`` and ``compute_throughout_metrics`` on a batch (left-padded
    prompts, responses of random lengths), and worker metrics through ``reduce_metrics``."""
    g = torch.Generator().manual_seed(1000 + step)
    prompt_len = torch.randint(1, PROMPT + 1, (BATCH,), generator=g)
    response_len = torch.randint(1, RESPONSE + 1, (BATCH,), generator=g)
    positions_p, positions_r = torch.arange(PROMPT), torch.arange(RESPONSE)
    prompt_mask = (positions_p >= PROMPT - prompt_len[:, None]).long()
    response_mask = (positions_r < response_len[:, None]).long()
    scores = torch.zeros(BATCH, RESPONSE)
    scores[torch.arange(BATCH), response_len - 1] = torch.rand(BATCH, generator=g)
    batch = DataProto.from_single_dict(
        {
            "prompts": torch.randint(4, 40, (BATCH, PROMPT), generator=g),
            "responses": torch.randint(4, 40, (BATCH, RESPONSE), generator=g),
            "attention_mask": torch.cat([prompt_mask, response_mask], dim=1),
            "response_mask": response_mask,
            "token_level_scores": scores,
            "token_level_rewards": scores - 0.01,
            "advantages": torch.randn(BATCH, RESPONSE, generator=g) * response_mask,
            "returns": torch.randn(BATCH, RESPONSE, generator=g) * response_mask,
        }
    )
    batch.meta_info["global_token_num"] = batch.batch["attention_mask"].sum(-1).tolist()
    timing = {"gen": 0.5 + step, "adv": 0.01, "update_actor": 0.25, "step": 1.0 + step}
    worker = reduce_metrics(
        {
            "actor/pg_loss": [0.1 * step, -0.05, 0.2],
            "actor/pg_clipfrac": [0.0, 0.25],
            "actor/grad_norm": [1.5],
            "actor/lr": [1e-6],
        }
    )
    return {
        **compute_data_metrics(batch, use_critic=False),
        **compute_timing_metrics(batch, timing),
        **compute_throughout_metrics(batch, timing, n_gpus=1),
        **worker,
    }


@ray.remote
class ProbeTaskRunner:
    """Given to verl's ``run_ppo`` as its ``task_runner_class`` (verl's hook for recipes): in
    the Ray actor where verl's PPO driver would run, build ``Tracking`` exactly as
    ``RayPPOTrainer.fit`` does and log ``steps`` steps of ``driver_metrics``. ``Tracking`` is
    dropped at the end, as ``fit``'s local is: verl's ``__del__`` calls ``finish()``. The
    backends it had are written to the JSON file ``PROBE_OUT`` names (``run_ppo`` drops the
    return value)."""

    def run(self, config: DictConfig, steps: int = 3) -> None:
        from verl.utils.tracking import Tracking

        logger = Tracking(
            project_name=config.trainer.project_name,
            experiment_name=config.trainer.experiment_name,
            default_backend=config.trainer.logger,
            config=OmegaConf.to_container(config, resolve=True),
        )
        for step in range(steps):
            logger.log(data=driver_metrics(step), step=step)
        with open(os.environ["PROBE_OUT"], "w") as f:
            json.dump({"backends": list(logger.logger), "pid": os.getpid()}, f)


CLIPPED = {0: (1, 4), 1: (9, 45)}
"""Each actor rank's clipped tokens and tokens, at every step."""


@ray.remote(num_cpus=0)
class ActorRank:
    """A verl actor worker logging exactly from its micro-batches (the README's "Exact, from
    verl's workers"), in a process of the job: Ray ran the setup hook in it."""

    def log_steps(self, rank: int, world_size: int, steps: int) -> str:
        from rlpulse.producer import Fraction
        from rlpulse.producer.integrations.verl import worker_producer

        os.environ.update(RANK=str(rank), WORLD_SIZE=str(world_size))  # verl's worker group's
        producer = worker_producer("actor_train", reductions={"actor/pg_clipfrac": "fraction"})
        for step in range(steps):
            producer.log({"actor/pg_clipfrac": Fraction(*CLIPPED[rank])}, step=step)
        producer.close()
        return os.environ.get("RLPULSE_EXPECTED_ROLES", "")


@ray.remote
class LateDriverTaskRunner:
    """verl's order of start-up: the workers exist (``init_workers``) and may log before
    ``fit()`` builds ``Tracking``, whose rlpulse backend is the driver's producer. Here the
    actor ranks log every step first; the driver registers ``LATE_DRIVER_S`` seconds later and
    logs the same steps. What the workers' processes had in ``RLPULSE_EXPECTED_ROLES`` is
    written to ``PROBE_OUT``."""

    def run(self, config: DictConfig, steps: int = 3) -> None:
        import time

        from verl.utils.tracking import Tracking

        ranks = [ActorRank.remote() for _ in CLIPPED]
        declared = ray.get([r.log_steps.remote(i, len(ranks), steps) for i, r in enumerate(ranks)])
        time.sleep(float(os.environ["LATE_DRIVER_S"]))
        logger = Tracking(
            project_name=config.trainer.project_name,
            experiment_name=config.trainer.experiment_name,
            default_backend=config.trainer.logger,
            config=OmegaConf.to_container(config, resolve=True),
        )
        for step in range(steps):
            logger.log(data=driver_metrics(step), step=step)
        logger.finish()
        with open(os.environ["PROBE_OUT"], "w") as f:
            json.dump({"declared": declared}, f)
