"""A class-based NumPy transformer in the style of "numpy-transformer" repositories: an
``Embedding`` and a sinusoidal ``PositionalEncoding`` layer on ``[B, T, H]``, an activation
class, its own Adam with (decoupled) weight decay that updates the parameters in place -- with
the thin adapter and its CAPABILITIES (no attention here at all: those rows are n/a).

``BUGS`` switches on one realistic bug per op (tests/suite/test_verdicts.py).
"""

from __future__ import annotations

import os

import numpy as np

from minibert_spec.suite.adapters import layer, optimizer

# e.g. MINIBERT_EXAMPLE_BUGS=attention minibert check tests.examples.<this module>
BUGS: set = set(filter(None, os.environ.get("MINIBERT_EXAMPLE_BUGS", "").split(",")))
CAPABILITIES = {"ranks": {"relu": (3,)}}


class Embedding:
    def __init__(self, W):
        self.W = W

    def forward(self, ids):
        B, T = ids.shape
        self.ids = ids
        return self.W[ids]

    def backward(self, dout):
        self.dW = np.zeros_like(self.W)
        if "embedding" in BUGS:  # fancy-index assignment: repeated ids keep one row only
            self.dW[self.ids.reshape(-1)] = dout.reshape(-1, self.W.shape[1])
        else:
            np.add.at(self.dW, self.ids.reshape(-1), dout.reshape(-1, self.W.shape[1]))


class PositionalEncoding:
    def __init__(self, T, d, dtype=np.float64):
        pos = np.arange(T)[:, None]
        i = np.arange(0, d, 2)
        angle = pos / 10000 ** (i / d)
        self.pe = np.zeros((T, d), dtype=dtype)
        if "sinusoidal_position" in BUGS:  # sin and cos swapped
            self.pe[:, 0::2], self.pe[:, 1::2] = np.cos(angle), np.sin(angle[:, : d // 2])
        else:
            self.pe[:, 0::2], self.pe[:, 1::2] = np.sin(angle), np.cos(angle[:, : d // 2])

    def forward(self, x):
        B, T, H = x.shape
        return x + self.pe[:T].astype(x.dtype)

    def backward(self, dout):
        return dout


class ReLU:
    def forward(self, x):
        B, T, H = x.shape
        self.x = x
        return np.maximum(x, 0)

    def backward(self, dy):
        if "relu" in BUGS:  # the mask taken as x >= 0 on the *gradient*
            return dy * (dy > 0)
        return dy * (self.x > 0)


class Adam:
    def __init__(self, params, lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.0):
        self.hp = dict(lr=lr, beta1=beta1, beta2=beta2, eps=eps, weight_decay=weight_decay)
        self.m = {k: np.zeros_like(v) for k, v in params.items()}
        self.v = {k: np.zeros_like(v) for k, v in params.items()}
        self.t = 0

    def update(self, params, grads, skip_decay=()):
        lr, b1, b2, eps, wd = (self.hp[k] for k in ("lr", "beta1", "beta2", "eps",
                                                       "weight_decay"))
        self.t += 1
        for k in params:
            g = grads[k]
            if "adam" in BUGS and k not in skip_decay:  # L2 folded into the gradient: coupled
                g = g + wd * params[k]
            self.m[k] = b1 * self.m[k] + (1 - b1) * g
            self.v[k] = b2 * self.v[k] + (1 - b2) * g * g
            step = lr * (self.m[k] / (1 - b1 ** self.t)) / (
                np.sqrt(self.v[k] / (1 - b2 ** self.t)) + eps)
            if k not in skip_decay and "adam" not in BUGS:
                step = step + lr * wd * params[k]
            params[k] -= step.astype(params[k].dtype)


# ----------------------------------------------------------------------------- the adapter
embedding_forward, embedding_backward = layer(
    "embedding", Embedding, inputs=("ids",), grads={"W": "dW"})
sinusoidal_position_forward, sinusoidal_position_backward = layer(
    "sinusoidal_position", lambda x: PositionalEncoding(x.shape[1], x.shape[2], x.dtype))
relu_forward, relu_backward = layer("relu", ReLU)
adam_init, adam_step = optimizer(  # no skip_decay passed: the suite applies the default rule
    Adam, step="update", m="m", v="v",
    hyper={k: f"hp.{k}" for k in ("lr", "beta1", "beta2", "eps", "weight_decay")})


def sinusoidal_encoding(T, d, dtype=np.float64):
    return PositionalEncoding(T, d, dtype).pe
