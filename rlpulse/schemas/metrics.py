"""Every metric rlpulse defines. This file is the one place a metric name is spelled.

Code that logs a metric refers to the constant (``metrics.ACTOR_PG_LOSS.name``, or
``metrics.TIME_PHASE.format(...)`` for a template), never to a string literal.

Reductions follow ``shared/METRICS-NOTES.md``: token-level quantities are pooled over tokens,
sequence-level ones over sequences, clip fractions are numerator/denominator, counts add up,
phase times and memory take the maximum across ranks (the step waits for the slowest rank,
and the largest footprint is the one that runs out of memory), learning rates keep the last
value. Memory is in GiB (bytes / 1024**3), as ROLL reports it.

Each help text names its formula and the peer it follows: ROLL's where ROLL and verl differ
(the names come from ROLL's metric reference), verl's for verl's own names. Loss statistics
of an optimizer step are aggregated over the step's *global* mini-batch by ``ppo.loss_agg_mode``
(token-mean, seq-mean-token-sum, seq-mean-token-mean, seq-mean-token-sum-norm, the modes of
verl's and ROLL's ``agg_loss``) or by the fixed mode the help names; every rank logs its term
with its share of the denominator, so the pooled value is the global one, and a training step
reports the mean over its optimizer steps, as ROLL does. Actor statistics are over the loss
tokens, those of the samples that pass the validity filter (ROLL takes approxkl, policykl, the
ratio and clipfrac over every response token, including samples its filters drop).
"""

from __future__ import annotations

from rlpulse.schemas import (
    attribution,  # why a step was slow (the step ledger's causes)
    engine,  # the rollout engine's own metrics (vLLM)
    ledger,  # the step ledger: where a step's wall time went
)
from rlpulse.schemas.catalog import Catalog, Entry, Template, family
from rlpulse.schemas.evaluation import (  # held-out validation, listed here
    VAL_ACCURACY as VAL_ACCURACY,
    VAL_DISTINCT_1 as VAL_DISTINCT_1,
    VAL_DISTINCT_2 as VAL_DISTINCT_2,
    VAL_REPETITION_RATE as VAL_REPETITION_RATE,
    VAL_SAMPLES as VAL_SAMPLES,
    VAL_SCORE as VAL_SCORE,
)
from rlpulse.schemas.histogram import Histogram
from rlpulse.schemas.reductions import Reduction, Stat
from rlpulse.schemas.rollout import (  # rollout engine vs trainer, staleness, samples, listed here
    ASYNC_STALENESS as ASYNC_STALENESS,
    ROLLOUT_LOGPROB_DIFF as ROLLOUT_LOGPROB_DIFF,
    ROLLOUT_PROB_RATIO as ROLLOUT_PROB_RATIO,
    ROLLOUT_RESPONSE_FINISH as ROLLOUT_RESPONSE_FINISH,
    ROLLOUT_RESPONSE_LONGEST as ROLLOUT_RESPONSE_LONGEST,
    ROLLOUT_SAMPLES as ROLLOUT_SAMPLES,
)
from rlpulse.schemas.serving import (  # the policy server's metrics, listed here
    SERVE_BATCH_SIZE as SERVE_BATCH_SIZE,
    SERVE_ERRORS as SERVE_ERRORS,
    SERVE_ERRORS_TOTAL as SERVE_ERRORS_TOTAL,
    SERVE_LATENCY as SERVE_LATENCY,
    SERVE_LATENCY_BUCKETS as SERVE_LATENCY_BUCKETS,
    SERVE_LATENCY_P50 as SERVE_LATENCY_P50,
    SERVE_LATENCY_P95 as SERVE_LATENCY_P95,
    SERVE_LATENCY_P99 as SERVE_LATENCY_P99,
    SERVE_LATENCY_SUMMARY as SERVE_LATENCY_SUMMARY,
    SERVE_QUEUE_DEPTH as SERVE_QUEUE_DEPTH,
    SERVE_REQUESTS as SERVE_REQUESTS,
    SERVE_REQUESTS_TOTAL as SERVE_REQUESTS_TOTAL,
    SERVE_TOKENS_GENERATED as SERVE_TOKENS_GENERATED,
    SERVE_TOKENS_GENERATED_TOTAL as SERVE_TOKENS_GENERATED_TOTAL,
)
from rlpulse.schemas.sketch import distribution
from rlpulse.schemas.system import (  # run-level throughput and stage times, listed here
    SYSTEM_SAMPLES as SYSTEM_SAMPLES,
    SYSTEM_STEP_SAMPLES as SYSTEM_STEP_SAMPLES,
    SYSTEM_STEP_TOKENS as SYSTEM_STEP_TOKENS,
    SYSTEM_TOKENS as SYSTEM_TOKENS,
    SYSTEM_TPS as SYSTEM_TPS,
    TIME_ADV as TIME_ADV,
    TIME_OLD_LOG_PROBS_VALUES as TIME_OLD_LOG_PROBS_VALUES,
    TIME_REF_LOG_PROBS_VALUES_REWARD as TIME_REF_LOG_PROBS_VALUES_REWARD,
    TIME_ROLLOUT as TIME_ROLLOUT,
)
from rlpulse.schemas.topology import (  # the templates are defined with the topology, listed here
    GPU_DEVICE_MEMORY as GPU_DEVICE_MEMORY,
    GPU_POWER as GPU_POWER,
    GPU_TEMPERATURE as GPU_TEMPERATURE,
    GPU_UTILIZATION as GPU_UTILIZATION,
    MEMORY_CPU as MEMORY_CPU,
    MEMORY_GPU as MEMORY_GPU,
    STRAGGLER as STRAGGLER,
    TIME_PHASE as TIME_PHASE,
    TIME_PHASE_GPU as TIME_PHASE_GPU,
)

