"""Sample states merge exactly (top/bottom k of the union, the k smallest random keys of the
union) in any order and grouping, the random rows are uniform over all ranks' rows whatever
their counts, keys ignore the program's seeded generators, and bad rows are dropped and
counted while the rest are kept."""

from __future__ import annotations

import itertools
import math
import multiprocessing as mp
import random
from collections import Counter
from functools import reduce

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from rlpulse.schemas.errors import SchemaError
from rlpulse.schemas.samples import (
    CUT_MARK,
    KEYS,
    SampleLimits,
    SampleState,
    cut_text,
    reduce_rows,
)


def counter_keys(start: int = 0):
    """A deterministic key source (tests only): the n-th row gets key start + n."""
    it = itertools.count(start)
    return lambda: next(it)


def reference(parts: list[SampleState], all_rows: list[tuple[int, float]], k: int):
    """Top, bottom and random of the union, from every row's (random key, value)."""
    top = sorted(all_rows, key=lambda r: (-r[1], r[0]))[:k]
    bottom = sorted(all_rows, key=lambda r: (r[1], r[0]))[:k]
    rand = sorted(all_rows, key=lambda r: r[0])[:k]
    return [r[0] for r in top], [r[0] for r in bottom], [r[0] for r in rand]


@settings(max_examples=150, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 40), min_size=1, max_size=6),
    k=st.integers(1, 6),
    values=st.lists(st.integers(-5, 5), min_size=240, max_size=240),
    seed=st.integers(0, 2**32 - 1),
    relays=st.integers(1, 3),
)
def test_merge_is_the_union_in_any_order_and_through_relays(sizes, k, values, seed, relays):
    rng = random.Random(seed)
    limits = SampleLimits(k=k)
    parts, all_rows, start = [], [], 0
    for rank, size in enumerate(sizes):
        # Distinct random keys across ranks; values with many ties (integers in -5..5).
        keys = [rng.getrandbits(63) for _ in range(size)]
        rows = [{"reward": float(values[(start + i) % 240]), "i": start + i} for i in range(size)]
        it = iter(keys)
        parts.append(
            reduce_rows(
                rows, "reward", origin=("actor", rank), limits=limits, keys=lambda it=it: next(it)
            )
        )
        all_rows += [(key, row["reward"]) for key, row in zip(keys, rows, strict=True)]
        start += size
    rng.shuffle(parts)
    # Relays: the ranks split into consecutive groups, each merged, then the root merges.
    cuts = sorted(rng.sample(range(1, len(parts)), min(relays - 1, len(parts) - 1)))
    groups = [parts[a:b] for a, b in zip([0, *cuts], [*cuts, len(parts)], strict=True)]
    tiers = [reduce(SampleState.merge, g) for g in groups]
    merged = reduce(SampleState.merge, tiers)
    top, bottom, rand = reference(parts, all_rows, k)
    assert [r.rkey for r in merged.top] == top
    assert [r.rkey for r in merged.bottom] == bottom
    assert [r.rkey for r in merged.random] == rand
    assert merged.rows == sum(sizes)
    # Through the wire, the same state.
    assert SampleState.from_wire(merged.to_wire()) == merged


def test_random_rows_are_uniform_over_ranks_of_very_different_sizes():
    """Three ranks with 3, 30 and 300 rows, k = 8, 4,000 trials with the real key source. A
    row is kept with probability 8/333 in each trial, whatever its rank, so the number of
    rows kept from a rank over all trials is binomial(4000 * rows, 8/333) (trials are
    independent; within a trial the draws without replacement are negatively correlated,
    which only narrows the spread). Threshold: every rank's count within 5 standard
    deviations of its expectation (a false alarm about once in 1.7 million runs), and the
    smallest rank, the one a rank-0-only or per-rank-quota sample would get wrong, within
    5 sigma as well."""
    sizes, k, trials = (3, 30, 300), 8, 4000
    total = sum(sizes)
    kept: Counter[int] = Counter()
    limits = SampleLimits(k=k)
    for _ in range(trials):
        parts = [
            reduce_rows(
                ({"reward": 0.0} for _ in range(n)), "reward", origin=("r", rank), limits=limits
            )
            for rank, n in enumerate(sizes)
        ]
        merged = reduce(SampleState.merge, parts)
        kept.update(r.rank for r in merged.random)
    p = k / total
    for rank, n in enumerate(sizes):
        mean = trials * n * p
        sd = math.sqrt(trials * n * p * (1 - p))
        assert abs(kept[rank] - mean) < 5 * sd, (rank, kept[rank], mean, sd)


