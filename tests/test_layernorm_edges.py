"""LayerNorm where the outside bugs hid: float32 rows whose mean is large relative to their
spread (a one-pass variance E[x^2] - E[x]^2 cancels catastrophically there), and eps across the
range checkpoints use (1e-12 in BERT, 1e-5 in torch's default, up to 1e-3), where an eps outside
the square root shows.  References are float64 computations of the very same inputs."""

from __future__ import annotations

import numpy as np
import pytest

F32 = np.finfo(np.float32).eps


def _layernorm64(x, gamma, beta, eps):
    x = x.astype(np.float64)
    mu = x.mean(axis=-1, keepdims=True)
    var = ((x - mu) ** 2).mean(axis=-1, keepdims=True)
    return gamma.astype(np.float64) * (x - mu) / np.sqrt(var + eps) + beta.astype(np.float64)


@pytest.mark.equation("layernorm.forward")
@pytest.mark.parametrize("ratio", [1e2, 1e3])
def test_float32_rows_with_large_mean_relative_to_spread(impl, ratio):
    """Rows mean +-ratio, spread 1, float32.  The float32 mean itself is off by ~eps32 * |mu|,
    so x_hat can be off by that over sigma: allowed 4 * eps32 * ratio (a data condition).  A
    one-pass variance loses ~eps32 * mu^2 / sigma^2 of the variance instead: 40x to 2500x more."""
    rng = np.random.default_rng(0)
    x = (ratio * rng.choice([-1.0, 1.0], size=(32, 1))
         + rng.standard_normal((32, 48))).astype(np.float32)
    gamma = (1.0 + 0.5 * rng.standard_normal(48)).astype(np.float32)
    beta = (0.5 * rng.standard_normal(48)).astype(np.float32)
    y, _ = impl.layernorm_forward(x, gamma, beta, 1e-5)
    want = _layernorm64(x, gamma, beta, 1e-5)
    assert y.dtype == np.float32
    atol = 4 * F32 * ratio * np.abs(gamma).max()
    np.testing.assert_allclose(y, want, rtol=0, atol=atol)


@pytest.mark.equation("layernorm.forward")
@pytest.mark.parametrize("eps", [1e-12, 1e-8, 1e-5, 1e-3])
def test_layernorm_eps_inside_the_square_root(impl, eps):
    """y = gamma (x - mu) / sqrt(var + eps) + beta in float64 for eps across 1e-12 .. 1e-3, on
    rows with small variance (~1e-2), where eps matters."""
    rng = np.random.default_rng(1)
    x = 0.1 * rng.standard_normal((4, 3, 6))
    gamma, beta = 1.0 + 0.5 * rng.standard_normal(6), 0.1 * rng.standard_normal(6)
    y, _ = impl.layernorm_forward(x, gamma, beta, eps)
    np.testing.assert_allclose(y, _layernorm64(x, gamma, beta, eps), rtol=1e-12, atol=1e-13)
