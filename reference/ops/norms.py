"""LayerNorm and RMSNorm over the last axis."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from minibert_reference.ops._common import _sum_to_last
from minibert_reference.registry import implements
from minibert_reference.validate import as_float_array

# the public ops of this section: the package gathers them into minibert_reference.ops.__all__
__all__ = ["layernorm_forward", "layernorm_backward", "rmsnorm_forward", "rmsnorm_backward"]


# --------------------------------------------------------------------------- layernorm
class LayerNormCache(NamedTuple):
    x_hat: np.ndarray  # [..., N]
    rstd: np.ndarray  # 1 / sqrt(var + eps)  [..., 1]
    gamma: np.ndarray | None  # [N]; None without the affine map


@implements("layernorm.forward", "layernorm.plain")
def _layernorm_forward(x, gamma, beta, eps: float = 1e-12):
    """y = gamma * x_hat + beta, x_hat = (x - mu) / sqrt(var + eps), statistics over the last axis.

    var is the biased (1/N) variance, as in the Mini-BERT derivation and torch.nn.LayerNorm.
    ``gamma = beta = None``: no affine map, y = x_hat (torch's ``elementwise_affine=False``, the
    derivation at gamma = 1, beta = 0); ``eps = 0``: no guard (rows must not be constant).
    """
    eps = x.dtype.type(eps)
    with np.errstate(over="ignore"):  # an overflow is caught just below and redone exactly
        mu = x.mean(axis=-1, keepdims=True)  # [..., 1]
        x_mu = x - mu
        var = (x_mu * x_mu).mean(axis=-1, keepdims=True)  # [..., 1]
    if not np.isfinite(var).all() and np.isfinite(x).all():  # finite x, squares overflowed
        return _layernorm_forward_scaled(x, gamma, beta, eps)
    rstd = 1.0 / np.sqrt(var + eps)  # [..., 1]
    x_hat = np.multiply(x_mu, rstd, out=x_mu)  # in place: x_mu is this function's own array
    if gamma is None:  # no affine map: the output is x_hat (a copy: the cache keeps x_hat)
        return x_hat.copy(), LayerNormCache(x_hat, rstd, None)
    y = x_hat * gamma
    y += beta
    return y, LayerNormCache(x_hat, rstd, gamma)


def _layernorm_forward_scaled(x, gamma, beta, eps):
    """The LayerNorm of rows too large to square: without this a float32 row with |x| ~ 1e19
    squares to inf, rstd becomes 0 and the output is silently ``beta``.  Each row is multiplied
    by the power of two 2^-k that brings max|x| below 1 (exact), normalised, and rstd scaled
    back: the same x_hat, bit for bit, as the plain formula wherever that one does not
    overflow.  Only reached when the plain statistics came out non-finite (no extra pass over
    every input)."""
    _, exponent = np.frexp(np.abs(x).max(axis=-1, keepdims=True))
    scale = np.ldexp(np.ones(exponent.shape, dtype=x.dtype), -np.maximum(exponent, 0))
    y, cache = _layernorm_forward(x * scale, gamma, beta, eps * (scale * scale))
    return y, cache._replace(rstd=cache.rstd * scale)  # 1 / std of the unscaled x


@implements("layernorm.backward.dx", "layernorm.backward.dgamma", "layernorm.backward.dbeta",
            "layernorm.plain")
def _layernorm_backward(dy, cache):
    """dx = rstd * (g - mean(g) - x_hat * mean(g * x_hat)) with g = dy * gamma.

    gamma multiplies dy *before* the feature means: pulling it outside (as the Mini-BERT
    derivation §3.3 writes it) is only right when gamma is constant across features.
    """
    x_hat, rstd = cache.x_hat, cache.rstd
    g = dy if cache.gamma is None else dy * cache.gamma  # dL/dx_hat  [..., N]
    dx = g - g.mean(axis=-1, keepdims=True)
    dx -= x_hat * (g * x_hat).mean(axis=-1, keepdims=True)
    dx *= rstd
    if cache.gamma is None:  # no affine map: no gamma, no beta to differentiate
        return dx, None, None
    dgamma = _sum_to_last(dy * x_hat)  # [N]
    dbeta = _sum_to_last(dy)  # [N]
    return dx, dgamma, dbeta


def _check_eps(eps) -> None:
    if not (np.isfinite(eps) and eps >= 0):
        raise ValueError(f"eps: expected a finite value >= 0, got {eps}")


def _check_layernorm_params(N: int, dtype, gamma, beta, eps, *, affine_optional=False) -> None:
    """gamma, beta [N] of the input's dtype (both None: no affine map, where the op allows it);
    eps finite and >= 0."""
    if affine_optional and gamma is None and beta is None:
        _check_eps(eps)
        return
    if affine_optional and (gamma is None) != (beta is None):
        raise ValueError(f"gamma, beta: expected both arrays or both None, got gamma "
                         f"{'None' if gamma is None else 'an array'} and beta "
                         f"{'None' if beta is None else 'an array'}")
    as_float_array("gamma", gamma, shape=(N,), dtype=dtype)
    as_float_array("beta", beta, shape=(N,), dtype=dtype)
    _check_eps(eps)


def layernorm_forward(x, gamma, beta, eps: float = 1e-12):
    """x [..., N], gamma [N], beta [N] (both None: no affine map) -> gamma * x_hat + beta
    [..., N]."""
    as_float_array("x", x, min_ndim=1)
    _check_layernorm_params(x.shape[-1], x.dtype, gamma, beta, eps, affine_optional=True)
    return _layernorm_forward(x, gamma, beta, eps)


def layernorm_backward(dy, cache):
    as_float_array("dy", dy, shape=cache.x_hat.shape, dtype=cache.x_hat.dtype)
    return _layernorm_backward(dy, cache)


# --------------------------------------------------------------------------- RMSNorm
class RMSNormCache(NamedTuple):
    x_hat: np.ndarray  # x / rms  [..., N]
    rstd: np.ndarray  # 1 / rms = 1 / sqrt(mean(x^2) + eps)  [..., 1]
    gamma: np.ndarray | None  # [N]; None: no gain


@implements("rmsnorm.forward")
def _rmsnorm_forward(x, gamma, eps: float = 1e-6):
    """y = gamma * x / rms(x), rms = sqrt(mean(x^2) + eps) over the last axis: LayerNorm without
    the mean and without beta (LLaMA, T5; torch.nn.functional.rms_norm)."""
    rstd = 1.0 / np.sqrt((x * x).mean(axis=-1, keepdims=True) + x.dtype.type(eps))  # [..., 1]
    x_hat = x * rstd
    # gamma None: no gain (microgpt's x / rms(x)), the form with gamma = 1
    return (x_hat if gamma is None else x_hat * gamma), RMSNormCache(x_hat, rstd, gamma)


@implements("rmsnorm.backward.dx", "rmsnorm.backward.dgamma")
def _rmsnorm_backward(dy, cache):
    """dx = rstd * (g - x_hat * mean(g * x_hat)) with g = dy * gamma; dgamma = sum dy x_hat."""
    x_hat, rstd = cache.x_hat, cache.rstd
    g = dy if cache.gamma is None else dy * cache.gamma  # dL/dx_hat  [..., N]
    dx = g - x_hat * (g * x_hat).mean(axis=-1, keepdims=True)
    dx *= rstd
    return dx, None if cache.gamma is None else _sum_to_last(dy * x_hat)


def rmsnorm_forward(x, gamma, eps: float = 1e-6):
    """x [..., N], gamma [N] (None: no gain, dgamma None) -> gamma * x / sqrt(mean(x^2) + eps)
    [..., N]."""
    as_float_array("x", x, min_ndim=1)
    if gamma is not None:
        as_float_array("gamma", gamma, shape=(x.shape[-1],), dtype=x.dtype)
    _check_eps(eps)
    return _rmsnorm_forward(x, gamma, eps)


def rmsnorm_backward(dy, cache):
    as_float_array("dy", dy, shape=cache.x_hat.shape, dtype=cache.x_hat.dtype)
    return _rmsnorm_backward(dy, cache)
