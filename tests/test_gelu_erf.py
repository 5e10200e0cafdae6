"""The reference's erf (NumPy has none) against the standard library's math.erf, to float64
rounding: at most 2 ulps of the exact value over [-7, 7], near 0, at the grid points and
midpoints of its table, and exactly +-1 beyond."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from reference.ops import erf

MAX_ULPS = 2.0


def ulps(got, x):
    want = np.array([math.erf(v) for v in np.ravel(x)]).reshape(np.shape(x))
    return np.abs(got - want) / np.spacing(np.maximum(np.abs(want), np.finfo(float).tiny))


@pytest.mark.equation("gelu.forward.erf")
def test_erf_dense_grid_and_table_midpoints():
    x = np.concatenate([np.linspace(-7, 7, 200_001), (np.arange(-384, 385) + 0.5) / 64,
                        np.arange(-384, 385) / 64, [0.0, -0.0, 5.999999, 6.0, 1e300, -1e300]])
    assert ulps(erf(x), x).max() <= MAX_ULPS
    assert erf(np.array([6.0, 40.0, -40.0])).tolist() == [1.0, 1.0, -1.0]


@pytest.mark.equation("gelu.forward.erf")
@given(st.lists(st.floats(-8, 8, allow_nan=False, allow_subnormal=False), min_size=1,
                max_size=50))
def test_erf_matches_math_erf(values):
    x = np.array(values)
    assert ulps(erf(x), x).max() <= MAX_ULPS
    assert erf(x).dtype == np.float64 and erf(x).shape == x.shape


def test_erf_tiny_arguments_are_relative_accurate():
    x = np.array([1e-300, 1e-20, -3e-9, 2.5e-5])
    np.testing.assert_allclose(erf(x), [math.erf(v) for v in x], rtol=4e-16, atol=0)
