"""Softmax at logits of magnitude 1e4 (float64 and float32, with masked keys): exp overflows far
below that, so only a max-shifted softmax is finite.  The reference is float64 ``np.logaddexp``
of the same inputs, independent of the implementation."""

from __future__ import annotations

import numpy as np
import pytest

from spec.tolerances import F64_IDENTITY_RTOL, ORACLE_RTOL_F32


@pytest.mark.equation("softmax.forward")
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("masked", [False, True])
def test_softmax_is_stable_at_large_logits(impl, dtype, masked):
    rng = np.random.default_rng(0)
    x = (1e4 * rng.choice([-1.0, 1.0], size=(2, 3, 6)) + rng.standard_normal((2, 3, 6)))
    mask = None
    if masked:
        mask = rng.random((2, 3, 6)) < 0.7
        mask[..., 0] = True  # every row keeps a key
    x = x.astype(dtype)
    p = impl.softmax_forward(x, mask)[0] if masked else impl.softmax_forward(x)[0]
    z = np.where(mask, x.astype(np.float64), -np.inf) if masked else x.astype(np.float64)
    want = np.exp(z - np.logaddexp.reduce(z, axis=-1, keepdims=True))
    rtol = F64_IDENTITY_RTOL if dtype == np.float64 else ORACLE_RTOL_F32
    assert np.all(np.isfinite(p))
    np.testing.assert_allclose(p, want, rtol=rtol, atol=rtol)
