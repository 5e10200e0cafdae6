"""A single-head attention class without an output projection and without a mask argument, the
shape of a tutorial's ``SelfAttention`` (issue 41): ``forward(x)`` -> softmax(q k^T / sqrt(H)) v,
``backward(dy)`` -> dx, its weight gradients kept on the layer; adapted exactly as the docs show
(``"attention": {"W_o": False, "heads": "single"}`` and ``layer("attention", ...)``), with no
``key_mask`` declaration (a class without a mask argument often has none).

``BUG`` picks the fault: "" correct; "upcast" computes in float64 whatever it is given (float32
in -> float64 out, right in value); "no_v_path" leaves the path through V out of dx.  Before
issue 41 every W_o-free case carried a key mask, which this class cannot take: every FD, oracle
and invariant check was n/a and the attention row was ``ok`` on one SymPy check, the upcast
class included."""

from __future__ import annotations

import math

import numpy as np

from minibert_spec.suite.adapters import layer

BUG = ""
CAPABILITIES = {"attention": {"W_o": False, "heads": "single"}}
NAMES = ("W_q", "W_k", "W_v", "b_q", "b_k", "b_v")


class SelfAttention:
    def __init__(self, H: int):
        self.H = H
        for n in NAMES:
            setattr(self, n, None)

    def forward(self, x):
        if BUG == "upcast":
            x = x.astype(np.float64)
        q, k, v = (x @ getattr(self, f"W_{c}") + getattr(self, f"b_{c}") for c in "qkv")
        s = q @ np.swapaxes(k, -1, -2) / math.sqrt(self.H)
        p = np.exp(s - s.max(axis=-1, keepdims=True))
        p /= p.sum(axis=-1, keepdims=True)
        self.x, self.q, self.k, self.v, self.p = x, q, k, v, p
        return p @ v

    def backward(self, dy):
        dp = dy @ np.swapaxes(self.v, -1, -2)
        dv = np.swapaxes(self.p, -1, -2) @ dy
        ds = self.p * (dp - (dp * self.p).sum(axis=-1, keepdims=True)) / math.sqrt(self.H)
        dq, dk = ds @ self.k, np.swapaxes(ds, -1, -2) @ self.q
        flat = self.x.reshape(-1, self.H)
        for c, d in (("q", dq), ("k", dk), ("v", dv)):
            d2 = d.reshape(-1, self.H)
            setattr(self, f"dW_{c}", flat.T @ d2)
            setattr(self, f"db_{c}", d2.sum(axis=0))
        dx = dq @ self.W_q.T + dk @ self.W_k.T
        if BUG != "no_v_path":
            dx = dx + dv @ self.W_v.T
        return dx


attention_forward, attention_backward = layer(
    "attention", lambda W_q: SelfAttention(W_q.shape[0]),
    params={n: n for n in NAMES}, grads={n: f"d{n}" for n in NAMES})
