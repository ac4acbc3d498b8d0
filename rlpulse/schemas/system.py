"""Metrics of the run as a system: throughput (logged by the training ranks, derived by the
collector) and the driver's stage times. Part of the catalog (``rlpulse.schemas.metrics``).
"""

from __future__ import annotations

from rlpulse.schemas.catalog import Entry
from rlpulse.schemas.reductions import Reduction

SUM, MAX = Reduction.SUM, Reduction.MAX

# System throughput: producers log the step's tokens and samples, the collector derives the rest.
SYSTEM_STEP_TOKENS = Entry(
    "system/step_tokens",
    SUM,
    "tokens",
    "Tokens in the training batch (attention-mask sum) processed by this rank in this step. "
    "Log it from the ranks that train the policy only, each for its own shard.",
)
SYSTEM_STEP_SAMPLES = Entry(
    "system/step_samples",
    SUM,
    "samples",
    "Samples this rank trained on in this step (its own shard).",
)
SYSTEM_TPS = Entry(
    "system/tps",
    SUM,
    "tokens/s",
    "system/step_tokens summed over ranks and over the last tps_window steps, divided by the "
    "wall time of those steps. A step's wall time runs from the end of the previous step to its "
    "own end, a step ending at the latest log() timestamp of any rank. Computed by the collector.",
    derived=True,
)
SYSTEM_SAMPLES = Entry(
    "system/samples",
    SUM,
    "samples",
    "Samples actually trained on since the run started (cumulative system/step_samples). "
    "Computed by the collector.",
    derived=True,
    cumulative=True,
)
SYSTEM_TOKENS = Entry(
    "system/tokens",
    SUM,
    "tokens",
    "Tokens trained on since the run started (cumulative system/step_tokens). "
    "Computed by the collector.",
    derived=True,
    cumulative=True,
)

# Driver stage timings
TIME_ROLLOUT = Entry("time/rollout", MAX, "s", "Driver seconds spent collecting rollouts.")
TIME_REF_LOG_PROBS_VALUES_REWARD = Entry(
    "time/ref_log_probs_values_reward",
    MAX,
    "s",
    "Driver seconds computing reference log-probs, values and rewards.",
)
TIME_OLD_LOG_PROBS_VALUES = Entry(
    "time/old_log_probs_values",
    MAX,
    "s",
    "Driver seconds computing old-policy log-probs and values.",
)
TIME_ADV = Entry("time/adv", MAX, "s", "Driver seconds computing advantages.")
