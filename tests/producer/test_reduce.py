"""Values are reduced locally to (sum, weight, min, max) exactly as numpy would pool them."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from rlpulse.producer import Fraction, Masked, Weighted
from rlpulse.producer.reduce import InvalidValue, Reduced, reduce_value
from rlpulse.schemas.values import Summary


def test_numpy_array_every_element_is_a_sample() -> None:
    a = np.array([[1.0, 2.0], [3.0, 10.0]])
    assert reduce_value(a) == Reduced(Summary(16.0, 4.0, 1.0, 10.0), 0, None)


@pytest.mark.parametrize("make", [np.asarray, torch.tensor])
def test_masked_keeps_only_masked_elements_and_counts_nonfinite(make) -> None:
    values = make([1.0, 2.0, math.nan, 100.0, math.inf])
    mask = make([1, 1, 1, 0, 0])
    (s, w, mn, mx), nf, _ = reduce_value(Masked(values, mask))
    # the NaN under the mask is counted, the Inf outside is not
    assert (s, w, mn, mx, nf) == (3.0, 2.0, 1.0, 2.0, 1)


def test_torch_matches_numpy_on_random_data() -> None:
    rng = np.random.default_rng(1)
    values = rng.normal(size=(4, 33))
    mask = rng.random((4, 33)) < 0.6
    a = reduce_value(Masked(values, mask)).state
    b = reduce_value(Masked(torch.from_numpy(values), torch.from_numpy(mask))).state
    np.testing.assert_allclose(a, b, rtol=1e-12)
    expected = values[mask]
    assert a == pytest.approx((expected.sum(), expected.size, expected.min(), expected.max()))


def test_bool_tensor_is_a_fraction_of_ones() -> None:
    state = reduce_value(torch.tensor([True, False, True, True])).state
    assert state.sum / state.weight == 0.75


def test_empty_mask_gives_an_empty_state() -> None:
    (s, w, mn, mx), nf, _ = reduce_value(Masked(np.ones(3), np.zeros(3)))
    assert (s, w, nf) == (0.0, 0.0, 0) and math.isnan(mn) and math.isnan(mx)
    (s, w, mn, mx), nf, _ = reduce_value(Masked(torch.ones(0), torch.ones(0)))
    assert (s, w) == (0.0, 0.0)


def test_weighted_and_fraction() -> None:
    (s, w, mn, _mx), nf, _ = reduce_value(Weighted(torch.tensor(0.5), 8))
    assert (s, w, nf) == (4.0, 8.0, 0) and math.isnan(mn)
    assert reduce_value(Fraction(3, torch.tensor(12))).state[:2] == (3.0, 12.0)
    assert reduce_value(Weighted(math.nan, 8)).nonfinite == 1  # counted, not merged


@pytest.mark.parametrize(
    "bad, message",
    [
        ("text", "str"),
        (None, "NoneType"),
        (Weighted(1.0, -2), "non-negative"),
        (Weighted(np.ones(3), 2), "single number"),
        (Fraction(1, math.nan), "finite"),
        (Masked(np.ones(3), np.ones(4)), r"mask has shape \(4,\)"),
        (Masked(torch.ones(3), torch.ones(2)), r"mask has shape \(2,\)"),
        (np.array(["a", "b"]), "cannot read"),
    ],
)
def test_invalid_values_name_the_problem(bad, message: str) -> None:
    with pytest.raises(InvalidValue, match=message):
        reduce_value(bad)