MEAN, FRACTION, SUM, MAX, LAST = (Reduction[r] for r in ("MEAN", "FRACTION", "SUM", "MAX", "LAST"))
UNDERSCORE = "{name}_{stat}"


# Value function
CRITIC_LR = Entry(
    "critic/lr", LAST, "1", "Critic optimizer learning rate (the same on every rank)."
)
_SEQ_MEAN = (
    "per-sequence token mean, averaged over the sequences of the global mini-batch, then over "
    "optimizer steps"
)
CRITIC_LOSS = Entry(
    "critic/loss",
    MEAN,
    "1",
    "Value loss 0.5 * max((v - R)^2, (v_clipped - R)^2), v_clipped within value_clip of the "
    f"old value (0.5 * (v - R)^2 without value clipping): {_SEQ_MEAN}. ROLL's critic loss "
    "(verl's critic/vf_loss is token-weighted by default); it is what the critic optimises.",
)
CRITIC_VALUE = Entry(
    "critic/value",
    MEAN,
    "1",
    "Value of the old critic (the values GAE used) at each response token: "
    f"{_SEQ_MEAN}. ROLL's formula.",
)
CRITIC_VPRED = Entry(
    "critic/vpred",
    MEAN,
    "1",
    f"Value predicted by the critic being optimised: {_SEQ_MEAN}. ROLL's formula (verl's "
    "critic/vpred_mean is token-weighted).",
)
CRITIC_CLIPFRAC = Entry(
    "critic/clipfrac",
    FRACTION,
    "ratio",
    "Share of value tokens where the clipped term of the value loss was the larger (the "
    f"active branch): {_SEQ_MEAN}. ROLL's formula; 0 when value clipping is off, where ROLL "
    "reports the squared error under this name (a quirk not copied).",
)
CRITIC_ERROR = Entry(
    "critic/error",
    MEAN,
    "1",
    f"Squared error (v - R)^2 of the critic being optimised: {_SEQ_MEAN}. ROLL's formula.",
)

# Rewards and advantages
CRITIC_SCORE = family(
    "critic/score", "score", "Raw environment/verifier score of one response (ROLL and verl)."
)
CRITIC_REWARDS = family(
    "critic/rewards",
    "1",
    "Reward that enters the advantage, for one non-empty response: the sum of its token-level "
    "rewards, i.e. its score after batch normalisation (unbiased std) and clipping, minus "
    "kl_coef times its summed k1 KL to the reference when ppo.kl_placement is reward. ROLL and "
    "verl both report token_level_rewards.sum(-1), after the KL penalty. With GRPO, the raw "
    "score, from which the group standardisation makes the advantage (as verl reports it).",
)
CRITIC_ADVANTAGES = distribution(
    "critic/advantages",
    "1",
    "Advantage of one response token; pooled over tokens (ROLL and verl). PPO: GAE (whitened "
    "with ppo.whiten_advantages). "
    "GRPO: the response's raw score standardised within its prompt's group, (score - mean) / "
    "(std + 1e-6) with the unbiased std, as verl (compute_grpo_outcome_advantage) and ROLL "
    "(group_reward_norm) compute it.",
)
CRITIC_RETURNS = family(
    "critic/returns", "1", "Return of one response token; pooled over tokens (ROLL and verl)."
)
CRITIC_VALUES = family(
    "critic/values",
    "1",
    "Old critic's value at one response token; pooled over tokens (ROLL and verl).",
)
RESPONSE_LENGTH = distribution(
    "tokens/response_length", "tokens", "Length of one generated response in tokens."
)
PROMPT_LENGTH = family("tokens/prompt_length", "tokens", "Length of one prompt in tokens.")

