"""Merging states gives the global statistic, whatever the ranks, their sizes or the order."""

from __future__ import annotations

import math
from functools import reduce

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from rlpulse.schemas import Reduction, Stat, Summary
from rlpulse.schemas.values import empty_rows, merge_rows, reduce_rows


def merge_all(states: list[Summary], reduction: Reduction = Reduction.MEAN) -> Summary:
    return reduce(lambda a, b: a.merge(b, reduction), states, Summary())


def test_pooled_mean_of_ragged_ranks_is_not_the_mean_of_means() -> None:
    rng = np.random.default_rng(0)
    small, large = rng.normal(5.0, 1.0, 7), rng.normal(-1.0, 2.0, 3000)
    merged = merge_all([Summary.of_samples(small), Summary.of_samples(large)])
    pooled = np.concatenate([small, large])
    assert merged.read(Stat.MEAN) == pytest.approx(pooled.mean(), rel=1e-12)
    assert merged.read(Stat.MAX) == pooled.max()
    assert merged.read(Stat.MIN) == pooled.min()
    mean_of_means = (small.mean() + large.mean()) / 2
    assert abs(merged.read(Stat.MEAN) - mean_of_means) > 1.0  # the bug we exist to avoid


def test_weighted_means_pool_by_weight() -> None:
    merged = merge_all([Summary.of_weighted(1.0, 7), Summary.of_weighted(0.0, 3000)])
    assert merged.read(Stat.MEAN) == pytest.approx(7 / 3007)
    assert merged.read(Stat.MAX) is None  # extremes were never observed


def test_fraction_is_sum_of_numerators_over_sum_of_denominators() -> None:
    merged = merge_all(
        [Summary.of_fraction(1, 10), Summary.of_fraction(30, 100)], Reduction.FRACTION
    )
    assert merged.read(Stat.FRACTION) == pytest.approx(31 / 110)


def test_empty_and_nan_ranks_do_not_erase_real_values() -> None:
    real = Summary.of_samples([1.0, 2.0, 3.0])
    empty = Summary.of_samples([])
    all_nan = Summary.of_samples([math.nan, math.inf])
    merged = merge_all([empty, real, all_nan])
    assert merged.read(Stat.MEAN) == 2.0
    assert (merged.read(Stat.MIN), merged.read(Stat.MAX)) == (1.0, 3.0)
    assert merge_all([empty, all_nan]).read(Stat.MEAN) is None


def test_sum_max_min_last() -> None:
    states = [Summary.of_scalar(v) for v in (3.0, 9.0, -2.0)]
    assert merge_all(states, Reduction.SUM).read(Stat.SUM) == 10.0
    assert merge_all(states, Reduction.MAX).read(Stat.MAX) == 9.0
    assert merge_all(states, Reduction.MIN).read(Stat.MIN) == -2.0
    assert merge_all(states, Reduction.LAST).read(Stat.LAST) == -2.0


samples = st.lists(st.floats(-1e6, 1e6, allow_nan=False), max_size=30)


@settings(max_examples=200, deadline=None)
@given(st.lists(samples, min_size=1, max_size=8), st.randoms())
def test_merge_order_and_grouping_do_not_matter(ranks: list[list[float]], rnd) -> None:
    states = [Summary.of_samples(r) for r in ranks]
    forward = merge_all(states)
    shuffled = states[:]
    rnd.shuffle(shuffled)
    # Group into a tree of partial merges, as a hierarchy of collectors would.
    split = rnd.randint(0, len(shuffled))
    grouped = merge_all(shuffled[:split]).merge(merge_all(shuffled[split:]), Reduction.MEAN)
    flat = np.array([x for r in ranks for x in r])
    for state in (merge_all(shuffled), grouped):
        assert state.weight == forward.weight == flat.size
        assert state.sum == pytest.approx(forward.sum, rel=1e-9, abs=1e-6)
        assert state.read(Stat.MAX) == forward.read(Stat.MAX)
        assert state.read(Stat.MIN) == forward.read(Stat.MIN)
    if flat.size:
        assert forward.read(Stat.MEAN) == pytest.approx(flat.mean(), rel=1e-9, abs=1e-6)
        assert forward.read(Stat.MAX) == flat.max()


