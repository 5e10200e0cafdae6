"""The float32-vs-float64 invariant on an ill-conditioned case: a correct float32 result is as
close to the float64 one as its rounded inputs allow, and no closer
(minibert_spec.tolerances.F32_CONDITIONING_FACTOR).  Correct code on such a case is green; a
precision bug is still red."""

from __future__ import annotations

import numpy as np
import pytest

import minibert_reference
import minibert_spec.numerics.fdcheck as fdcheck
from minibert_spec.numerics.fdcheck import assert_f32_close, input_rounding_sensitivity
from minibert_spec.suite.checks.invariants import float32_path_agrees_with_float64
from minibert_spec.suite.strategies import OpCase, family

# the family's f32_ok filter calls assume(), a no-op outside a Hypothesis test
pytestmark = pytest.mark.filterwarnings("ignore:Using `assume` outside")


def _cancelling(inputs, dout=None):
    """y = a b - c d, the products close: float32 rounds each product by ~u |a b|, far more
    than |y|."""
    return [inputs["a"] * inputs["b"] - inputs["c"] * inputs["d"]]


def _near_products(rng, n=64):
    a, b = rng.uniform(50, 100, n), rng.uniform(50, 100, n)
    c = a * (1 + 1e-5 * rng.standard_normal(n))
    return {k: v.astype(np.float32).astype(np.float64)
            for k, v in dict(a=a, b=b, c=c, d=b).items()}


def test_correct_float32_on_an_ill_conditioned_case_is_green_with_its_conditioning():
    inputs = _near_products(np.random.default_rng(1))
    (y64,) = _cancelling(inputs)
    (y32,) = _cancelling({k: v.astype(np.float32) for k, v in inputs.items()})
    # the plain rule alone calls correct float32 code wrong here ...
    with pytest.raises(AssertionError, match="y"):
        assert_f32_close(y32, y64, float(np.abs(y64).max()), "y")
    # ... while rounding the inputs alone moves y by about as much as float32 missed it
    (sens,) = input_rounding_sensitivity(lambda i, d: _cancelling(i), inputs, None, [y64])
    err = float(np.abs(y32 - y64).max())
    assert sens > err / fdcheck.F32_CONDITIONING_FACTOR
    assert_f32_close(y32, y64, float(np.abs(y64).max()), "y", conditioning=sens)
    # two measurements agree (a fixed generator: a verdict does not change between runs)
    assert input_rounding_sensitivity(lambda i, d: _cancelling(i), inputs, None, [y64]) == [sens]


def _variance_one_pass(x):
    return (x * x).mean(-1) - x.mean(-1) ** 2


def _variance(inputs, dout=None):
    x = inputs["x"]
    return [((x - x.mean(-1, keepdims=True)) ** 2).mean(-1)]


def test_a_precision_bug_stays_red_with_the_conditioning_allowance():
    rng = np.random.default_rng(2)
    inputs = {"x": (3e3 + rng.standard_normal((4, 16))).astype(np.float32).astype(np.float64)}
    (v64,) = _variance(inputs)
    v32 = _variance_one_pass(inputs["x"].astype(np.float32))
    (sens,) = input_rounding_sensitivity(_variance, inputs, None, [v64])
    with pytest.raises(AssertionError, match="the change 1-ulp float32 roundings"):
        assert_f32_close(v32, v64, float(np.abs(v64).max()), "var", conditioning=sens)


def test_the_reference_llama_block_on_an_ill_conditioned_case_is_green_red_without_it(
        monkeypatch):
    """The case --seed 0 drew (tests/suite/f32_llama_case.py): the reference's dx misses the
    plain allowance by less than its inputs' rounding explains.  Without the allowance it is
    red (the case is still one the rule is for); with it, green."""
    from tests.suite.f32_llama_case import DOUT, FIXED, INPUTS

    case = OpCase(dict(INPUTS), dict(FIXED), DOUT)
    fam = family("block_llama_swiglu")
    with monkeypatch.context() as m:
        m.setattr(fdcheck, "F32_CONDITIONING_FACTOR", 0.0)
        with pytest.raises(AssertionError, match=r"block_llama_swiglu: dx: worst at index "
                                                 r"\(2, 1, 2\)"):
            float32_path_agrees_with_float64(minibert_reference, fam, case)
    float32_path_agrees_with_float64(minibert_reference, fam, case)