# Policy
ACTOR_LR = Entry("actor/lr", LAST, "1", "Actor optimizer learning rate (the same on every rank).")
_TOKEN_MEAN = (
    "token mean over the loss tokens of the global mini-batch whatever ppo.loss_agg_mode, then "
    "mean over optimizer steps"
)
_BY_MODE = (
    "aggregated by ppo.loss_agg_mode over the global mini-batch, then mean over optimizer steps"
)
ACTOR_PPO_RATIO_HIGH_CLIPFRAC = Entry(
    "actor/ppo_ratio_high_clipfrac",
    FRACTION,
    "ratio",
    f"Share of loss tokens whose ratio exp(logp - logp_old) exceeds 1 + clip_high: {_TOKEN_MEAN} "
    "(ROLL).",
)
ACTOR_PPO_RATIO_LOW_CLIPFRAC = Entry(
    "actor/ppo_ratio_low_clipfrac",
    FRACTION,
    "ratio",
    f"Share of loss tokens whose ratio is below 1 - clip_low: {_TOKEN_MEAN} (ROLL).",
)
ACTOR_PPO_RATIO_CLIPFRAC = Entry(
    "actor/ppo_ratio_clipfrac",
    FRACTION,
    "ratio",
    "Share of loss tokens whose ratio is outside [1 - clip_low, 1 + clip_high]: "
    f"{_TOKEN_MEAN} (ROLL).",
)
ACTOR_RATIO = family(
    "actor/ratio",
    "ratio",
    "Importance ratio exp(logp - logp_old) of the loss tokens. _mean: per-sequence token mean, "
    "averaged over the sequences of the global mini-batch, then over optimizer steps (ROLL's "
    "seq-mean-token-mean, whatever ppo.loss_agg_mode); _max and _min: over every loss token.",
    UNDERSCORE,
)
ACTOR_CLIPFRAC = Entry(
    "actor/clipfrac",
    FRACTION,
    "ratio",
    "Share of the policy loss's weight on tokens where the clipped surrogate was the active "
    "branch (clip(r) * A < r * A), following ppo.loss_agg_mode: tokens weigh equally under "
    "token-mean and the two token-sum modes, sequences under seq-mean-token-mean; then mean "
    "over optimizer steps. ROLL's value under token-mean and seq-mean-token-mean; under the "
    "token-sum modes ROLL's is a count of clipped tokens per sequence, not a fraction.",
)
ACTOR_PG_CLIPFRAC_LOWER = Entry(
    "actor/pg_clipfrac_lower",
    FRACTION,
    "ratio",
    "Share of loss tokens where the dual clip was active (A < 0 and the clipped loss above "
    f"-clip_ratio_c * A): {_TOKEN_MEAN}. verl's formula; 0 when ppo.clip_ratio_c is null.",
)
ACTOR_KL_LOSS = Entry(
    "actor/kl_loss",
    MEAN,
    "nats",
    "KL to the reference policy, k3 = exp(r) - r - 1 with r = logp_ref - logp, clamped to "
    f"[-10, 10] per token (ROLL's compute_approx_kl k3, verl's low_var_kl): {_BY_MODE} (ROLL). "
    "Measured whether or not the KL is in the loss.",
)
ACTOR_TOTAL_LOSS = Entry(
    "actor/total_loss",
    MEAN,
    "1",
    "The loss back-propagated: actor/weighted_pg_loss + kl_coef * k3 (with ppo.kl_placement "
    "loss) - entropy_coef * entropy + sft_loss_coef * NLL of positive samples, per token, "
    f"{_BY_MODE} (ROLL).",
)
ACTOR_APPROXKL = Entry(
    "actor/approxkl",
    MEAN,
    "nats",
    "Approximate KL of the current to the old policy, 0.5 * (logp - logp_old)^2 per token "
    f"(ROLL's mse estimator): {_BY_MODE} (ROLL).",
)
ACTOR_POLICYKL = Entry(
    "actor/policykl",
    MEAN,
    "nats",
    "KL of the current to the old policy estimated as logp - logp_old per token (ROLL's k1 "
    f"'kl' estimator; verl's actor/ppo_kl is its negative): {_BY_MODE} (ROLL).",
)

