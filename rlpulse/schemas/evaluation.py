"""Evaluation on held-out validation prompts: score, accuracy and the diversity of the
responses (the ideas of verl's evaluation guide). Part of the catalog (``rlpulse.schemas.metrics``).
"""

from __future__ import annotations

from rlpulse.schemas.catalog import Entry, family
from rlpulse.schemas.reductions import Reduction

FRACTION = Reduction.FRACTION

# Validation
VAL_SCORE = family(
    "val/score",
    "score",
    "Score of one validation episode on held-out prompts; pooled over episodes.",
)

VAL_ACCURACY = Entry(
    "val/accuracy",
    FRACTION,
    "ratio",
    "Task accuracy: share of held-out validation prompts answered exactly.",
)
VAL_DISTINCT_1 = Entry(
    "val/distinct_1",
    FRACTION,
    "ratio",
    "Response diversity: distinct unigrams over all unigrams across the validation responses "
    "(computed in one place, the driver; 1 means nothing repeats).",
)
VAL_DISTINCT_2 = Entry(
    "val/distinct_2",
    FRACTION,
    "ratio",
    "Response diversity: distinct bigrams over all bigrams across the validation responses "
    "(computed in one place, the driver).",
)
VAL_REPETITION_RATE = Entry(
    "val/repetition_rate",
    FRACTION,
    "ratio",
    "Share of bigrams in a validation response that repeat an earlier bigram of the same "
    "response, pooled over responses.",
)
VAL_SAMPLES = Entry(
    "val/samples",
    Reduction.SUM,
    "rows",
    "Validation generations behind val/score (prompt, response, score; Samples ranked by "
    "score): the step record's samples hold the best and worst k and a uniform random k over "
    "every rank's rows; the value counts the rows logged.",
)
