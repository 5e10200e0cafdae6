"""Softmax (with its mask and Jacobian), ReLU, squared ReLU, tanh, GELU (exact, on a tabulated
erf, and tanh), SiLU and GeGLU (GELU-gated halves), plus the dispatch on an activation's name."""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from minibert_reference.registry import implements
from minibert_reference.validate import as_float_array, as_mask

# the public ops of this section: the package gathers them into minibert_reference.ops.__all__
__all__ = [
    "softmax_forward", "softmax_backward", "softmax_jacobian", "relu_forward", "relu_backward",
    "tanh_forward", "tanh_backward", "gelu_forward", "gelu_backward", "silu_forward",
    "silu_backward", "geglu_forward", "geglu_backward", "ACTIVATIONS",
]


# --------------------------------------------------------------------------- softmax
class SoftmaxCache(NamedTuple):
    p: np.ndarray  # the probabilities [..., n]


@implements("softmax.forward")
def _softmax_forward(x, mask=None):
    """Stable softmax over the last axis: exp(x - max) / sum.  ``mask`` (bool, broadcastable to
    x) keeps True entries; False entries get probability exactly 0."""
    if mask is not None:
        x = np.where(mask, x, -np.inf)
    z = x - x.max(axis=-1, keepdims=True)  # max is finite: each row has a kept entry
    p = np.exp(z, out=z)  # e, in place (z is this function's own array)
    p /= p.sum(axis=-1, keepdims=True)
    return p, SoftmaxCache(p)


@implements("softmax.backward")
def _softmax_backward(dp, cache):
    """Jacobian-vector product: dx = p * (dp - sum(p * dp)).  Masked entries (p = 0) get 0."""
    p = cache.p
    return (p * (dp - (p * dp).sum(axis=-1, keepdims=True)),)


def softmax_forward(x, mask=None):
    """x [..., n], ``mask`` (bool or 0/1, x's shape; every row needs one True entry) or None."""
    as_float_array("x", x, min_ndim=1)
    if mask is not None:
        mask = as_mask("mask", mask, shape=x.shape)
        if not np.all(mask.any(axis=-1)):
            raise ValueError("mask: every row needs at least one True entry, got an all-False row")
    return _softmax_forward(x, mask)


def softmax_backward(dp, cache):
    as_float_array("dp", dp, shape=cache.p.shape, dtype=cache.p.dtype)
    return _softmax_backward(dp, cache)


@implements("softmax.jacobian")
def softmax_jacobian(p):
    """The full Jacobian dp_i/dx_j = p_i (delta_ij - p_j) from softmax outputs p [..., N] ->
    [..., N, N] (Mini-BERT derivation §3.2).  For inspection and tests: the backward uses the
    O(N) Jacobian-vector product above, never this O(N^2) matrix."""
    as_float_array("p", p, min_ndim=1)
    return p[..., :, None] * (np.eye(p.shape[-1], dtype=p.dtype) - p[..., None, :])


# --------------------------------------------------------------------------- relu / relu2 / tanh
class ReluCache(NamedTuple):
    positive: np.ndarray  # x > 0 (bool: a quarter of float32's memory)
    dtype: np.dtype


@implements("relu.forward")
def _relu_forward(x):
    """max(0, x)."""
    return np.maximum(x, 0), ReluCache(x > 0, x.dtype)


@implements("relu.backward")
def _relu_backward(dy, cache):
    """dx = dy * [x > 0] (the subgradient at 0 is taken as 0, as torch does)."""
    return (dy * cache.positive,)


def relu_forward(x):
    as_float_array("x", x)
    return _relu_forward(x)


def relu_backward(dy, cache):
    as_float_array("dy", dy, shape=cache.positive.shape, dtype=cache.dtype)
    return _relu_backward(dy, cache)


class Relu2Cache(NamedTuple):
    r: np.ndarray  # max(x, 0): the backward's 2 max(x, 0) without keeping x


@implements("relu2.forward")
def _relu2_forward(x):
    """Squared ReLU max(x, 0)^2 (Primer; the nanoGPT speedrun's MLP)."""
    r = np.maximum(x, 0)
    return r * r, Relu2Cache(r)


@implements("relu2.backward")
def _relu2_backward(dy, cache):
    """dx = dy * 2 max(x, 0): continuous at 0 (squared ReLU is C^1), so no subgradient
    convention is needed."""
    return (dy * (2 * cache.r),)


class TanhCache(NamedTuple):
    y: np.ndarray  # tanh(x)


@implements("tanh.forward")
def _tanh_forward(x):
    y = np.tanh(x)
    return y, TanhCache(y)


@implements("tanh.backward")
def _tanh_backward(dy, cache):
    """dx = dy * (1 - tanh(x)^2)."""
    y = cache.y
    return (dy * (1 - y * y),)


def tanh_forward(x):
    as_float_array("x", x)
    return _tanh_forward(x)


def tanh_backward(dy, cache):
    as_float_array("dy", dy, shape=cache.y.shape, dtype=cache.y.dtype)
    return _tanh_backward(dy, cache)


