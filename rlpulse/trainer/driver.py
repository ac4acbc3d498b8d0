"""The single controller: one PPO step after another, read top to bottom.

Each step:

1. model_update: actor_train rank 0 hands its weights to the rollout engine;
2. (validation on held-out prompts, at the start of every ``val_every``-th step);
3. rollout: sample responses to training prompts                        -> time/rollout
   (with ``ppo.off_policy_steps`` k > 0, the batch generated k steps ago; this step's own
   rollout, for step t + k, runs while this one trains)
4. reference log-probs and verifier rewards, in parallel  -> time/ref_log_probs_values_reward
5. old-policy log-probs (sharded over actor_train) and critic values     -> time/old_log_probs_values
6. rewards -> KL shaping -> advantages (GAE, or GRPO groups), here in the driver -> time/adv
7. actor_train ranks and the critic train, in parallel; the KL controller adapts;
8. at the last step: validation of the final policy, checkpoint and HuggingFace export;
9. the driver logs the batch-level data metrics, and every worker closes the step.

Workers log what they compute; the driver logs only what it computes (batch data, stage
timings, validation).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import ray

from rlpulse.producer import Producer
from rlpulse.schemas import metrics as m
from rlpulse.trainer import emit
from rlpulse.trainer.advantage import compute_advantages, sample_weights, validity
from rlpulse.trainer.batch import concat_rows, shard_indices
from rlpulse.trainer.cluster import Workers
from rlpulse.trainer.config import TrainerConfig
from rlpulse.trainer.diversity import distinct_n, repetition
from rlpulse.trainer.ppo import AdaptiveKLController
from rlpulse.trainer.progress import Progress
from rlpulse.trainer.samples import rollout_rows, validation_rows
from rlpulse.trainer.task import Problem, Task, is_correct, score


@dataclass
class RunResult:
    """What a run did, for the CLI and the tests."""

    steps: int = 0
    val_scores: list[tuple[int, float]] = field(default_factory=list)
    """(step, val/score/mean) of every validation, in order."""
    train_scores: list[float] = field(default_factory=list)
    export_dir: str | None = None
    kl_coef: float = 0.0
    producer_problems: dict[str, int] = field(default_factory=dict)
    """Counters of metrics the producers dropped or rejected, summed over workers (empty: none)."""
    step_seconds: list[float] = field(default_factory=list)
    """Wall time of each step, as the driver saw it (the training-overhead benchmark)."""


@dataclass(frozen=True)
class PendingRollout:
    """Responses being generated (a Ray object ref to a Generation) for the prompts behind them."""

    problems: list[Problem]
    generation: ray.ObjectRef


class RolloutLost(RuntimeError):
    """The rollout worker (with its inference engine) died: this step's rollout is lost."""


def rollout_get(step: int, ref: ray.ObjectRef) -> Any:
    """``ray.get`` of a rollout worker call, a dead worker (a killed or crashed process, its
    in-process vLLM engine with it) turned into an error that says what was lost and what to
    do. An engine that fails inside a live worker raises its own EngineError, naming the fix."""
    try:
        return ray.get(ref)
    except ray.exceptions.RayActorError as exc:
        raise RolloutLost(
            f"the rollout worker and its engine died at step {step}: this step's rollout is "
            "lost and no later step runs (the collector emits no step as complete that was not "
            "logged). Look for the cause (out of memory, a killed process) in the worker's log "
            f"above, then restart with --resume. ({type(exc).__name__})"
        ) from exc


@contextmanager
def timed(into: dict[str, float], name: str) -> Iterator[None]:
    t0 = time.perf_counter()
    try:
        yield
    finally:
        into[name] = time.perf_counter() - t0


