"""The step ledger (rlpulse.schemas.ledger): the critical path, each second in one bucket, the
ranks named, against hand-worked steps and, for any set of spans, against a brute-force
second-by-second account of the wall time."""

from __future__ import annotations

import itertools
import math

import msgspec
import pytest
from hypothesis import given, settings, strategies as st

from rlpulse.schemas import ledger as L
from rlpulse.schemas.record import StepRecord
from rlpulse.schemas.spans import Span


def span(
    role: str,
    rank: int,
    phase: str,
    start: float,
    end: float,
    execute: float | None = None,
    onload: float | None = None,
    offload: float | None = None,
    longest: float | None = None,
) -> Span:
    return Span(role, rank, "h", role, phase, start, end, execute, None, onload, offload, longest)


def assert_sums(ledger: L.Ledger) -> None:
    total = sum(ledger.buckets[b] for b in L.BUCKETS)
    assert total == pytest.approx(ledger.wall, rel=1e-9, abs=1e-9)
    assert all(v >= 0 for v in ledger.buckets.values())


def test_a_demo_like_step_is_accounted_for_second_by_second() -> None:
    # model_update on both sides, generate, reference beside reward, two actor ranks and the
    # critic computing and training; driver gaps in between.
    spans = [
        span("actor_train", 0, "model_update", 0.0, 0.2, 0.2),
        span("rollout", 0, "model_update", 0.25, 0.5, 0.2, onload=0.05),
        span("rollout", 0, "generate", 0.5, 2.5, 1.9, onload=0.05, offload=0.04, longest=6),
        span("reference", 0, "compute_log_probs", 2.6, 3.0, 0.3, 0.05, 0.05),
        span("reward", 0, "compute_rewards", 2.6, 2.7, 0.1),
        span("actor_train", 0, "compute_log_probs", 3.1, 3.4, 0.3),
        span("actor_train", 1, "compute_log_probs", 3.1, 3.45, 0.35),
        span("critic", 0, "compute_values", 3.1, 3.3, 0.2),
        span("actor_train", 0, "train_step", 3.6, 4.6, 1.0),
        span("actor_train", 1, "train_step", 3.6, 5.6, 2.0),
        span("critic", 0, "train_step", 3.6, 4.0, 0.4),
    ]
    ledger = L.compute(spans, finish_p90=1.0)
    assert ledger is not None
    assert ledger.wall == pytest.approx(5.6)
    assert_sums(ledger)
    b = ledger.buckets
    # the path: actor_train/0's push, gap, rollout's load, generate (tail after 0.5+0.05+1.0),
    # gap, reference (the reward ended first), gap, actor_train/1's log-probs (0.05 alone),
    # gap, actor_train/1's training (1.0 s alone)
    assert b[L.SYNC] == pytest.approx(0.2 + 0.25)
    assert b[L.TAIL] == pytest.approx(2.5 - 1.55)
    assert b[L.STRAGGLER] == pytest.approx(0.05 + 1.0)
    assert b[L.GAPS] == pytest.approx(0.05 + 0.1 + 0.1 + 0.15)
    assert b[L.REWARD] == 0.0, "the reward ran beside the reference, which the step waited for"
    assert b[L.UNACCOUNTED] == pytest.approx(0.0, abs=1e-12)
    assert b[L.WORK] == pytest.approx(1.05 + 0.4 + 0.3 + 1.0)
    assert b[L.OVERLAP] == pytest.approx(0.1 + 0.2 + 0.4)
    path = [(s.role, s.rank, s.phase) for s in ledger.record.path]
    assert path == [
        ("actor_train", 0, "actor_train/model_update"),
        ("", -1, ""),
        ("rollout", 0, "rollout/model_update"),
        ("rollout", 0, "rollout/generate"),
        ("", -1, ""),
        ("reference", 0, "reference/compute_log_probs"),
        ("", -1, ""),
        ("actor_train", 1, "actor_train/compute_log_probs"),
        ("", -1, ""),
        ("actor_train", 1, "actor_train/train_step"),
    ]
    assert ledger.record.who["straggler:actor_train/train_step"] == "actor_train/1"
    assert ledger.record.who["longest"] == "rollout/0" and ledger.record.longest == 6
    parts = ledger.parts
    assert parts[("rollout", "generate", "onload")] == pytest.approx(0.05)
    assert parts[("rollout", "generate", "execute")] == pytest.approx(1.0)
    assert parts[("rollout", "generate", "tail")] == pytest.approx(0.95)
    assert parts[("rollout", "generate", "offload")] == 0.0, "offload lies in the tail"
    assert parts[("reward", "compute_rewards", "execute")] == 0.0, "off the path: 0, stated"
    assert parts[("actor_train", "train_step", "straggler")] == pytest.approx(1.0)


