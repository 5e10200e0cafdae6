"""A class-based NumPy transformer written the way tutorial code is ("a transformer from
scratch in NumPy"): layers cache activations on ``self``, everything is ``[B, T, H]``, no biases
in the attention and no key mask, its own in-place Adam (no weight decay) -- with the thin
adapter that puts it under test and its CAPABILITIES.

``BUGS`` (a set of op names) switches on one realistic bug per op, each in code that op alone
uses: the verdict must be red in that row only (tests/suite/test_verdicts.py).
"""

from __future__ import annotations

import os

import numpy as np

from minibert_spec.suite.adapters import layer, optimizer

# e.g. MINIBERT_EXAMPLE_BUGS=attention minibert check tests.examples.<this module>
BUGS: set = set(filter(None, os.environ.get("MINIBERT_EXAMPLE_BUGS", "").split(",")))
CAPABILITIES = {"attention_bias": False, "key_mask": False, "weight_decay": False,
                "ranks": {"linear": (3,), "layernorm": (3,)}}


# ----------------------------------------------------------------------------- the network
class Linear:
    """y = x W (no bias), x [B, T, n]."""

    def __init__(self, W):
        self.W = W

    def forward(self, x):
        B, T, n = x.shape  # [B, T, H] only
        self.x = x
        return x @ self.W

    def backward(self, dy):
        B, T, n = self.x.shape
        x2, dy2 = self.x.reshape(B * T, n), dy.reshape(B * T, -1)
        if "linear" in BUGS:  # the first sequence's contribution only
            x2, dy2 = self.x[0], dy[0]
        self.dW = x2.T @ dy2
        return dy @ self.W.T


class LayerNorm:
    def __init__(self, gamma, beta, eps=1e-12):
        self.gamma, self.beta, self.eps = gamma, beta, eps

    def forward(self, x):
        B, T, H = x.shape
        mu = x.mean(-1, keepdims=True)
        self.rstd = 1.0 / np.sqrt(x.var(-1, keepdims=True) + self.eps)
        self.x_hat = (x - mu) * self.rstd
        return self.gamma * self.x_hat + self.beta

    def backward(self, dy):
        H = dy.shape[-1]
        self.dgamma = (dy * self.x_hat).reshape(-1, H).sum(0)
        self.dbeta = dy.reshape(-1, H).sum(0)
        if "layernorm" in BUGS:  # gamma pulled outside the means
            return self.gamma * self.rstd * (dy - dy.mean(-1, keepdims=True) - self.x_hat * (
                dy * self.x_hat).mean(-1, keepdims=True))
        g = dy * self.gamma
        return self.rstd * (g - g.mean(-1, keepdims=True)
                            - self.x_hat * (g * self.x_hat).mean(-1, keepdims=True))


class MultiHeadAttention:
    """softmax(Q K^T / sqrt(d_k)) V per head, projections without biases; x [B, T, H]."""

    def __init__(self, W_q, W_k, W_v, W_o, n_heads):
        self.W_q, self.W_k, self.W_v, self.W_o, self.A = W_q, W_k, W_v, W_o, n_heads

    def _split(self, t):
        B, T, H = t.shape
        return t.reshape(B, T, self.A, H // self.A).transpose(0, 2, 1, 3)

    def _merge(self, t):
        B, A, T, d = t.shape
        return t.transpose(0, 2, 1, 3).reshape(B, T, A * d)

    def forward(self, x):
        B, T, H = x.shape
        self.x = x
        self.q, self.k, self.v = (self._split(x @ W) for W in (self.W_q, self.W_k, self.W_v))
        self.scale = x.dtype.type(1.0 / np.sqrt(H // self.A))
        s = self.q @ self.k.transpose(0, 1, 3, 2) * self.scale
        e = np.exp(s - s.max(-1, keepdims=True))
        self.p = e / e.sum(-1, keepdims=True)
        self.ctx = self._merge(self.p @ self.v)
        return self.ctx @ self.W_o

    def backward(self, dy):
        B, T, H = dy.shape
        self.dW_o = self.ctx.reshape(-1, H).T @ dy.reshape(-1, H)
        dctx = self._split(dy @ self.W_o.T)
        dv = self.p.transpose(0, 1, 3, 2) @ dctx
        dp = dctx @ self.v.transpose(0, 1, 3, 2)
        ds = self.p * (dp - (self.p * dp).sum(-1, keepdims=True))
        if "attention" not in BUGS:  # the bug: 1/sqrt(d_k) forgotten in the backward
            ds = ds * self.scale
        dq, dk = ds @ self.k, ds.transpose(0, 1, 3, 2) @ self.q
        x2 = self.x.reshape(-1, H)
        dx = np.zeros_like(self.x)
        grads = []
        for W, d in ((self.W_q, dq), (self.W_k, dk), (self.W_v, dv)):
            d = self._merge(d)
            grads.append(x2.T @ d.reshape(-1, H))
            dx = dx + d @ W.T
        self.dW_q, self.dW_k, self.dW_v = grads
        return dx


class Adam:
    """In-place Adam over a dict of parameters (bias-corrected)."""

    def __init__(self, params, lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8):
        self.lr, self.b1, self.b2, self.eps, self.t = lr, beta1, beta2, eps, 0
        self.m = {k: np.zeros_like(v) for k, v in params.items()}
        self.v = {k: np.zeros_like(v) for k, v in params.items()}

    def step(self, params, grads):
        self.t += 1
        for k, g in grads.items():
            self.m[k] = self.b1 * self.m[k] + (1 - self.b1) * g
            self.v[k] = self.b2 * self.v[k] + (1 - self.b2) * g * g
            if "adam" in BUGS:  # bias correction forgotten
                m_hat, v_hat = self.m[k], self.v[k]
            else:
                m_hat = self.m[k] / (1 - self.b1 ** self.t)
                v_hat = self.v[k] / (1 - self.b2 ** self.t)
            params[k] -= (self.lr * m_hat / (np.sqrt(v_hat) + self.eps)).astype(params[k].dtype)


# ----------------------------------------------------------------------------- the adapter
linear_forward, linear_backward = layer("linear", Linear, grads={"W": "dW"})
layernorm_forward, layernorm_backward = layer(
    "layernorm", LayerNorm, grads={"gamma": "dgamma", "beta": "dbeta"})
attention_forward, attention_backward = layer(
    "attention", MultiHeadAttention, grads={w: f"d{w}" for w in ("W_q", "W_k", "W_v", "W_o")})
adam_init, adam_step = optimizer(
    Adam, hyper={"lr": "lr", "beta1": "b1", "beta2": "b2", "eps": "eps"}, m="m", v="v")
