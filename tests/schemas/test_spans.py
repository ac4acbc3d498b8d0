"""Stragglers from a step's spans, against numpy."""

from __future__ import annotations

import numpy as np
import pytest

from rlpulse.schemas.metrics import STRAGGLER
from rlpulse.schemas.spans import Span, stragglers


def name(stat: str, phase: str = "train_step") -> str:
    return STRAGGLER.format(cluster="actor_train", phase=phase, stat=stat)


def test_the_slowest_rank_and_its_lag_behind_the_median_match_numpy() -> None:
    rng = np.random.default_rng(7)
    seconds = rng.uniform(1.0, 3.0, 9)
    spans = [
        Span("actor_train", r, "h", "actor_train", "train_step", 100.0, 100.0 + s)
        for r, s in enumerate(seconds)
    ]
    got = stragglers(spans)
    assert got[name("lag")] == pytest.approx(seconds.max() - np.median(seconds), abs=1e-12)
    assert got[name("lag_ratio")] == pytest.approx(seconds.max() / np.median(seconds), rel=1e-12)
    assert got[name("slowest_rank")] == float(np.argmax(seconds))


def test_a_rank_time_is_the_sum_of_its_spans_of_the_phase() -> None:
    spans = [
        Span("actor_train", 0, "h", "actor_train", "train_step", 0.0, 1.0),
        Span("actor_train", 0, "h", "actor_train", "train_step", 2.0, 3.5),  # 2.5 in all
        Span("actor_train", 1, "h", "actor_train", "train_step", 0.0, 2.0),
    ]
    got = stragglers(spans)
    assert got[name("slowest_rank")] == 0.0
    assert got[name("lag")] == pytest.approx(0.25)  # median of (2.5, 2.0) is 2.25


def test_phases_are_separate_and_a_phase_of_one_rank_has_no_straggler() -> None:
    spans = [
        Span("actor_train", 0, "h", "actor_train", "train_step", 0.0, 1.0),
        Span("actor_train", 1, "h", "actor_train", "train_step", 0.0, 3.0),
        Span("rollout", 0, "h", "actor_train", "generate", 0.0, 5.0),
    ]
    got = stragglers(spans)
    assert name("lag") in got and not any("generate" in k for k in got)
    assert stragglers([]) == {}


def test_straggler_metrics_are_derived_and_never_taken_from_a_producer() -> None:
    from rlpulse.schemas.metrics import CATALOG

    assert CATALOG.resolve(name("lag")).derived
    assert CATALOG.resolve(name("lag")).unit == "s"
    assert CATALOG.resolve(name("slowest_rank")).unit == "rank"
