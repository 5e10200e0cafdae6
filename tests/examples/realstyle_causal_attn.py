"""A minGPT/nanoGPT-style ``CausalSelfAttention`` class written by hand in NumPy: its weights as
attributes (``W_q``, ``W_k``, ``W_v``, ``W_o`` and biases), ``forward(x, attn_mask)``
taking an *additive* float mask ``[B, 1, T, T]`` (0 where attended, -1e9 where not: the training
loop builds it from its padding and the causal triangle), ``backward(dout)`` keeping the weight
gradients on the layer; without biases when built with ``bias=False`` (None). Adapted with
``layer(..., mask=additive_mask)``: the suite's ``[B, T]`` key mask and ``causal`` turned into
the class's own format (issue 39).

``BUGS`` switches on a planted backward bug: "attention" drops the softmax Jacobian's
subtraction in the scores' gradient (a real slip: ``ds = p * dp``).
"""

from __future__ import annotations

import os

import numpy as np

from minibert_spec.suite.adapters import layer

# e.g. MINIBERT_EXAMPLE_BUGS=attention minibert check tests.examples.realstyle_causal_attn
BUGS: set = set(filter(None, os.environ.get("MINIBERT_EXAMPLE_BUGS", "").split(",")))
CAPABILITIES = {"key_mask": True, "attention": {"causal": (False, True)}}
NEG = -1e9  # what the training loop adds to a masked score


def _affine(x, W, b):  # nanoGPT's config.bias=False: no biases at all
    return x @ W if b is None else x @ W + b


class CausalSelfAttention:
    def __init__(self, n_embd: int, n_head: int, bias: bool = True):
        self.n_embd, self.n_head, self.bias = n_embd, n_head, bias
        self.W_q = self.W_k = self.W_v = self.W_o = None
        self.b_q = self.b_k = self.b_v = self.b_o = None

    def _split(self, t):  # [B, T, C] -> [B, nh, T, hs]
        B, T, C = t.shape
        return t.reshape(B, T, self.n_head, C // self.n_head).transpose(0, 2, 1, 3)

    def _merge(self, t):  # [B, nh, T, hs] -> [B, T, C]
        B, nh, T, hs = t.shape
        return t.transpose(0, 2, 1, 3).reshape(B, T, nh * hs)

    def forward(self, x, attn_mask=None):
        self.x = x
        q, k, v = (self._split(_affine(x, W, b)) for W, b in ((self.W_q, self.b_q),
                                                              (self.W_k, self.b_k),
                                                              (self.W_v, self.b_v)))
        att = q @ k.transpose(0, 1, 3, 2) / np.sqrt(q.shape[-1]).astype(x.dtype)
        if attn_mask is not None:
            att = att + attn_mask
        att = np.exp(att - att.max(axis=-1, keepdims=True))
        att = att / att.sum(axis=-1, keepdims=True)
        self.q, self.k, self.v, self.att = q, k, v, att
        self.y = self._merge(att @ v)
        return _affine(self.y, self.W_o, self.b_o)

    def backward(self, dout):
        C = self.n_embd
        self.dW_o = self.y.reshape(-1, C).T @ dout.reshape(-1, C)
        self.db_o = dout.reshape(-1, C).sum(axis=0)
        dy = self._split(dout @ self.W_o.T)
        datt = dy @ self.v.transpose(0, 1, 3, 2)
        dv = self.att.transpose(0, 1, 3, 2) @ dy
        if "attention" in BUGS:
            ds = self.att * datt
        else:
            ds = self.att * (datt - (datt * self.att).sum(axis=-1, keepdims=True))
        ds = ds / np.sqrt(self.q.shape[-1]).astype(ds.dtype)
        dq, dk = ds @ self.k, ds.transpose(0, 1, 3, 2) @ self.q
        dx = np.zeros_like(self.x)
        for c, d in (("q", dq), ("k", dk), ("v", dv)):
            d = self._merge(d)
            setattr(self, f"dW_{c}", self.x.reshape(-1, C).T @ d.reshape(-1, C))
            setattr(self, f"db_{c}", d.reshape(-1, C).sum(axis=0))
            dx = dx + d @ getattr(self, f"W_{c}").T
        return dx


# ----------------------------------------------------------------------------- the adapter
def additive_mask(mask, causal, T, dtype):
    """The training loop's mask: 0 where a query may attend a key, NEG elsewhere."""
    keep = np.tril(np.ones((T, T), bool)) if causal else np.ones((T, T), bool)
    if mask is not None:
        keep = keep & (np.asarray(mask) != 0)[:, None, None, :]
    return np.where(keep, 0.0, NEG).astype(dtype)[(None,) * (4 - keep.ndim)]


NAMES = ("W_q", "W_k", "W_v", "W_o", "b_q", "b_k", "b_v", "b_o")
attention_forward, attention_backward = layer(
    "attention", lambda W_q, b_q, b_k, b_v, b_o, n_heads: CausalSelfAttention(
        W_q.shape[0], n_heads, bias=b_q is not None),  # the biases named: bias=False is told
    params={n: n for n in NAMES}, grads={n: f"d{n}" for n in NAMES}, mask=additive_mask)
