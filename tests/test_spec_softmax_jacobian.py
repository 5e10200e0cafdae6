"""softmax_jacobian (added with the spec): finite differences and the PyTorch oracle."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from spec.gradcheck import assert_all_passed, elementwise_check
from spec.tolerances import ORACLE_RTOL_F64

ROWS = hnp.arrays(np.float64, st.tuples(st.integers(1, 3), st.integers(2, 5)),
                  elements=st.floats(-3, 3, allow_nan=False, allow_subnormal=False))


@pytest.mark.equation("softmax.jacobian")
@given(x=ROWS, seed=st.integers(0, 2 ** 16))
def test_softmax_jacobian_finite_differences(impl, x, seed):
    """Row i of J is the gradient of p_i: each checked element-wise against central differences
    of the forward (a random mixed-sign combination of the rows too)."""
    p, _ = impl.softmax_forward(x)
    J = impl.softmax_jacobian(p)  # [R, N, N]
    u = np.random.default_rng(seed).standard_normal(p.shape)

    def f(x_):
        return float(np.sum(u * impl.softmax_forward(x_)[0]))

    grad = np.einsum("rn,rnm->rm", u, J)  # u^T J per row
    results = [elementwise_check(f, x, grad, op="softmax", tensor="x")]
    for r in range(x.shape[0]):
        for i in range(x.shape[1]):
            def f_i(x_, r=r, i=i):
                return float(impl.softmax_forward(x_)[0][r, i])
            g = np.zeros_like(x)
            g[r] = J[r, i]
            results.append(elementwise_check(f_i, x, g, op="softmax", tensor=f"p[{r},{i}]"))
    assert_all_passed(results)


@pytest.mark.oracle
@pytest.mark.equation("softmax.jacobian")
@given(x=ROWS)
def test_softmax_jacobian_matches_torch(impl, x):
    torch = pytest.importorskip("torch")
    p, _ = impl.softmax_forward(x)
    J = impl.softmax_jacobian(p)
    for r in range(x.shape[0]):
        ref = torch.autograd.functional.jacobian(lambda t: torch.softmax(t, dim=-1),
                                                 torch.tensor(x[r]))
        np.testing.assert_allclose(J[r], ref.numpy(), rtol=ORACLE_RTOL_F64,
                                   atol=0)
