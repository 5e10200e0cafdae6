"""Hand-written backprop in the array API standard alone: linear, LayerNorm, softmax and GELU
written against the namespace of their inputs (``xp = array_namespace(x)``, the idiom of
array-API-generic libraries), so the same code runs on any library array-api-compat knows.

This module declares ``CAPABILITIES = {"arrays": "array_api_strict"}``: the suite hands it
array-api-strict arrays, which refuse everything the standard leaves out (NumPy's methods and
scalars, ``np.*`` calls, value-based casting) -- so a NumPy-ism anywhere on the path, the
suite's or this code's, is an error here.  The standard has no ``erf``: GELU's exact form
evaluates it by its series and the continued fraction of erfc.

``on(library)`` is the same code declared for another library: ``on("numpy")`` is its NumPy
twin (tests/suite/test_arrays.py compares their verdicts), ``on("cupy")`` its GPU form.
``BUGS`` switches on one realistic bug per op, as in tests/examples/backprop_torch.py.
"""

from __future__ import annotations

import math
import os
import sys
from types import SimpleNamespace

from array_api_compat import array_namespace

BUGS: set = set(filter(None, os.environ.get("MINIBERT_EXAMPLE_BUGS", "").split(",")))
_ERF_SPLIT = 2.5  # the series below it (cancellation ~1e-14), the continued fraction above


def erf(x):
    """erf of a float64 array to ~1e-14: the Taylor series 2/sqrt(pi) sum (-1)^n x^(2n+1) /
    (n! (2n+1)) for |x| < 2.5, else 1 - erfc(|x|) by erfc's continued fraction."""
    xp = array_namespace(x)
    a = xp.abs(x)
    term, series = a, a
    for n in range(1, 64):
        term = term * (-(a * a)) / n
        series = series + term / (2 * n + 1)
    b = xp.clip(a, min=_ERF_SPLIT)
    t = b
    for k in range(64, 0, -1):
        t = b + (k / 2) / t
    tail = 1 - xp.exp(-(b * b)) / (math.sqrt(math.pi) * t)
    return xp.sign(x) * xp.where(a < _ERF_SPLIT, series * (2 / math.sqrt(math.pi)), tail)


def linear_forward(x, W, b=None):
    y = x @ W
    return (y if b is None else y + b), (x, W, b is not None)


def linear_backward(dy, cache):
    x, W, has_b = cache
    xp = array_namespace(dy)
    x2, dy2 = xp.reshape(x, (-1, x.shape[-1])), xp.reshape(dy, (-1, dy.shape[-1]))
    db = None
    if has_b:
        db = xp.mean(dy2, axis=0) if "linear" in BUGS else xp.sum(dy2, axis=0)  # a mean
    return dy @ W.T, x2.T @ dy2, db


def layernorm_forward(x, gamma, beta, eps=1e-12):
    xp = array_namespace(x)
    mean = xp.mean(x, axis=-1, keepdims=True)
    rstd = 1 / xp.sqrt(xp.mean((x - mean) ** 2, axis=-1, keepdims=True) + eps)
    x_hat = (x - mean) * rstd
    return gamma * x_hat + beta, (x_hat, rstd, gamma)


def layernorm_backward(dy, cache):
    x_hat, rstd, gamma = cache
    xp = array_namespace(dy)

    def row_mean(a):
        return xp.mean(a, axis=-1, keepdims=True)

    if "layernorm" in BUGS:  # gamma pulled out of the feature means
        dx = rstd * gamma * (dy - row_mean(dy) - x_hat * row_mean(dy * x_hat))
    else:
        g = dy * gamma
        dx = rstd * (g - row_mean(g) - x_hat * row_mean(g * x_hat))
    n = dy.shape[-1]
    return (dx, xp.sum(xp.reshape(dy * x_hat, (-1, n)), axis=0),
            xp.sum(xp.reshape(dy, (-1, n)), axis=0))


def softmax_forward(x, mask=None):
    xp = array_namespace(x)
    if mask is not None:
        mask = mask if mask.dtype == xp.bool else mask != 0  # a 0/1 mask
        x = xp.where(mask, x, xp.full_like(x, -math.inf))
    e = xp.exp(x - xp.max(x, axis=-1, keepdims=True))
    p = e / xp.sum(e, axis=-1, keepdims=True)
    return p, p


def softmax_backward(dp, p):
    xp = array_namespace(dp)
    if "softmax" in BUGS:  # the row sum of p * dp taken over dp alone
        return (p * (dp - xp.sum(dp, axis=-1, keepdims=True)),)
    return (p * (dp - xp.sum(p * dp, axis=-1, keepdims=True)),)


def gelu_forward(x, approximate="none"):
    xp = array_namespace(x)
    x64 = xp.astype(x, xp.float64)  # Phi in float64: 1 + erf cancels in float32 for x << 0
    if approximate == "tanh":
        cdf = 0.5 * (1 + xp.tanh(math.sqrt(2 / math.pi) * (x64 + 0.044715 * x64 ** 3)))
    else:
        cdf = 0.5 * (1 + erf(x64 / math.sqrt(2)))
    return xp.astype(x64 * cdf, x.dtype), (x, approximate)


def gelu_backward(dy, cache):
    x, approximate = cache
    xp = array_namespace(dy)
    x64 = xp.astype(x, xp.float64)
    if approximate == "tanh":
        k = math.sqrt(2 / math.pi)
        t = xp.tanh(k * (x64 + 0.044715 * x64 ** 3))
        d = 0.5 * (1 + t) + 0.5 * x64 * (1 - t * t) * k * (1 + 3 * 0.044715 * x64 ** 2)
    else:
        pdf = xp.exp(-0.5 * x64 * x64)  # the normal density, without its 1 / sqrt(2 pi)
        if "gelu" not in BUGS:
            pdf = pdf / math.sqrt(2 * math.pi)
        d = 0.5 * (1 + erf(x64 / math.sqrt(2))) + x64 * pdf
    return (dy * xp.astype(d, dy.dtype),)


# ----------------------------------------------------------------------------- the adapter
CAPABILITIES = {"arrays": "array_api_strict"}
PROVIDED = ("linear", "layernorm", "softmax", "gelu")  # not OPS: that name declares ops


def on(library: str) -> SimpleNamespace:
    """The same functions, declared to compute on ``library`` ("numpy", "cupy", "torch")."""
    me = sys.modules[__name__]
    names = [f"{op}_{d}" for op in PROVIDED for d in ("forward", "backward")]
    return SimpleNamespace(CAPABILITIES={"arrays": library}, __name__=f"{__name__}:{library}",
                           **{n: getattr(me, n) for n in names})