def _draw_after_seeding(queue) -> None:  # a forked "rank" of a seeded program
    random.seed(0)
    np.random.seed(0)
    queue.put([KEYS() for _ in range(4)])


def test_keys_ignore_the_programs_seeded_generators():
    """Two forked ranks of a program that seeds random, numpy (and would seed torch) the same
    way draw different keys, and the global generators are left as the program set them."""
    KEYS()  # the parent has drawn: the children must not repeat its generator's state
    ctx = mp.get_context("fork")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_draw_after_seeding, args=(queue,)) for _ in range(2)]
    for proc in procs:
        proc.start()
    draws = [queue.get(timeout=30) for _ in procs]
    for proc in procs:
        proc.join(30)
    assert draws[0] != draws[1]
    random.seed(0)
    before = random.random()
    random.seed(0)
    KEYS()
    assert random.random() == before


def test_bad_rows_are_dropped_and_counted_the_rest_kept():
    rows = [
        {"reward": 1.0, "text": "ok"},
        {"reward": "high", "text": "a non-numeric key"},
        {"text": "no key"},
        {"reward": math.nan},
        {"reward": 2.0, "obj": object()},
        "not a row",
        {"reward": np.float32(3.0), "n": np.int64(4)},
        {"reward": True},
    ]
    state = reduce_rows(rows, "reward", origin=("actor", 1), keys=counter_keys())
    assert state.rows == 2 and state.dropped == 6
    assert [r.key for r in state.top] == [3.0, 1.0]
    assert state.top[0].fields == {"reward": 3.0, "n": 4}
    assert state.top[0].record()["rank"] == 1 and state.top[0].record()["role"] == "actor"


def test_long_text_is_cut_and_says_so():
    text = "é" * 5000  # 10,000 bytes
    state = reduce_rows(
        [{"reward": 0.0, "response": text}],
        "reward",
        origin=("a", 0),
        limits=SampleLimits(field_bytes=100),
    )
    kept = state.top[0].fields["response"]
    assert isinstance(kept, str) and len(kept.encode()) <= 100 and state.cut == 1
    assert kept.endswith(CUT_MARK.format(10000 - len(kept.split("…")[0].encode())))
    assert cut_text("short", 100) == ("short", False)


def test_memory_is_bounded_by_k_not_rows():
    state = reduce_rows(
        ({"reward": float(i)} for i in range(100_000)),
        "reward",
        origin=("a", 0),
        limits=SampleLimits(k=4),
    )
    assert len(state.top) == len(state.bottom) == len(state.random) == 4
    assert [r.key for r in state.top] == [99999.0, 99998.0, 99997.0, 99996.0]
    assert state.rows == 100_000


def test_states_ranked_by_different_keys_do_not_merge_and_bad_wire_is_named():
    a = reduce_rows([{"reward": 1.0}], "reward", origin=("a", 0))
    b = reduce_rows([{"score": 1.0}], "score", origin=("a", 1))
    with pytest.raises(SchemaError, match="cannot merge"):
        a.merge(b)
    wire = a.to_wire()
    wire["sets"] = [[5], [], []]
    with pytest.raises(SchemaError, match="not a samples state"):
        SampleState.from_wire(wire)
    with pytest.raises(ValueError, match="k must be"):
        SampleLimits(k=0)
