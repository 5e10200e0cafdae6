"""A from-scratch, class-based NumPy network in the common tutorial style: every layer owns its
parameters, ``forward`` stores what ``backward`` needs on ``self``, and ``backward`` stores the
parameter gradients on ``self`` too.  It is *not* written to the minibert protocol; see
``classy_adapter`` for how it is put under test.
"""

from __future__ import annotations

import numpy as np


class Linear:
    def __init__(self, n_in: int, n_out: int, bias: bool = True, seed: int = 0):
        rng = np.random.default_rng(seed)
        self.W = rng.normal(0, 0.02, (n_in, n_out))
        self.b = np.zeros(n_out) if bias else None

    def forward(self, x):
        self.x = x  # cached on the instance
        y = x @ self.W
        return y + self.b if self.b is not None else y

    def backward(self, dy):
        n_in, n_out = self.W.shape
        self.dW = self.x.reshape(-1, n_in).T @ dy.reshape(-1, n_out)
        self.db = dy.reshape(-1, n_out).sum(0) if self.b is not None else None
        return dy @ self.W.T


class LayerNorm:
    def __init__(self, n: int, eps: float = 1e-12):
        self.gamma, self.beta, self.eps = np.ones(n), np.zeros(n), eps

    def forward(self, x):
        mu = x.mean(-1, keepdims=True)
        self.rstd = 1.0 / np.sqrt(((x - mu) ** 2).mean(-1, keepdims=True) + self.eps)
        self.x_hat = (x - mu) * self.rstd
        return self.gamma * self.x_hat + self.beta

    def backward(self, dy):
        g = dy * self.gamma
        n = dy.shape[-1]
        self.dgamma = (dy * self.x_hat).reshape(-1, n).sum(0)
        self.dbeta = dy.reshape(-1, n).sum(0)
        return self.rstd * (g - g.mean(-1, keepdims=True)
                            - self.x_hat * (g * self.x_hat).mean(-1, keepdims=True))


class Softmax:
    def forward(self, x, mask=None):
        if mask is not None:
            x = np.where(mask, x, -np.inf)
        e = np.exp(x - x.max(-1, keepdims=True))
        self.p = e / e.sum(-1, keepdims=True)
        return self.p

    def backward(self, dp):
        return self.p * (dp - (self.p * dp).sum(-1, keepdims=True))


class ReLU:
    def forward(self, x):
        self.mask = x > 0
        return x * self.mask

    def backward(self, dy):
        return dy * self.mask


class Embedding:
    def __init__(self, vocab: int, dim: int, seed: int = 0):
        self.W = np.random.default_rng(seed).normal(0, 0.02, (vocab, dim))

    def forward(self, ids):
        self.ids = ids
        return self.W[ids]

    def backward(self, dout):
        self.dW = np.zeros_like(self.W)
        np.add.at(self.dW, self.ids.reshape(-1), dout.reshape(-1, self.W.shape[1]))


class MaskedCrossEntropy:
    """Mean over the positions whose label is not ``ignore_index``; backward of a loss of 1."""

    def __init__(self, ignore_index: int = -100):
        self.ignore_index = ignore_index

    def forward(self, logits, labels):
        z = logits - logits.max(-1, keepdims=True)
        self.logp = z - np.log(np.exp(z).sum(-1, keepdims=True))
        self.valid = labels != self.ignore_index
        self.safe = np.where(self.valid, labels, 0)
        picked = np.take_along_axis(self.logp, self.safe[..., None], -1)[..., 0]
        # the count cast to the logits' dtype: float32 / int64 would promote the loss to float64
        self.count = logits.dtype.type(self.valid.sum())
        return -(picked * self.valid).sum() / self.count

    def backward(self):
        d = np.exp(self.logp)
        np.put_along_axis(d, self.safe[..., None],
                          np.take_along_axis(d, self.safe[..., None], -1) - 1, -1)
        return d * (self.valid / self.count).astype(d.dtype)[..., None]