def test_parts_unaccounted_and_the_phase_buckets() -> None:
    # total 1.0 = onload 0.1 + execute 0.7 + bookkeeping 0.05 + offload 0.15
    spans = [
        span("actor_train", 0, "do_checkpoint", 0.0, 1.0, 0.7, 0.1, 0.15),
        span("reward", 0, "compute_rewards", 1.0, 1.5),
    ]
    ledger = L.compute(spans)
    assert ledger is not None
    assert ledger.buckets[L.CHECKPOINT] == pytest.approx(0.95)
    assert ledger.buckets[L.UNACCOUNTED] == pytest.approx(0.05)
    assert ledger.buckets[L.REWARD] == pytest.approx(0.5), "a span without parts is all execute"
    assert ledger.parts[("actor_train", "do_checkpoint", "offload")] == pytest.approx(0.15)
    assert_sums(ledger)


def test_parts_measured_apart_that_add_up_to_more_than_the_total_are_scaled() -> None:
    ledger = L.compute([span("critic", 0, "train_step", 0.0, 1.0, 0.9, 0.1, 0.1)])
    assert ledger is not None
    assert_sums(ledger)
    assert ledger.buckets[L.WORK] == pytest.approx(1.0)


def test_a_straggler_of_one_parallel_call_is_named_and_not_of_another() -> None:
    spans = [
        span("actor_train", 0, "train_step", 0.0, 1.0),
        span("actor_train", 1, "train_step", 0.0, 1.5),
        # a later call of the same phase by rank 0 alone: no other rank ran beside it
        span("actor_train", 0, "train_step", 2.0, 3.0),
    ]
    ledger = L.compute(spans)
    assert ledger is not None
    assert ledger.buckets[L.STRAGGLER] == pytest.approx(0.5)
    assert ledger.buckets[L.WORK] == pytest.approx(2.0)
    assert ledger.buckets[L.GAPS] == pytest.approx(0.5)


def test_the_rollout_tail_names_the_engine_of_the_longest_response() -> None:
    spans = [
        span("rollout", 0, "generate", 0.0, 3.0, 3.0, longest=60),
        span("rollout", 1, "generate", 0.0, 1.2, 1.2, longest=6),
    ]
    ledger = L.compute(spans, finish_p90=1.0)
    assert ledger is not None
    # the tail comes before the straggler in a generation: 2 s after 90% had finished
    assert ledger.buckets[L.TAIL] == pytest.approx(2.0)
    assert ledger.buckets[L.STRAGGLER] == 0.0
    assert ledger.record.who["longest"] == "rollout/0" and ledger.record.longest == 60
    # without the responses' finish times there is no tail: rank 0 ran alone after rank 1
    plain = L.compute(spans)
    assert plain is not None and plain.buckets[L.TAIL] == 0.0
    assert plain.buckets[L.STRAGGLER] == pytest.approx(1.8)


def test_a_validation_generation_without_responses_has_no_tail() -> None:
    ledger = L.compute([span("rollout", 0, "generate", 0.0, 2.0)], finish_p90=0.5)
    assert ledger is not None and ledger.buckets[L.TAIL] == 0.0


def test_moving_every_span_by_the_same_time_gives_the_same_ledger() -> None:
    spans = [
        span("a", 0, "generate", 0.0, 1.0),
        span("b", 0, "train_step", 1.5, 2.0),
        span("b", 1, "train_step", 1.5, 2.4),
    ]
    base, moved = L.compute(spans), L.compute([s.moved(1.7e9) for s in spans])
    assert base is not None and moved is not None
    for k, v in base.buckets.items():
        assert moved.buckets[k] == pytest.approx(v, abs=1e-6)
    assert [(s.role, s.rank, s.phase) for s in moved.record.path] == [
        (s.role, s.rank, s.phase) for s in base.record.path
    ]