@settings(max_examples=100, deadline=None)
@given(st.lists(samples, min_size=1, max_size=6), st.booleans())
def test_array_merge_equals_scalar_merge(ranks: list[list[float]], last: bool) -> None:
    reduction = Reduction.LAST if last else Reduction.MEAN
    acc = empty_rows(3)
    idx = np.array([1])
    for r in ranks:
        row = np.array([Summary.of_samples(r)])
        merge_rows(acc, idx, row, np.array([last]))
    expected = merge_all([Summary.of_samples(r) for r in ranks], reduction)
    np.testing.assert_allclose(acc[1], expected, rtol=1e-12, atol=1e-9, equal_nan=True)
    assert acc[0, 1] == 0 and math.isnan(acc[2, 2])  # untouched rows stay identities


extreme = st.one_of(st.just(math.nan), st.floats(-1e6, 1e6, allow_nan=False))
state = st.builds(
    Summary,
    st.floats(-1e6, 1e6, allow_nan=False),
    st.floats(0, 1e6, allow_nan=False),
    extreme,
    extreme,
)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(state, min_size=3, max_size=3), min_size=1, max_size=7))
def test_one_rule_for_k_entries_pairs_and_summaries(entries: list[list[Summary]]) -> None:
    """reduce_rows over k entries (the collector), merge_rows pair by pair and Summary.merge
    agree bit for bit: one rule, applied in arrival order."""
    rows = np.array(entries, dtype=np.float64)  # k entries x 3 metrics x 4
    last = np.array([False, True, False])
    reductions = [Reduction.MEAN, Reduction.LAST, Reduction.MAX]
    reduced = reduce_rows(rows, last)
    acc = empty_rows(3)
    for entry in rows:
        merge_rows(acc, slice(0, 3), entry, last)
    folded = [merge_all([e[j] for e in entries], reductions[j]) for j in range(3)]
    np.testing.assert_array_equal(reduced, acc)
    np.testing.assert_array_equal(reduced, np.array(folded))
    assert reduced[1, 0] == entries[-1][1].sum  # LAST: the latest entry's value


def test_reduce_rows_ignores_unobserved_extremes() -> None:
    rows = np.array(
        [[[1.0, 1.0, math.nan, math.nan]], [[2.0, 1.0, 2.0, 2.0]], [[0.0, 0.0, math.nan, math.nan]]]
    )
    np.testing.assert_array_equal(reduce_rows(rows), [[3.0, 2.0, 2.0, 2.0]])


_ODD = (math.nan, math.inf, -math.inf, -1.0, 5.0, 0.0)


@settings(max_examples=400)
@given(
    st.integers(1, 5),
    st.integers(1, 4),
    st.lists(st.tuples(st.integers(0, 10**6), st.sampled_from(_ODD)), max_size=3),
    st.lists(st.booleans(), min_size=4, max_size=4),
    st.integers(0, 2**32 - 1),
)
def test_checked_reduction_refuses_exactly_what_the_check_refuses(
    k: int, n: int, odd: list[tuple[int, float]], last: list[bool], seed: int
) -> None:
    """The merge's cheap check (``reduce_checked``, read off the merged states) refuses
    exactly the entries ``invalid_rows`` refuses, and otherwise merges as ``reduce_rows``."""
    from rlpulse.schemas.values import invalid_rows, reduce_checked

    rows = np.random.default_rng(seed).random((k, n, 4))
    rows[..., 3] += rows[..., 2]  # min <= max
    for where, value in odd:
        rows.reshape(-1)[where % rows.size] = value
    mask = np.array(last[:n])
    merged = reduce_checked(rows, mask)
    if invalid_rows(rows) is not None:
        assert merged is None
    else:
        assert merged is not None
        np.testing.assert_array_equal(merged, reduce_rows(rows, mask))


def test_checked_reduction_of_sums_too_large_to_add_defers_to_the_exact_check() -> None:
    from rlpulse.schemas.values import invalid_rows, reduce_checked

    rows = np.array([[[1e308, 1.0, 1.0, 2.0]], [[1e308, 1.0, 1.0, 2.0]]])
    assert invalid_rows(rows) is None  # each state is valid; only their sum overflows
    assert reduce_checked(rows) is None
