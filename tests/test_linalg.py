"""unit_rows and pair_cosines: scale-invariant, safe at the float64 range's ends, zero rows stay zero."""

from __future__ import annotations

import numpy as np
import pytest

from bertflow.linalg import pair_cosines, unit_rows


def test_unit_rows_have_unit_norm_and_keep_direction():
    x = np.random.default_rng(0).normal(size=(50, 7)).astype(np.float32)
    u = unit_rows(x)
    assert u.dtype == np.float64 and u.shape == x.shape
    np.testing.assert_allclose(np.linalg.norm(u, axis=1), 1.0, rtol=1e-12)
    np.testing.assert_allclose(u * np.linalg.norm(x.astype(np.float64), axis=1, keepdims=True), x, rtol=1e-6)


@pytest.mark.parametrize("scale", [1e-300, 1e300])
def test_unit_rows_do_not_overflow_or_underflow(scale):
    """Squares of 1e300 overflow and of 1e-300 underflow in float64: the rows are scaled by their peak first."""
    x = np.array([[3.0, 4.0], [-1.0, 0.0]]) * scale
    np.testing.assert_allclose(unit_rows(x), [[0.6, 0.8], [-1.0, 0.0]], rtol=1e-12)


def test_zero_rows_and_zero_width_stay_zero():
    np.testing.assert_array_equal(unit_rows(np.zeros((2, 3))), np.zeros((2, 3)))
    assert unit_rows(np.zeros((4, 0))).shape == (4, 0)


def test_pair_cosines_are_the_cosines_of_each_pair_in_float32():
    rng = np.random.default_rng(1)
    a, b = rng.normal(size=(20, 5)), rng.normal(size=(20, 5))
    got = pair_cosines(a, b)
    expected = (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
    assert got.dtype == np.float32 and got.shape == (20,)
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(pair_cosines(a, a * 1e200), 1.0, rtol=1e-6)  # scale-invariant
    assert pair_cosines(a[:1], np.zeros((1, 5)))[0] == 0.0  # a zero vector: cosine 0, not NaN
