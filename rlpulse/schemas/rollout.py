"""The rollout engine against the trainer, off-policy staleness, and the rollouts' samples
(emitted by trainer/: actor_train and the driver). Part of the catalog
(``rlpulse.schemas.metrics``)."""

from __future__ import annotations

from rlpulse.schemas.catalog import Entry
from rlpulse.schemas.reductions import Reduction
from rlpulse.schemas.sketch import distribution

ROLLOUT_LOGPROB_DIFF = distribution(
    "rollout/logprob_diff",
    "nats",
    "Rollout engine's log-prob of a sampled response token minus the trainer's recomputed "
    "old log-prob of it (critic/old_log_prob), per response token, pooled over tokens. The "
    "engine's is under the distribution it sampled from (transformers: temperature and "
    "top_p applied; vLLM: its logprobs_mode), the trainer's a full forward pass at "
    "temperature 1: non-zero from numerics (KV cache, kernels, precision), from sampling "
    "settings, and, with ppo.off_policy_steps > 0, from the policy updates since the rollout.",
)
ROLLOUT_PROB_RATIO = distribution(
    "rollout/prob_ratio",
    "ratio",
    "Trainer's over rollout engine's probability of a sampled response token, "
    "exp(-rollout/logprob_diff), per response token: the importance weight truncated-IS "
    "corrections apply for the rollout/trainer mismatch (1 when they agree).",
)
ROLLOUT_SAMPLES = Entry(
    "rollout/samples",
    Reduction.SUM,
    "rows",
    "Training rollouts behind the step's numbers (Samples ranked by reward: prompt, response, "
    "reward, advantage, response length, the engine-vs-trainer log-prob mismatch of the "
    "sample, staleness): the step record's samples hold the top and bottom k and a uniform "
    "random k over every rank's rows; the value counts the rows logged.",
)
ASYNC_STALENESS = distribution(
    "async/staleness",
    "steps",
    "Trainer step minus the policy version (step of the weights) that generated a trained "
    "sample, per response token of the training batch (token-weighted): 0 on-policy, "
    "ppo.off_policy_steps once the pipeline is full.",
)
ROLLOUT_RESPONSE_FINISH = distribution(
    "rollout/response/finish",
    "s",
    "Seconds from the start of a training generation call's work (its generate phase, after "
    "onload) to the end of each of its responses, one sample per response, merged over every "
    "rollout engine (each measured from its own call's start). Logged with the generate "
    "phase (Phase.add): p90 is when 90% of the step's responses had finished, where the "
    "step ledger's rollout tail begins (rlpulse.schemas.ledger).",
)
ROLLOUT_RESPONSE_LONGEST = Entry(
    "rollout/response/longest",
    Reduction.MAX,
    "tokens",
    "Tokens of the step's longest training response (as generated, before the batch cuts it "
    "to rollout.max_new_tokens), the maximum over rollout engines. Logged with the generate "
    "phase, so the collector also knows which engine generated it (the span's longest).",
)
