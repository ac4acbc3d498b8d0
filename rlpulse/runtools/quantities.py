"""What a run's names mean, whichever trainer logged them: the one table the run tools read.

A :class:`Quantity` is one thing a curve shows (the training score, the policy loss, the KL to
the reference...) with every name it is logged under, in order of preference: rlpulse's
catalog name first (``rlpulse.schemas.metrics``, which the demo trainer and the README's worker
log, and which verl shares where its names are the catalog's), then verl's and TRL's own names
(``rlpulse.schemas.frameworks``). ``rlpulse report`` draws a panel of quantities
(:mod:`rlpulse.runtools.panels`); ``rlpulse compare`` fills a column with the first name of a
quantity the compared runs logged (:mod:`rlpulse.runtools.compare`). Neither spells a name or
its meaning: adding a framework's name to a quantity here puts it under the right title in
both.

>>> from rlpulse.runtools.runs import Run
>>> run = Run("trl", steps=(1,), series={"reward": ((1, 0.5),)})
>>> TRAIN_SCORE.logged(run)
['reward']
>>> first_logged((TRAIN_SCORE,), [run])
'reward'
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from rlpulse.runtools.runs import Run
from rlpulse.schemas import engine as E, frameworks as F, metrics as M
from rlpulse.schemas.catalog import Entry
from rlpulse.schemas.histogram import Histogram
from rlpulse.schemas.reductions import Stat


def out(entry: Entry, stat: Stat | None = None) -> str:
    """The reported name of ``entry`` (its ``stat`` output for a family with several).

    >>> out(M.CRITIC_SCORE, Stat.MEAN), out(M.SYSTEM_TPS)
    ('critic/score/mean', 'system/tps')
    """
    names = entry.output_names()
    if stat is None:
        (name,) = names.values()
        return name
    return names[stat]


@dataclass(frozen=True)
class Quantity:
    """One quantity under the names it is logged as: ``names`` (fixed, in order of
    preference), then any name ``pattern`` matches (verl's ``val-core/{source}/...``).

    The names are the same thing as logged by different trainers (``critic/score/mean``,
    TRL's ``reward``), or a few statistics of it (a mean and a max): a report draws each one
    a run logged; a comparison takes the first (:func:`first_logged`), so the quantities it
    reads list alternatives only."""

    title: str
    names: tuple[str, ...] = ()
    pattern: re.Pattern[str] | None = None

    def matches(self, name: str) -> bool:
        return name in self.names or bool(self.pattern and self.pattern.match(name))

    def logged(self, run: Run) -> list[str]:
        """The names of this quantity ``run`` logged, in order of preference."""
        fixed = [n for n in self.names if run.has(n)]
        if self.pattern is None:
            return fixed
        pattern = self.pattern
        return fixed + sorted(n for n in run.series if pattern.match(n) and run.has(n))


def quantity(title: str, *names: str, pattern: re.Pattern[str] | None = None) -> Quantity:
    return Quantity(title, names, pattern)


def first_logged(quantities: Iterable[Quantity], runs: Sequence[Run]) -> str | None:
    """The first name of ``quantities`` (in order) that any of ``runs`` logged, or None."""
    for q in quantities:
        for run in runs:
            names = q.logged(run)
            if names:
                return names[0]
    return None


def quantiles(h: Histogram) -> Quantity:
    """The quantiles of an engine histogram (p50, p95, p99)."""
    return quantity(h.name, *(e.name for e in h.quantile_entries.values()))


def dist(entry: Entry, *stats: Stat) -> Quantity:
    """Some statistics of a catalog distribution or family, each its own curve."""
    return quantity(entry.name, *(out(entry, s) for s in stats))


MEAN, MAX = Stat.MEAN, Stat.MAX
P50, P90, P99 = Stat.P50, Stat.P90, Stat.P99

# Scores
TRAIN_SCORE = quantity("training score", out(M.CRITIC_SCORE, MEAN), F.TRL_REWARD)
TRAIN_REWARD = quantity(
    "training reward", out(M.CRITIC_REWARDS, MEAN), pattern=F.TRL_REWARD_FUNCTIONS
)
VAL_SCORE = quantity(
    "validation score", out(M.VAL_SCORE, MEAN), F.TRL_EVAL_REWARD, pattern=F.VERL_VAL_CORE
)
ACCURACY = quantity("accuracy", M.CRITIC_ACCURACY.name, M.VAL_ACCURACY.name)
DIVERSITY = quantity(
    "validation diversity",
    M.VAL_DISTINCT_1.name,
    M.VAL_DISTINCT_2.name,
    M.VAL_REPETITION_RATE.name,
)

# Losses
POLICY_LOSS = quantity("policy loss", M.ACTOR_PG_LOSS.name, F.TRL_POLICY_LOSS)
TOTAL_LOSS = quantity("total loss", M.ACTOR_TOTAL_LOSS.name, F.VERL_ACTOR_LOSS, F.TRL_LOSS)
SFT_LOSS = quantity(
    "SFT loss",
    M.ACTOR_SFT_LOSS.name,
    M.ACTOR_POSITIVE_SFT_LOSS.name,
    M.ACTOR_NEGATIVE_SFT_LOSS.name,
)
WEIGHTED_PG_LOSS = quantity("weighted policy loss", M.ACTOR_WEIGHTED_PG_LOSS.name)
ENTROPY_LOSS = quantity("entropy loss", F.VERL_ENTROPY_LOSS)
VALUE_LOSS = quantity("value loss", M.CRITIC_LOSS.name, F.VERL_VF_LOSS)
VALUE_ERROR = quantity("value error", M.CRITIC_ERROR.name)

# KL
REF_KL = quantity("KL to the reference (reward)", M.ACTOR_REF_KL.name, F.VERL_REWARD_KL)
KL_LOSS = quantity("KL to the reference (loss)", M.ACTOR_KL_LOSS.name, F.TRL_KL)
POLICY_KL = quantity(
    "KL to the old policy",
    M.ACTOR_APPROXKL.name,
    M.ACTOR_POLICYKL.name,
    F.VERL_PPO_KL,
)
KL_COEF = quantity("KL coefficient", M.ACTOR_KL_COEF.name, F.VERL_REWARD_KL_COEF)

# Entropy, clipping, lengths
ENTROPY = quantity("entropy", out(M.CRITIC_ENTROPY, MEAN), F.VERL_ENTROPY, F.TRL_ENTROPY)
POLICY_CLIPFRAC = quantity(
    "policy clip fraction",
    M.ACTOR_CLIPFRAC.name,
    M.ACTOR_PPO_RATIO_CLIPFRAC.name,
    F.VERL_PG_CLIPFRAC,
    F.TRL_CLIP_REGION,
    F.TRL_CISPO_CLIP,
)
RATIO_CLIPFRAC = quantity(
    "ratio clipped high and low",
    M.ACTOR_PPO_RATIO_HIGH_CLIPFRAC.name,
    M.ACTOR_PPO_RATIO_LOW_CLIPFRAC.name,
    M.ACTOR_PG_CLIPFRAC_LOWER.name,
    F.TRL_CLIP_HIGH,
    F.TRL_CLIP_LOW,
    F.TRL_CLIP_HIGH_MAX,
    F.TRL_CLIP_LOW_MIN,
)
VALUE_CLIPFRAC = quantity("value clip fraction", M.CRITIC_CLIPFRAC.name, F.VERL_VF_CLIPFRAC)
RESPONSE_LENGTH = quantity(
    "response length",
    out(M.RESPONSE_LENGTH, MEAN),
    out(M.RESPONSE_LENGTH, MAX),
    F.VERL_RESPONSE_LENGTH_MEAN,
    F.VERL_RESPONSE_LENGTH_MAX,
    F.TRL_COMPLETION_MEAN_LENGTH,
    F.TRL_COMPLETION_MAX_LENGTH,
)
PROMPT_LENGTH = quantity("prompt length", out(M.PROMPT_LENGTH, MEAN), F.VERL_PROMPT_LENGTH_MEAN)

# Advantages and values, optimizer
ADVANTAGES = quantity(
    "advantages, returns and values",
    out(M.CRITIC_ADVANTAGES, MEAN),
    out(M.CRITIC_RETURNS, MEAN),
    out(M.CRITIC_VALUES, MEAN),
    M.CRITIC_VPRED.name,
    F.VERL_VPRED_MEAN,
)
LEARNING_RATE = quantity("learning rate", M.ACTOR_LR.name, M.CRITIC_LR.name, F.TRL_LEARNING_RATE)
GRAD_NORM = quantity(
    "gradient norm", F.VERL_ACTOR_GRAD_NORM, F.VERL_CRITIC_GRAD_NORM, F.TRL_GRAD_NORM
)

# Throughput and the driver's stages
THROUGHPUT = quantity("throughput", M.SYSTEM_TPS.name, F.VERL_THROUGHPUT)
DRIVER_STAGES = quantity(
    "driver stages",
    M.TIME_ROLLOUT.name,
    M.TIME_OLD_LOG_PROBS_VALUES.name,
    M.TIME_REF_LOG_PROBS_VALUES_REWARD.name,
    M.TIME_ADV.name,
    F.TRL_STEP_TIME,
    pattern=re.compile(re.escape(F.VERL_TIMING_PREFIX) + r"[^/]+\Z"),
)
GPU_MEMORY = quantity("GPU memory", F.VERL_MAX_MEMORY_ALLOCATED, F.VERL_MAX_MEMORY_RESERVED)
CPU_MEMORY = quantity("CPU memory", F.VERL_CPU_MEMORY_USED)

# Rollout health: the engine against the trainer, staleness
LOGPROB_DIFF = quantity(
    "rollout - trainer log-prob",
    *(out(M.ROLLOUT_LOGPROB_DIFF, s) for s in (P50, P90, P99)),
    out(M.ROLLOUT_LOGPROB_DIFF, MEAN),
    F.TRL_SAMPLING_LOGP_DIFF_MEAN,
    F.TRL_SAMPLING_LOGP_DIFF_MAX,
)
PROBS_DIFF = quantity(
    "rollout - trainer probability",
    F.VERL_ROLLOUT_PROBS_DIFF_MEAN,
    F.VERL_ROLLOUT_PROBS_DIFF_MAX,
)
PROB_RATIO = dist(M.ROLLOUT_PROB_RATIO, P50, P99)
STALENESS = quantity(
    "staleness",
    out(M.ASYNC_STALENESS, MEAN),
    out(M.ASYNC_STALENESS, MAX),
    F.VERL_STALENESS_MEAN,
    F.VERL_STALENESS_MAX,
)
SAMPLES = quantity("samples", M.ROLLOUT_SAMPLES.name, M.VAL_SAMPLES.name)

# The rollout engine
ENGINE_TOKENS = quantity(
    "engine tokens",
    E.ENGINE_PROMPT_TOKENS.name,
    E.ENGINE_GENERATION_TOKENS.name,
    E.ENGINE_PREFIX_CACHE_HITS.name,
)
ENGINE_CACHE = quantity(
    "engine KV cache", E.ENGINE_KV_CACHE_USAGE.name, E.ENGINE_PREFIX_CACHE_HIT_RATE.name
)
ENGINE_REQUESTS = quantity(
    "engine requests",
    E.ENGINE_REQUESTS.name,
    E.ENGINE_PREEMPTIONS.name,
    E.ENGINE_REQUESTS_RUNNING.name,
    E.ENGINE_REQUESTS_WAITING.name,
)
ENGINE_TTFT = quantiles(E.ENGINE_TTFT)
ENGINE_E2E = quantiles(E.ENGINE_E2E_LATENCY)
ENGINE_ITL = quantiles(E.ENGINE_ITL)
ENGINE_QUEUE = quantiles(E.ENGINE_QUEUE_TIME)
