"""A class-based NumPy network in the style of small GPT ports: softmax over ``[B, A, T, T]``
scores only, an FFN block on ``[B, T, H]``, a cross-entropy that computes in float64, clipping
with a divisor guard (``eps=1e-6``, like torch), the derivation's warmup ``lr(0) = 0``
(declared), and its own AdamW -- with the thin adapter and its CAPABILITIES.

``BUGS`` switches on one realistic bug per op (tests/suite/test_verdicts.py).
"""

from __future__ import annotations

import os

import numpy as np

from minibert_spec.suite.adapters import layer, optimizer
from tests.examples import classy_bert

# e.g. MINIBERT_EXAMPLE_BUGS=attention minibert check tests.examples.<this module>
BUGS: set = set(filter(None, os.environ.get("MINIBERT_EXAMPLE_BUGS", "").split(",")))
CAPABILITIES = {"ranks": {"softmax": (4,), "ffn": (3,), "cross_entropy": (3,)},
                "conventions": ("lr(0)=0",), "guards": {"clip_eps": 1e-6}}


class Softmax(classy_bert.Softmax):
    """The tutorial's softmax, on attention scores only (and with its bug switch)."""

    def forward(self, s, mask=None):
        B, A, T, T2 = s.shape  # attention scores only
        return super().forward(s, mask)

    def backward(self, dp):
        if "softmax" in BUGS:  # the Jacobian's subtraction dropped
            return self.p * dp
        return super().backward(dp)


class FeedForward:
    def __init__(self, W_1, b_1, W_2, b_2):
        self.W_1, self.b_1, self.W_2, self.b_2 = W_1, b_1, W_2, b_2

    def forward(self, x):
        B, T, H = x.shape
        self.x = x
        self.pre = x @ self.W_1 + self.b_1
        self.h = np.maximum(self.pre, 0)
        return self.h @ self.W_2 + self.b_2

    def backward(self, dy):
        H, I = self.W_1.shape
        self.dW_2 = self.h.reshape(-1, I).T @ dy.reshape(-1, H)
        self.db_2 = dy.reshape(-1, H).sum(0)
        dh = dy @ self.W_2.T
        dpre = dh if "ffn" in BUGS else dh * (self.pre > 0)  # the ReLU mask forgotten
        self.dW_1 = self.x.reshape(-1, H).T @ dpre.reshape(-1, I)
        self.db_1 = dpre.reshape(-1, I).sum(0)
        return dpre @ self.W_1.T


class CrossEntropy:
    """Mean (or sum) over the positions whose label is not ignore_index, in float64."""

    def forward(self, logits, labels, ignore_index=-100, reduction="mean"):
        B, T, V = logits.shape
        self.dtype = logits.dtype
        z = logits.astype(np.float64)
        z = z - z.max(-1, keepdims=True)
        self.logp = z - np.log(np.exp(z).sum(-1, keepdims=True))
        self.valid = labels != ignore_index
        self.safe = np.where(self.valid, labels, 0)
        self.n = max(int(self.valid.sum()), 1) if reduction == "mean" else 1
        picked = np.take_along_axis(self.logp, self.safe[..., None], -1)[..., 0]
        return -(picked * self.valid).sum() / self.n  # a float64 loss: a convention

    def backward(self, dloss):
        d = np.exp(self.logp)
        np.put_along_axis(d, self.safe[..., None],
                          np.take_along_axis(d, self.safe[..., None], -1) - 1, -1)
        scale = 1.0 if "cross_entropy" in BUGS else dloss / self.n  # the mean's 1/n forgotten
        return (d * self.valid[..., None] * scale).astype(self.dtype)


class AdamW:
    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0):
        self.lr, self.betas, self.eps, self.wd, self.t = lr, betas, eps, weight_decay, 0
        self.state = {k: (np.zeros_like(v), np.zeros_like(v)) for k, v in params.items()}

    def step(self, params, grads, no_decay=()):
        self.t += 1
        b1, b2 = self.betas
        for k, g in grads.items():
            m, v = self.state[k]
            m, v = b1 * m + (1 - b1) * g, b2 * v + (1 - b2) * g * g
            self.state[k] = (m, v)
            update = (m / (1 - b1 ** self.t)) / (np.sqrt(v / (1 - b2 ** self.t)) + self.eps)
            wd = 0.0 if k in no_decay else self.wd
            params[k] = (params[k] - self.lr * (update + wd * params[k])).astype(params[k].dtype)


def clip_grad_norm(grads, max_norm, eps=1e-6):
    norm = float(np.sqrt(sum(float((g.astype(np.float64) ** 2).sum()) for g in grads.values())))
    if "clip" in BUGS:  # per-tensor clipping
        return {k: g * min(1.0, max_norm / (np.linalg.norm(g) + eps)) for k, g in grads.items()
                }, norm
    coef = min(1.0, max_norm / (norm + eps))
    return {k: g * g.dtype.type(coef) for k, g in grads.items()}, norm


def lr_at(step, peak, warmup, total):
    if step < warmup:
        return peak * step / warmup  # the derivation's §8.1: lr(0) = 0
    return peak * max(0.0, (total - step) / (total - warmup))


# ----------------------------------------------------------------------------- the adapter
softmax_forward, softmax_backward = layer("softmax", Softmax, inputs=("x", "mask"))
ffn_forward, ffn_backward = layer(
    "ffn", FeedForward, grads={w: f"d{w}" for w in ("W_1", "b_1", "W_2", "b_2")})
cross_entropy_forward, cross_entropy_backward = layer(
    "cross_entropy", CrossEntropy, inputs=("logits", "labels", "ignore_index", "reduction"))
# no no_decay here: the suite applies the protocol's default rule itself (and says so)
adam_init, adam_step = optimizer(
    AdamW, hyper={"lr": "lr", ("beta1", "beta2"): "betas", "eps": "eps", "weight_decay": "wd"},
    m=lambda o: {k: m for k, (m, _) in o.state.items()},
    v=lambda o: {k: v for k, (_, v) in o.state.items()})
clip_by_global_norm = clip_grad_norm  # its eps=1e-6 default: declared in CAPABILITIES["guards"]


def warmup_linear_lr(step, *, peak_lr, warmup_steps, total_steps):
    return lr_at(step, peak_lr, warmup_steps, total_steps)


def global_grad_norm(grads):
    return clip_grad_norm(grads, np.inf)[1]