# --------------------------------------------------------------------------- GELU
# "gelu": the exact form x Phi(x) with the normal CDF Phi(x) = (1 + erf(x / sqrt 2)) / 2 (BERT,
# Hugging Face hidden_act="gelu"); "gelu_tanh": the tanh approximation (hidden_act="gelu_new",
# torch's approximate="tanh"); "relu2": squared ReLU max(x, 0)^2 (above, with ReLU).
ACTIVATIONS = ("relu", "gelu", "gelu_tanh", "relu2")
_SQRT_HALF = math.sqrt(0.5)
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)
_TANH_C = math.sqrt(2.0 / math.pi)
_TANH_K = 0.044715

# NumPy has no erf.  erf is tabulated with the standard library's math.erf on a grid of step
# 1/64 over [0, 6] together with its derivatives, erf^(n)(x) = (-1)^(n-1) (2 / sqrt(pi))
# H_(n-1)(x) exp(-x^2) (H the physicists' Hermite polynomials), and evaluated as the degree-8
# Taylor polynomial about the nearest grid point (|d| <= 1/128: the truncation term is < 1e-20).
# Beyond 6, erf(x) = 1 in float64 (erfc(6) = 2e-17 < half an ulp of 1).  Measured against
# math.erf over [-7, 7]: at most 2 ulps (tests/reference/test_gelu_erf.py), 7x faster than math.erf
# element by element.
_ERF_STEPS, _ERF_XMAX, _ERF_ORDER = 64, 6.0, 8
_ERF_N = int(_ERF_XMAX * _ERF_STEPS)


def _erf_taylor_table() -> np.ndarray:
    """[order + 1, grid points]: row n holds erf^(n)(x0) / n! at x0 = j / 64."""
    table = np.empty((_ERF_ORDER + 1, _ERF_N + 1))
    for j in range(_ERF_N + 1):
        x = j / _ERF_STEPS
        table[0, j] = math.erf(x)
        g = 2.0 / math.sqrt(math.pi) * math.exp(-x * x)
        h_prev, h, fact = 0.0, 1.0, 1.0  # H_(n-2), H_(n-1), n!
        for n in range(1, _ERF_ORDER + 1):
            fact *= n
            table[n, j] = (-1) ** (n - 1) * g * h / fact
            h_prev, h = h, 2 * x * h - 2 * (n - 1) * h_prev
    return table


_ERF_TABLE = _erf_taylor_table()


def erf(x) -> np.ndarray:
    """The error function element by element, float64 (within 2 ulps of math.erf)."""
    x = np.asarray(x, dtype=np.float64)
    a = np.minimum(np.abs(x), _ERF_XMAX)  # no overflow for huge |x|: erf = +-1 there
    idx = np.rint(a * _ERF_STEPS).astype(np.intp)
    d = a - idx * (1.0 / _ERF_STEPS)
    y = _ERF_TABLE[_ERF_ORDER][idx]
    for n in range(_ERF_ORDER - 1, -1, -1):  # Horner in d
        y = y * d + _ERF_TABLE[n][idx]
    return np.copysign(np.where(a >= _ERF_XMAX, 1.0, y), x)


class GeluCache(NamedTuple):
    x: np.ndarray  # the input [...]
    cdf: np.ndarray  # Phi(x) ("gelu") or its tanh form (1 + tanh(u)) / 2 ("gelu_tanh")
    approximate: str  # "none" (erf) or "tanh"


@implements("gelu.forward.erf", "gelu.forward.tanh")
def _gelu_forward(x, approximate: str = "none"):
    """"none": x Phi(x), Phi(x) = (1 + erf(x / sqrt 2)) / 2;
    "tanh": x (1 + tanh(u)) / 2 with u = sqrt(2 / pi) (x + 0.044715 x^3), evaluated as
    x s with s = (1 + tanh(u)) / 2 = 1 / (1 + exp(-2u)): 1 + tanh(u) cancels for u << 0 (in
    float32 GELU(-5) came out 30% off, GELU(-6) as 0), the logistic form does not."""
    if approximate == "none":
        x64 = x.astype(np.float64, copy=False)
        cdf = (0.5 * (1.0 + erf(x64 * _SQRT_HALF))).astype(x.dtype)  # Phi(x)
        return x * cdf, GeluCache(x, cdf, approximate)
    c, k = x.dtype.type(_TANH_C), x.dtype.type(_TANH_K)
    u = c * (x + k * x * x * x)
    with np.errstate(over="ignore"):  # exp(-2u) = inf for u << 0: s = 0, as it should
        s = 1 / (1 + np.exp(-2 * u))  # (1 + tanh(u)) / 2
    return x * s, GeluCache(x, s, approximate)


