"""The quantile sketch (``rlpulse.schemas.sketch``): slots in value order, every slot's value
within ALPHA of its samples, quantiles within ALPHA of numpy's, merges that equal the sketch
of the union, and a wire form that refuses what is not a sketch."""

from __future__ import annotations

import numpy as np
import pytest

from rlpulse.schemas import sketch as S
from rlpulse.schemas.errors import SchemaError
from rlpulse.schemas.metrics import CATALOG, CRITIC_ADVANTAGES
from rlpulse.schemas.reductions import STAT_REDUCTION, Reduction, Stat

BOUND = S.ALPHA * (1 + 1e-9)  # the stated bound, and float rounding of the key's logarithm
QS = (0.001, 0.01, 0.1, 0.25, 0.5, 0.75, 0.9, 0.99, 0.999)


def spread(n: int, seed: int = 0) -> np.ndarray:
    """Samples of both signs over 18 orders of magnitude, with exact zeros and ties."""
    rng = np.random.default_rng(seed)
    x = rng.choice([-1.0, 1.0], n) * 10.0 ** rng.uniform(-8, 10, n)
    x[: n // 50] = 0.0
    x[n // 50 : n // 25] = 1.0
    return rng.permutation(x)


def test_slots_are_in_value_order_and_each_value_is_within_alpha() -> None:
    x = np.sort(spread(200_000))
    slots = S.slots_of(x)
    assert (np.diff(slots) >= 0).all()
    assert slots.min() >= 0 and slots.max() < S.SLOTS
    rep = np.array([S.representative(int(s)) for s in slots])
    big = np.abs(x) > S.TINY
    assert (np.abs(rep[big] - x[big]) <= BOUND * np.abs(x[big])).all()
    assert (rep[~big] == 0.0).all()


def test_bucket_edges_land_within_alpha() -> None:
    """Exact powers of GAMMA and their float neighbours, where log rounding could misplace a
    sample by one key: still within the bound."""
    k = np.arange(S.KEY_MIN, S.KEY_MAX + 1, dtype=np.float64)
    edges = S.GAMMA**k
    x = np.concatenate([edges, np.nextafter(edges, 0), np.nextafter(edges, np.inf), -edges])
    rep = np.array([S.representative(int(s)) for s in S.slots_of(x)])
    assert (np.abs(rep - x) <= BOUND * np.abs(x)).all()


@pytest.mark.parametrize(
    "draw",
    [
        lambda r, n: r.normal(0.0, 1.0, n),
        lambda r, n: r.lognormal(3.0, 2.0, n),
        lambda r, n: -r.exponential(1e-3, n),
        lambda r, n: r.integers(1, 4096, n).astype(np.float64),
        lambda r, n: np.full(n, 0.37),
    ],
    ids=["normal", "lognormal", "negative", "lengths", "constant"],
)
def test_quantiles_agree_with_numpy_inverted_cdf(draw) -> None:  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(7)
    for n in (1, 2, 3, 10, 999, 50_000):
        x = draw(rng, n)
        counts = S.counts_of(x)
        for q in QS:
            want = float(np.quantile(x, q, method="inverted_cdf"))
            got = S.quantile(counts, q, low=x.min(), high=x.max())
            assert got is not None
            assert abs(got - want) <= BOUND * abs(want) + 0.0, (n, q, got, want)


def test_the_rank_is_exact_where_floats_are_not() -> None:
    for n in range(1, 2000):
        x = np.arange(n, dtype=np.float64) + 1.0
        for q in (0.5, 0.9, 0.99):
            assert x[S.rank(q, n) - 1] == np.quantile(x, q, method="inverted_cdf"), (n, q)


def test_merge_equals_the_sketch_of_the_union_for_any_split() -> None:
    x = spread(100_000, seed=3)
    whole = S.counts_of(x)
    rng = np.random.default_rng(4)
    for _ in range(5):
        cuts = np.sort(rng.integers(0, x.size, rng.integers(1, 12)))
        parts = [S.encode(S.counts_of(p)) for p in np.split(x, cuts)]
        rng.shuffle(parts)  # in any order, and in a tree: ((a + b) + (c + ...))
        half = len(parts) // 2
        left = sum((S.decode(p) for p in parts[:half]), np.zeros(S.SLOTS, np.int64))
        right = sum((S.decode(p) for p in parts[half:]), np.zeros(S.SLOTS, np.int64))
        merged = S.decode(S.encode(left)) + S.decode(S.encode(right))
        assert (merged == whole).all()


def test_wire_form_round_trips_and_is_small() -> None:
    counts = S.counts_of(np.random.default_rng(0).normal(0, 1, 1_000_000))
    buf = S.encode(counts)
    assert (S.decode(buf) == counts).all()
    assert len(buf) < 6 * 1400  # 6 bytes per non-empty slot
    wide = counts * (1 << 33)
    assert (S.decode(S.encode(wide)) == wide).all()
    assert S.decode(S.encode(np.zeros(S.SLOTS, np.int64))).sum() == 0


@pytest.mark.parametrize(
    "buf",
    [
        b"",
        b"\x02\x04\x00\x00",  # unknown version
        b"\x01\x04\x01\x00\x05\x00",  # truncated
        b"\x01\x04\x02\x00\x05\x00\x04\x00\x01\x00\x00\x00\x01\x00\x00\x00",  # slots descending
        b"\x01\x04\x01\x00\xff\xff\x01\x00\x00\x00",  # slot out of range
        b"\x01\x04\x01\x00\x05\x00\x00\x00\x00\x00",  # a zero count
    ],
)
def test_decode_refuses_what_is_not_a_sketch(buf: bytes) -> None:
    with pytest.raises(SchemaError) as err:
        S.decode(buf)
    assert err.value.reason == "bad_sketch"


def test_empty_sketch_has_no_quantile() -> None:
    assert S.quantile(np.zeros(S.SLOTS, np.int64), 0.5) is None
    with pytest.raises(ValueError):
        S.quantile(S.counts_of(np.ones(3)), 1.0)


def test_catalog_declares_distributions_with_their_bound() -> None:
    r = CATALOG.resolve(CRITIC_ADVANTAGES.name)
    assert r.reduction is Reduction.DIST
    assert set(r.outputs.values()) == {
        f"{CRITIC_ADVANTAGES.name}/{s}" for s in ("mean", "max", "min", "p50", "p90", "p99")
    }
    assert "1% relative error" in r.help
    # a mean logged alone still merges as a mean; a quantile logged alone keeps the largest
    assert STAT_REDUCTION[Stat.MEAN] is Reduction.MEAN
    assert CATALOG.resolve(f"{CRITIC_ADVANTAGES.name}/p90").reduction is Reduction.MAX


def test_bucket_bounds_are_ascending_and_cover_every_sample() -> None:
    x = spread(10_000, seed=9)
    upper, counts = S.bucket_bounds(S.counts_of(x))
    assert (np.diff(upper) > 0).all() and counts.sum() == x.size
    # every sample is at or below its slot's bound (and above the previous slot's)
    cum = np.searchsorted(upper, np.clip(x, None, upper[-1]), side="left")
    assert (np.bincount(cum, minlength=len(upper)) == counts).all()