class Driver:
    """Runs the steps against a set of workers and logs the driver's metrics."""

    def __init__(
        self, cfg: TrainerConfig, workers: Workers, producer: Producer, task: Task
    ) -> None:
        self.cfg, self.workers, self.producer, self.task = cfg, workers, producer, task
        ppo = cfg.ppo
        self.kl = AdaptiveKLController(ppo.kl_coef, ppo.target_kl, ppo.kl_horizon, ppo.kl_coef_max)
        self.result = RunResult()
        self.rollouts: deque[PendingRollout] = deque()
        """Batches generated ahead for the next steps (ppo.off_policy_steps of them)."""
        self.generated = 0

    def run(self) -> RunResult:
        last = self.cfg.steps - 1
        with Progress(self.cfg.steps, enabled=self.cfg.progress) as bar:
            for step in range(self.cfg.steps):
                val_first = (
                    self.cfg.val_every > 0 and step % self.cfg.val_every == 0 and step != last
                )
                started = time.perf_counter()
                summary = self.step(step, validate_first=val_first, final=step == last)
                self.result.step_seconds.append(time.perf_counter() - started)
                bar.update(summary)
        return self.result

    def step(self, step: int, *, validate_first: bool, final: bool) -> dict[str, float]:
        cfg, w = self.cfg, self.workers
        times: dict[str, float] = {}

        # 1. Sync the rollout engine with the policy being trained (a no-op change at step 0,
        # but the same path every step).
        rollout_get(
            step,
            w.rollout.update_weights.remote(step, w.actor_train[0].export_weights.remote(step)),
        )

        summary: dict[str, float] = {}
        if validate_first:
            summary["val"] = self.validate(step)

        # 3. Rollout: each prompt is asked samples_per_prompt times (a GRPO group). On-policy
        # (ppo.off_policy_steps = 0) the batch of step t is generated now, by the weights just
        # synced. With k steps off-policy, the rollout runs k steps ahead: step t trains on
        # the batch generated at step t - k by that step's weights, and the batch for step
        # t + k starts generating now, while this step trains (the first k steps use batches
        # generated at step 0).
        group = cfg.rollout.samples_per_prompt
        with timed(times, m.TIME_ROLLOUT.name):
            while len(self.rollouts) <= cfg.ppo.off_policy_steps and self.generated < cfg.steps:
                problems = [
                    p for p in self.task.sample(cfg.ppo.batch_size // group) for _ in range(group)
                ]
                prompts = [p.prompt for p in problems]
                self.rollouts.append(
                    PendingRollout(problems, w.rollout.generate.remote(step, prompts))
                )
                self.generated += 1
            pending = self.rollouts.popleft()
            problems, gen = pending.problems, rollout_get(step, pending.generation)
        batch = gen.batch

        # 4. Reference log-probs and rewards do not depend on each other: run them together.
        with timed(times, m.TIME_REF_LOG_PROBS_VALUES_REWARD.name):
            ref_ref = w.reference.compute_log_probs.remote(step, batch)
            reward_ref = w.reward.compute_rewards.remote(
                step, gen.responses, [p.answer for p in problems]
            )
            ref_log_probs, (scores, correct) = ray.get([ref_ref, reward_ref])

        # 5. Old-policy log-probs on the data-parallel shards, values on the critic.
        n_ranks = len(w.actor_train)
        rows = [shard_indices(batch.size, r, n_ranks, cfg.ppo.mini_batches) for r in range(n_ranks)]
        with timed(times, m.TIME_OLD_LOG_PROBS_VALUES.name):
            lp_refs = [
                a.compute_log_probs.remote(step, batch.select(rows[r]))
                for r, a in enumerate(w.actor_train)
            ]
            values_ref = (
                w.critic.compute_values.remote(step, batch) if w.critic is not None else None
            )
            parts = ray.get(lp_refs)
            values = ray.get(values_ref) if values_ref is not None else None
        old_log_probs = concat_rows([p.log_probs for p in parts], rows, batch.size)

        # 6. Advantages, in one place so that normalisation and whitening are batch-global.
        with timed(times, m.TIME_ADV.name):
            batch = batch.replace(
                scores=scores,
                valid=validity(gen.truncated, batch.response_lengths, scores, cfg.ppo, group),
                sample_weights=sample_weights(
                    [p.difficulty for p in problems], cfg.ppo.sample_weighting
                ),
                old_log_probs=old_log_probs,
                ref_log_probs=ref_log_probs,
                values=values,
            )
            adv = compute_advantages(batch, cfg.ppo, self.kl.coef, group)
            # Positive samples (for the SFT losses) are the positively rewarded ones: after
            # normalisation, those better than the batch average (GRPO: than their group's).
            assert adv.batch.rewards is not None  # step 4 scored every sample
            batch = adv.batch.replace(positive=adv.batch.rewards > 0)

        # 7. Train the policy (sharded) and the critic together; then adapt the KL coefficient
        # to the KL this batch showed (the coefficient used is the one logged).
        kl_coef = self.kl.coef
        train_refs = [
            a.train_step.remote(step, batch.select(rows[r]), kl_coef)
            for r, a in enumerate(w.actor_train)
        ]
        critic_ref = w.critic.train_step.remote(step, batch) if w.critic is not None else None
        actor_out = ray.get(train_refs)
        if critic_ref is not None:
            ray.get(critic_ref)
        self.kl = self.kl.update(adv.ref_kl, n_steps=batch.size)

        # 8. The last step: validate the final policy, checkpoint and export it.
        if final:
            summary["val"] = self.validate(step, after_update=True)
        if final or (cfg.save_every and (step + 1) % cfg.save_every == 0):
            self.checkpoint(step)

        # 9. The driver's own metrics, then close the step everywhere.
        self.producer.log(
            {
                **emit.batch_data(adv, correct, kl_coef),
                **emit.staleness(step - gen.policy_version, batch.response_mask),
                **emit.stage_times(times),
                **emit.rollout_samples(
                    rollout_rows([p.prompt for p in problems], gen, batch, step)
                ),
            },
            step,
        )
        others = [x.step_done.remote(step) for x in w.all() if x is not w.rollout]
        rollout_get(step, w.rollout.step_done.remote(step))
        ray.get(others)
        self.producer.step_done(step)

        score_mean = float(scores.mean())
        self.result.steps = step + 1
        self.result.train_scores.append(score_mean)
        self.result.kl_coef = self.kl.coef
        steps = actor_out[0]["optimizer_steps"]  # the same on every rank
        summary.update(
            score=score_mean,
            kl=adv.ref_kl,
            kl_coef=kl_coef,
            pg_loss=sum(o["pg_loss_part"] for o in actor_out) / max(steps, 1.0),
        )
        return summary

    def validate(self, step: int, after_update: bool = False) -> float:
        """Greedy answers to the held-out prompts: val/score, accuracy and diversity."""
        w = self.workers
        if after_update:  # the rollout engine still holds the weights from before the update
            ray.get(
                w.rollout.update_weights.remote(step, w.actor_train[0].export_weights.remote(step))
            )
        problems = self.task.val
        gen = rollout_get(step, w.rollout.generate.remote(step, [p.prompt for p in problems], True))
        scores = [score(r, p.answer) for r, p in zip(gen.responses, problems, strict=True)]
        correct = [is_correct(r, p.answer) for r, p in zip(gen.responses, problems, strict=True)]
        distinct = {n: distinct_n(gen.responses, n) for n in (1, 2)}
        rows = validation_rows([p.prompt for p in problems], gen, scores)
        self.producer.log(
            {
                **emit.validation(scores, correct, distinct, repetition(gen.responses, 2)),
                **emit.validation_samples(rows),
            },
            step,
        )
        mean = sum(scores) / len(scores)
        self.result.val_scores.append((step, mean))
        return mean

    def checkpoint(self, step: int) -> None:
        directory = str(self.cfg.run_dir / f"checkpoint-{step}")
        refs = [a.checkpoint.remote(step, directory) for a in self.workers.actor_train]
        if self.workers.critic is not None:
            refs.append(self.workers.critic.checkpoint.remote(step, directory))
        paths = ray.get(refs)
        self.result.export_dir = paths[0]
