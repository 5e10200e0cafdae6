"""The NumPy twin of tests/examples/backprop_torch.py: the same hand-written backprop, line for
line, on NumPy arrays (the same context dicts, the same weight layouts, the same ``BUGS``).
tests/suite/test_arrays.py checks that the two get the same verdicts, correct and buggy: the
suite's conversion layer (spec/protocol/arrays.py) changes what the implementation computes on,
never what a check finds.
"""

from __future__ import annotations

import math
import os

import numpy as np

BUGS: set = set(filter(None, os.environ.get("MINIBERT_EXAMPLE_BUGS", "").split(",")))
_erf = np.vectorize(math.erf, otypes=[np.float64])  # NumPy has no erf


def embedding(ids, weight):
    return weight[ids], {"ids": ids, "shape": weight.shape}


def embedding_grad(dout, ctx):
    dweight = np.zeros(ctx["shape"], dtype=dout.dtype)
    if "embedding" in BUGS:  # a repeated id keeps one position's gradient, not their sum
        dweight[ctx["ids"]] = dout
    else:
        np.add.at(dweight, ctx["ids"], dout)
    return dweight


def linear(x, weight, bias=None):  # weight [out, in], as nn.Linear
    y = x @ weight.T
    return (y if bias is None else y + bias), {"x": x, "weight": weight, "bias": bias}


def linear_grad(dy, ctx):
    x, weight = ctx["x"], ctx["weight"]
    dy2, x2 = dy.reshape(-1, dy.shape[-1]), x.reshape(-1, x.shape[-1])
    dbias = None
    if ctx["bias"] is not None:
        dbias = dy2.mean(0) if "linear" in BUGS else dy2.sum(0)  # a mean over the rows
    return dy @ weight, dy2.T @ x2, dbias


def layer_norm(x, weight, bias, eps):
    mean = x.mean(-1, keepdims=True)
    rstd = 1.0 / np.sqrt(((x - mean) ** 2).mean(-1, keepdims=True) + eps)
    x_hat = (x - mean) * rstd
    return weight * x_hat + bias, {"x_hat": x_hat, "rstd": rstd, "weight": weight}


def layer_norm_grad(dy, ctx):
    x_hat, rstd, weight = ctx["x_hat"], ctx["rstd"], ctx["weight"]
    n = dy.shape[-1]
    if "layernorm" in BUGS:  # gamma pulled out of the feature means
        dx = rstd * weight * (dy - dy.mean(-1, keepdims=True)
                              - x_hat * (dy * x_hat).mean(-1, keepdims=True))
    else:
        g = dy * weight
        dx = rstd * (g - g.mean(-1, keepdims=True) - x_hat * (g * x_hat).mean(-1, keepdims=True))
    return dx, (dy * x_hat).reshape(-1, n).sum(0), dy.reshape(-1, n).sum(0)


def softmax(x, mask=None):
    if mask is not None:
        x = np.where(mask, x, -np.inf)
    e = np.exp(x - x.max(-1, keepdims=True))
    p = e / e.sum(-1, keepdims=True)
    return p, p


def softmax_grad(dp, p):
    if "softmax" in BUGS:  # the row sum of p * dp taken over dp alone
        return p * (dp - dp.sum(-1, keepdims=True))
    return p * (dp - (p * dp).sum(-1, keepdims=True))


def gelu(x, approximate="none"):
    x64 = x.astype(np.float64)  # Phi in float64: 1 + erf(x / sqrt 2) cancels in float32 for x << 0
    if approximate == "tanh":
        u = math.sqrt(2 / math.pi) * (x64 + 0.044715 * x64 ** 3)
        cdf = 0.5 * (1 + np.tanh(u))
    else:
        cdf = 0.5 * (1 + _erf(x64 / math.sqrt(2)))
    return (x64 * cdf).astype(x.dtype), (x, approximate)


def gelu_grad(dy, ctx):
    x, approximate = ctx
    x64 = x.astype(np.float64)
    if approximate == "tanh":
        k = math.sqrt(2 / math.pi)
        t = np.tanh(k * (x64 + 0.044715 * x64 ** 3))
        d = 0.5 * (1 + t) + 0.5 * x64 * (1 - t * t) * k * (1 + 3 * 0.044715 * x64 ** 2)
    else:
        pdf = np.exp(-0.5 * x64 * x64)  # the normal density, without its 1 / sqrt(2 pi)
        if "gelu" not in BUGS:
            pdf = pdf / math.sqrt(2 * math.pi)
        d = 0.5 * (1 + _erf(x64 / math.sqrt(2))) + x64 * pdf
    return (dy * d.astype(dy.dtype),)


def relu(x):
    return np.maximum(x, 0), x > 0


def relu_grad(dy, positive):
    return (dy * positive,)


def cross_entropy(logits, labels, ignore_index=-100, reduction="mean"):
    valid = labels != ignore_index
    safe = np.where(valid, labels, 0)
    z = logits - logits.max(-1, keepdims=True)  # exp(z) <= 1: no overflow
    e = np.exp(z)
    s = e.sum(-1, keepdims=True)
    picked = np.take_along_axis(z, safe[..., None], -1)[..., 0] - np.log(s[..., 0])  # log p[label]
    n = labels.size if "cross_entropy" in BUGS else int(valid.sum())  # ignored counted
    n = n if reduction == "mean" else 1
    loss = -(np.where(valid, picked, 0)).sum() / n
    return loss.astype(logits.dtype), (e / s, safe, valid, n)


def cross_entropy_grad(dloss, ctx):
    p, safe, valid, n = ctx
    d = p.copy()
    np.put_along_axis(d, safe[..., None], np.take_along_axis(d, safe[..., None], -1) - 1, -1)
    return (d * (valid[..., None].astype(d.dtype) * dloss / n),)


# ----------------------------------------------------------------------------- the adapter
CAPABILITIES: dict = {}  # NumPy: the default
gelu_forward, gelu_backward = gelu, gelu_grad
relu_forward, relu_backward = relu, relu_grad
cross_entropy_forward, cross_entropy_backward = cross_entropy, cross_entropy_grad
softmax_forward, layernorm_backward = softmax, layer_norm_grad


def embedding_forward(ids, W):
    return embedding(ids, W)


def embedding_backward(dout, ctx):
    return (embedding_grad(dout, ctx),)


def softmax_backward(dp, p):
    return (softmax_grad(dp, p),)


def linear_forward(x, W, b=None):  # the protocol's W is [in, out]: its W.T is nn.Linear's
    return linear(x, W.T, b)


def linear_backward(dy, ctx):
    dx, dweight, dbias = linear_grad(dy, ctx)
    return dx, dweight.T, dbias


def layernorm_forward(x, gamma, beta, eps=1e-12):
    return layer_norm(x, gamma, beta, eps)
