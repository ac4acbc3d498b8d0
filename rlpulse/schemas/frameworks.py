"""The names verl and TRL log their metrics under, where they are not rlpulse's catalog names.

rlpulse neither defines nor merges these by the catalog (the integrations send a framework's
driver values as they are, and declare how the names they log exactly merge); they are spelled
here, once, for the code that needs them: the integrations' exact hooks
(``rlpulse.producer.integrations.verl_states``, ``trl_loss``) and the run tools, which draw and
compare a verl or TRL run under the titles these names mean (``rlpulse.runtools.quantities``).
A name a framework shares with the catalog (verl's ``critic/score/mean``, ``actor/pg_loss``,
``actor/kl_loss``) is the catalog's, and is not repeated here.

Read from verl 0.9.1 (``trainer/ppo/metric_utils.py``, ``core_algos.py``, ``ray_trainer.py``,
``workers/utils/losses.py``, ``workers/engine_workers.py``, ``utils/debug/metrics.py``) and
TRL 1.16.0 (``GRPOTrainer`` and ``RLOOTrainer``'s ``_metrics``, and ``transformers.Trainer``'s
own logs).

>>> VERL_VAL_CORE.match("val-core/gsm8k/acc/mean@4") is not None
True
"""

from __future__ import annotations

import re

# verl: the actor's update (its workers' metrics, prefixed "actor/" by the driver)
VERL_PG_CLIPFRAC = "actor/pg_clipfrac"
VERL_PPO_KL = "actor/ppo_kl"
"""Mean of logp_old - logp over the loss tokens: KL of the old to the current policy."""
VERL_ACTOR_LOSS = "actor/loss"
"""The actor's back-propagated loss (policy gradient, KL and entropy terms), all-reduced."""
VERL_ENTROPY = "actor/entropy"
VERL_ENTROPY_LOSS = "actor/entropy_loss"
VERL_ACTOR_GRAD_NORM = "actor/grad_norm"
VERL_REWARD_KL = "actor/reward_kl_penalty"
"""The k1 KL to the reference subtracted from the reward (``use_kl_in_reward``)."""
VERL_REWARD_KL_COEF = "actor/reward_kl_penalty_coeff"

# verl: the critic's update (prefixed "critic/")
VERL_VF_LOSS = "critic/vf_loss"
VERL_VF_CLIPFRAC = "critic/vf_clipfrac"
VERL_VPRED_MEAN = "critic/vpred_mean"
VERL_CRITIC_GRAD_NORM = "critic/grad_norm"
VERL_VF_EXPLAINED_VAR = "critic/vf_explained_var"

# verl: the driver's batch statistics (compute_data_metrics)
VERL_RESPONSE_LENGTH_MEAN = "response_length/mean"
VERL_RESPONSE_LENGTH_MAX = "response_length/max"
VERL_PROMPT_LENGTH_MEAN = "prompt_length/mean"

# verl: time and throughput (compute_timing_metrics, compute_throughout_metrics)
VERL_TIMING_PREFIX = "timing_s/"
"""``timing_s/{stage}``: the driver's seconds per stage (gen, old_log_prob, ref, values, adv,
update_actor, update_critic, update_weights, testing, step...)."""
VERL_THROUGHPUT = "perf/throughput"
"""Tokens per second per GPU: perf/total_num_tokens / (perf/time_per_step * GPUs)."""
VERL_MAX_MEMORY_ALLOCATED = "perf/max_memory_allocated_gb"
VERL_MAX_MEMORY_RESERVED = "perf/max_memory_reserved_gb"
VERL_CPU_MEMORY_USED = "perf/cpu_memory_used_gb"
"""The host's memory in use (psutil's virtual_memory().used), GB."""

# verl: rollout against trainer, and off-policy staleness
VERL_ROLLOUT_PROBS_DIFF_MEAN = "training/rollout_probs_diff_mean"
VERL_ROLLOUT_PROBS_DIFF_MAX = "training/rollout_probs_diff_max"
"""|p_rollout - p_trainer| of the response tokens (probabilities, not log-probs)."""
VERL_STALENESS_MEAN = "training/off_policy/trajectory_staleness/mean"
VERL_STALENESS_MAX = "training/off_policy/trajectory_staleness/max"

# verl: validation (_val_metrics_update): val-core/{data source}/{acc or reward}/mean@{n}
VERL_VAL_CORE = re.compile(r"val-core/[^/]+/(acc|reward)/mean@\d+\Z")

# TRL (GRPOTrainer, RLOOTrainer; transformers.Trainer for loss, grad_norm, learning_rate)
TRL_LOSS = "loss"
"""The loss back-propagated (policy term, minus the entropy bonus, plus auxiliary terms)."""
TRL_POLICY_LOSS = "policy_loss"
"""The policy term alone (logged when an entropy bonus is part of the loss)."""
TRL_REWARD = "reward"
TRL_REWARD_FUNCTIONS = re.compile(r"rewards/[^/]+/mean\Z")
"""``rewards/{reward function}/mean``: each reward function's mean over the generation."""
TRL_EVAL_REWARD = "eval_reward"
TRL_ENTROPY = "entropy"
TRL_KL = "kl"
"""Per-token KL of the policy to the reference (k3), when beta is not 0."""
TRL_CLIP_LOW = "clip_ratio/low_mean"
TRL_CLIP_HIGH = "clip_ratio/high_mean"
TRL_CLIP_REGION = "clip_ratio/region_mean"
TRL_CLIP_LOW_MIN = "clip_ratio/low_min"
TRL_CLIP_HIGH_MAX = "clip_ratio/high_max"
TRL_CISPO_CLIP = "cispo_clip_ratio"
TRL_VESPO_PHI = "vespo/phi_seq_mean"
TRL_COMPLETION_MEAN_LENGTH = "completions/mean_length"
TRL_COMPLETION_MAX_LENGTH = "completions/max_length"
TRL_SAMPLING_LOGP_DIFF_MEAN = "sampling/sampling_logp_difference/mean"
TRL_SAMPLING_LOGP_DIFF_MAX = "sampling/sampling_logp_difference/max"
"""|logp_old - logp_vllm| of the completion tokens, with vLLM's importance-sampling correction."""
TRL_STEP_TIME = "step_time"
TRL_GRAD_NORM = "grad_norm"
TRL_LEARNING_RATE = "learning_rate"