@implements("gelu.backward.erf", "gelu.backward.tanh")
def _gelu_backward(dy, cache):
    """"none": dx = dy (Phi(x) + x phi(x)), phi the standard normal density;
    "tanh": dx = dy ((1 + t) / 2 + x (1 - t^2) sqrt(2 / pi) (1 + 3 * 0.044715 x^2) / 2) with
    t = tanh(u), evaluated as dy (s + 2 x s (1 - s) du/dx): (1 + t) / 2 = s and
    1 - t^2 = 4 s (1 - s)."""
    x = cache.x
    if cache.approximate == "none":
        pdf = (_INV_SQRT_2PI * np.exp(-0.5 * x.astype(np.float64) ** 2)).astype(x.dtype)
        return (dy * (cache.cdf + x * pdf),)
    s = cache.cdf
    c, k = x.dtype.type(_TANH_C), x.dtype.type(_TANH_K)
    du = c * (1 + 3 * k * x * x)
    return (dy * (s + 2 * x * s * (1 - s) * du),)


def _check_approximate(approximate) -> None:
    if approximate not in ("none", "tanh"):
        raise ValueError(f"approximate: expected 'none' or 'tanh', got {approximate!r}")


def gelu_forward(x, approximate: str = "none"):
    """x [...] -> GELU(x); ``approximate`` "none" (erf, exact) or "tanh"."""
    as_float_array("x", x)
    _check_approximate(approximate)
    return _gelu_forward(x, approximate)


def gelu_backward(dy, cache):
    as_float_array("dy", dy, shape=cache.x.shape, dtype=cache.x.dtype)
    return _gelu_backward(dy, cache)


# --------------------------------------------------------------------------- SiLU
class SiLUCache(NamedTuple):
    x: np.ndarray  # the input [...]
    s: np.ndarray  # sigmoid(x)


@implements("silu.forward")
def _silu_forward(x):
    """x sigmoid(x) (swish, LLaMA's gate activation; torch.nn.functional.silu), sigmoid(x) =
    1 / (1 + exp(-x)): exp(-x) overflows to inf for x << 0, and then s = 0, as it should."""
    with np.errstate(over="ignore"):
        s = 1 / (1 + np.exp(-x))
    return x * s, SiLUCache(x, s)


@implements("silu.backward")
def _silu_backward(dy, cache):
    """dx = dy * s (1 + x (1 - s)), s = sigmoid(x) (s' = s (1 - s))."""
    x, s = cache.x, cache.s
    return (dy * (s * (1 + x * (1 - s))),)


def silu_forward(x):
    """x [...] -> x sigmoid(x)."""
    as_float_array("x", x)
    return _silu_forward(x)


def silu_backward(dy, cache):
    as_float_array("dy", dy, shape=cache.x.shape, dtype=cache.x.dtype)
    return _silu_backward(dy, cache)


# --------------------------------------------------------------------------- GeGLU
# GeGLU (Shazeer, "GLU variants improve Transformer", 2020): the last axis split in halves, the
# first the gate through the erf GELU, the second the value -- torch's ``a, b = x.chunk(2, -1)``,
# ``F.gelu(a) * b`` (diffusers' GEGLU splits the other way round, ``hidden * gelu(gate)``: code of
# that convention is red here on the forward, naming the entries).
class GeGLUCache(NamedTuple):
    gate: GeluCache  # GELU's cache of the gate half a
    b: np.ndarray  # the value half [..., n]
    gelu: np.ndarray  # GELU(a) [..., n]


@implements("geglu.forward")
def _geglu_forward(x):
    """x [..., 2n] -> GELU(a) * b, a = x[..., :n], b = x[..., n:] (the erf GELU, one
    definition: :func:`_gelu_forward`)."""
    n = x.shape[-1] // 2
    a, b = x[..., :n], x[..., n:]
    g, gate = _gelu_forward(a, "none")
    return g * b, GeGLUCache(gate, b, g)


@implements("geglu.backward")
def _geglu_backward(dy, cache):
    """dx = [dy * b * GELU'(a) | dy * GELU(a)] (GELU' by :func:`_gelu_backward`)."""
    (da,) = _gelu_backward(dy * cache.b, cache.gate)
    return (np.concatenate([da, dy * cache.gelu], axis=-1),)


def geglu_forward(x):
    """x [..., 2n] -> GELU(x[..., :n]) * x[..., n:] (erf GELU); the last axis even, >= 2."""
    as_float_array("x", x, min_ndim=1)
    if x.shape[-1] % 2:
        raise ValueError(f"x: expected an even last axis (the gate and value halves), got "
                         f"shape {x.shape}")
    return _geglu_forward(x)


def geglu_backward(dy, cache):
    b = cache.b
    as_float_array("dy", dy, shape=b.shape, dtype=b.dtype)
    return _geglu_backward(dy, cache)


def _activation_forward(x, activation: str):
    """The FFN / MLM-transform nonlinearity by config name: relu, gelu (erf), gelu_tanh,
    relu2 (squared ReLU)."""
    if activation == "relu":
        return _relu_forward(x)
    if activation == "relu2":
        return _relu2_forward(x)
    return _gelu_forward(x, "tanh" if activation == "gelu_tanh" else "none")


def _activation_backward(dy, cache):
    if isinstance(cache, ReluCache):
        return _relu_backward(dy, cache)
    if isinstance(cache, Relu2Cache):
        return _relu2_backward(dy, cache)
    return _gelu_backward(dy, cache)


def _check_activation(activation) -> None:
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation: expected one of {ACTIVATIONS}, got {activation!r}")
