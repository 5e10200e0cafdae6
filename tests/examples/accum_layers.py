"""Class layers in the micro-framework style: parameters are ``Param`` objects whose ``.grad``
the backward *adds* into (``+=``), so that several backward passes accumulate until the
training loop calls ``zero_grad`` -- and their adapter, a mapping
(``minibert_spec.suite.adapters``).

``BUGS`` (or MINIBERT_EXAMPLE_BUGS) switches on one bug per op: ``linear`` assigns its bias
gradient instead of adding it (right on one backward, wrong when gradients accumulate: only
``invariant[linear.grad_accumulates]`` sees it); ``layernorm`` pulls gamma out of the means.
"""

from __future__ import annotations

import os

import numpy as np

from minibert_spec.suite.adapters import layer
from tests.examples.classy_bert import ReLU  # no parameters: nothing to accumulate

BUGS: set = set(filter(None, os.environ.get("MINIBERT_EXAMPLE_BUGS", "").split(",")))


class Param:
    def __init__(self, value):
        self.value, self.grad = value, np.zeros_like(value)


class Linear:
    def __init__(self, n_in, n_out):
        self.W, self.b = Param(np.zeros((n_in, n_out))), Param(np.zeros(n_out))

    def forward(self, x):
        self.x = x
        return x @ self.W.value + self.b.value

    def backward(self, dy):
        n_in, n_out = self.W.value.shape
        self.W.grad += self.x.reshape(-1, n_in).T @ dy.reshape(-1, n_out)
        if "linear" in BUGS:  # '=' where every other gradient has '+='
            self.b.grad = dy.reshape(-1, n_out).sum(0)
        else:
            self.b.grad += dy.reshape(-1, n_out).sum(0)
        return dy @ self.W.value.T


class LayerNorm:
    def __init__(self, n, eps=1e-12):
        self.gamma, self.beta, self.eps = Param(np.ones(n)), Param(np.zeros(n)), eps

    def forward(self, x):
        mu = x.mean(-1, keepdims=True)
        self.rstd = 1.0 / np.sqrt(((x - mu) ** 2).mean(-1, keepdims=True) + self.eps)
        self.x_hat = (x - mu) * self.rstd
        return self.gamma.value * self.x_hat + self.beta.value

    def backward(self, dy):
        n = dy.shape[-1]
        self.gamma.grad += (dy * self.x_hat).reshape(-1, n).sum(0)
        self.beta.grad += dy.reshape(-1, n).sum(0)
        g = dy if "layernorm" in BUGS else dy * self.gamma.value
        dx = self.rstd * (g - g.mean(-1, keepdims=True)
                          - self.x_hat * (g * self.x_hat).mean(-1, keepdims=True))
        return self.gamma.value * dx if "layernorm" in BUGS else dx


# ----------------------------------------------------------------------------- the adapter
CAPABILITIES = {"ranks": {}}
linear_forward, linear_backward = layer(
    "linear", lambda W: Linear(*W.shape), params={"W": "W.value", "b": "b.value"},
    grads={"W": "W.grad", "b": "b.grad"}, accumulate=True)
layernorm_forward, layernorm_backward = layer(
    "layernorm", lambda gamma, eps: LayerNorm(gamma.size, eps),
    params={"gamma": "gamma.value", "beta": "beta.value"},
    grads={"gamma": "gamma.grad", "beta": "beta.grad"}, accumulate=True)
relu_forward, relu_backward = layer("relu", ReLU)