# Evaluation views of the batch
CRITIC_REF_LOG_PROB = Entry(
    "critic/ref_log_prob",
    MEAN,
    "nats",
    "Reference model log-probability per response token; pooled over tokens (ROLL).",
    outputs=(Stat.MEAN,),
)
CRITIC_OLD_LOG_PROB = Entry(
    "critic/old_log_prob",
    MEAN,
    "nats",
    "Old (pre-update) policy log-probability per response token; pooled over tokens (ROLL).",
    outputs=(Stat.MEAN,),
)
CRITIC_ENTROPY = distribution(
    "critic/entropy",
    "nats",
    "Old policy's entropy per response token; pooled over tokens (ROLL's token-mean).",
)
CRITIC_REWARD_CLIP_FRAC = Entry(
    "critic/reward_clip_frac",
    FRACTION,
    "ratio",
    "Share of responses whose normalised reward was changed by reward clipping (ROLL).",
)

# PPO losses and sample accounting
ACTOR_PG_LOSS = Entry(
    "actor/pg_loss",
    MEAN,
    "1",
    "Clipped policy-gradient loss -min(r * A, clip(r) * A) per token, capped at "
    "-clip_ratio_c * A where A < 0 (dual clip), without sample weights: "
    f"{_BY_MODE} (ROLL and verl agg_loss).",
)
ACTOR_WEIGHTED_PG_LOSS = Entry(
    "actor/weighted_pg_loss",
    MEAN,
    "1",
    "actor/pg_loss with each sample's tokens scaled by its sample weight (ROLL's agg_loss "
    f"weights): {_BY_MODE}. The policy-gradient term that is back-propagated.",
)
ACTOR_VALID_SAMPLES = Entry(
    "actor/valid_samples",
    SUM,
    "samples",
    "Samples that passed the validity filter, summed over ranks.",
)
ACTOR_TOTAL_SAMPLES = Entry(
    "actor/total_samples", SUM, "samples", "Samples in the training batch, summed over ranks."
)
ACTOR_VALID_SAMPLE_RATIO = Entry(
    "actor/valid_sample_ratio",
    FRACTION,
    "ratio",
    "Valid samples over all samples, pooled over ranks.",
)
ACTOR_SAMPLE_WEIGHTS = family(
    "actor/sample_weights", "1", "Weight of one training sample.", UNDERSCORE
)

# SFT losses
ACTOR_SFT_LOSS = Entry(
    "actor/sft_loss",
    MEAN,
    "nats",
    "Negative log-likelihood of the current policy on all loss tokens, pooled over the tokens "
    "of every optimizer step (ROLL names it without a formula; the standard SFT token mean).",
)
ACTOR_POSITIVE_SFT_LOSS = Entry(
    "actor/positive_sft_loss",
    MEAN,
    "nats",
    "actor/sft_loss on tokens of positively rewarded samples (normalised reward above 0), "
    "pooled over tokens.",
)
ACTOR_NEGATIVE_SFT_LOSS = Entry(
    "actor/negative_sft_loss",
    MEAN,
    "nats",
    "actor/sft_loss on tokens of the other samples, pooled over tokens.",
)

# Training-set views (emitted by trainer/)
CRITIC_ACCURACY = Entry(
    "critic/accuracy",
    FRACTION,
    "ratio",
    "Task accuracy of the training rollouts: share of responses whose answer is exactly right.",
)
ACTOR_KL_COEF = Entry(
    "actor/kl_coef",
    LAST,
    "1",
    "KL penalty coefficient used this step (the adaptive KL controller's current value).",
)
ACTOR_REF_KL = Entry(
    "actor/ref_kl",
    MEAN,
    "nats",
    "KL of the rollout (old) policy to the reference, k1 = logp_old - logp_ref per response "
    "token: per-response token mean, averaged over non-empty responses (the mean of "
    "per-sequence means both verl and ROLL feed their KL controller, logged there as "
    "actor/reward_kl_penalty and critic/kl): the adaptive KL controller's input.",
)

_DEFINED = list(globals().values())
ENTRIES = (
    *(v for v in _DEFINED if isinstance(v, Entry)),
    *engine.ENTRIES,
    *ledger.ENTRIES,
    *attribution.ENTRIES,
)
HISTOGRAMS = (*(v for v in _DEFINED if isinstance(v, Histogram)), *engine.HISTOGRAMS)
"""Histograms (``schemas.histogram``): entries in ENTRIES, bucket templates below."""
TEMPLATES: tuple[Template, ...] = (
    *(h.buckets for h in HISTOGRAMS),
    *engine.TEMPLATES,
    SERVE_ERRORS,
    TIME_PHASE,
    TIME_PHASE_GPU,
    STRAGGLER,
    *ledger.TEMPLATES,
    MEMORY_GPU,
    MEMORY_CPU,
    GPU_DEVICE_MEMORY,
    GPU_UTILIZATION,
    GPU_POWER,
    GPU_TEMPERATURE,
)
CATALOG = Catalog(ENTRIES, TEMPLATES)