def test_nothing_to_account_for() -> None:
    assert L.compute([]) is None
    assert L.compute([span("a", 0, "generate", 1.0, 1.0)]) is None


def test_metrics_items_and_the_record_round_trip() -> None:
    spans = [
        span("reward", 0, "compute_rewards", 0.0, 1.0),
        span("actor_train", 0, "train_step", 1.2, 2.0),
        span("actor_train", 1, "train_step", 1.2, 2.5),
    ]
    ledger = L.compute(spans)
    assert ledger is not None
    metrics = ledger.metrics()
    assert metrics[L.LEDGER_WALL.name] == pytest.approx(2.5)
    assert metrics[L.LEDGER_FRACTION.format(bucket=L.GAPS)] == pytest.approx(0.2 / 2.5)
    assert L.items(metrics) == pytest.approx(
        {
            "reward:reward/compute_rewards": 1.0,
            "work:actor_train/train_step": 0.8,
            "straggler:actor_train/train_step": 0.5,
            "gaps": 0.2,
        }
    )
    record = StepRecord(run="r", step=1, metrics=metrics, ledger=ledger.record)
    line = msgspec.json.decode(msgspec.json.encode(record.to_json()))
    assert line["ledger"]["path"][0] == ["reward", 0, "reward/compute_rewards", 0.0, 1.0]
    back = StepRecord.from_json(msgspec.json.decode(record.encode(seq=1))["record"])
    assert back.ledger == ledger.record


# ---------------------------------------------------------------- any spans, second by second

ROLES = ("rollout", "actor_train", "critic", "reward")
PHASES = ("generate", "train_step", "model_update", "compute_rewards")


@st.composite
def steps(draw: st.DrawFn) -> list[Span]:
    out = []
    for _ in range(draw(st.integers(1, 12))):
        start = draw(st.integers(0, 40)) / 4
        length = draw(st.integers(1, 20)) / 4
        parts = draw(st.lists(st.integers(0, 10), min_size=3, max_size=3))
        on, ex, off = (p / 40 * length for p in parts)
        out.append(
            span(
                draw(st.sampled_from(ROLES)),
                draw(st.integers(0, 2)),
                draw(st.sampled_from(PHASES)),
                start,
                start + length,
                ex,
                on,
                off,
                draw(st.one_of(st.none(), st.integers(1, 50))),
            )
        )
    return out


@settings(max_examples=300, deadline=None)
@given(steps(), st.one_of(st.none(), st.integers(0, 12).map(lambda x: x / 4)))
def test_any_step_sums_to_its_wall_and_gaps_are_where_no_span_ran(
    spans: list[Span], p90: float | None
) -> None:
    ledger = L.compute(spans, p90)
    assert ledger is not None
    assert_sums(ledger)
    start = min(s.start for s in spans)
    # brute force on a grid finer than any time drawn: a gap is a moment no span covers,
    # every other moment is on the path in a span covering it
    path = ledger.record.path
    assert path[0].start == 0.0 and math.isclose(path[-1].end, ledger.wall)
    assert all(math.isclose(a.end, b.start) for a, b in itertools.pairwise(path))
    uncovered = 0.0
    for i in range(int(ledger.wall * 8)):
        t = start + (i + 0.5) / 8
        covering = [s for s in spans if s.start < t < s.end]
        seg = next(p for p in path if p.start <= t - start <= p.end)
        if not covering:
            uncovered += 1 / 8
            assert seg.role == "", (t, seg)
        else:
            assert (seg.role, seg.rank, seg.phase) in {
                (s.role, s.rank, f"{s.cluster}/{s.phase}") for s in covering
            }, (t, seg)
    assert ledger.buckets[L.GAPS] == pytest.approx(uncovered)
    roles_at = [
        len({s.role for s in spans if s.start < start + (i + 0.5) / 8 < s.end}) >= 2
        for i in range(int(ledger.wall * 8))
    ]
    assert ledger.buckets[L.OVERLAP] == pytest.approx(sum(roles_at) / 8)
