"""A GPT-2 transformer ``Block`` class written by hand in NumPy, as the ports write it: pre-LN
(``x + attn(ln_1(x))``, then ``h + mlp(ln_2(h))``), GELU's tanh form in the MLP, LayerNorm eps
1e-5, weights initialised from an ``rng`` given to the constructor and kept as attributes under
its own names (``ln_1_g``, ``attn_wq`` .. ``attn_bo``, ``mlp_w_fc``, ``mlp_w_proj`` ..), a
``forward(x, attn_mask)`` taking the training loop's *additive* float mask ``[B, 1, T, T]`` (0
where a query attends a key, -1e9 elsewhere: the causal triangle and the padding combined), and
``backward(dout)`` returning dx and keeping every parameter's gradient on the block (``d`` +
its name).  Adapted with ``layer("block", ..., mask=additive_mask)`` (issue 39): the suite's
``[B, T]`` key mask and ``causal`` turned into that format.

``BUGS`` switches on a planted backward bug: "residual" forgets the residual's gradient into the
attention branch (only the MLP's path reaches ``h``); "mask" recomputes the softmax in the
backward from the raw scores, the mask applied in the forward but not there (red only where a
mask masks something).
"""

from __future__ import annotations

import os

import numpy as np

from minibert_spec.suite.adapters import layer
from tests.examples.realstyle_causal_attn import additive_mask  # the loop's [B, 1, T, T] mask

# e.g. MINIBERT_EXAMPLE_BUGS=residual minibert check tests.examples.realstyle_block_mask
BUGS: set = set(filter(None, os.environ.get("MINIBERT_EXAMPLE_BUGS", "").split(",")))
GELU_C = (2.0 / np.pi) ** 0.5  # a Python float: float32 stays float32 (NEP 50)


def layer_norm(x, g, b, eps):
    mu = x.mean(axis=-1, keepdims=True)
    rstd = 1.0 / np.sqrt(((x - mu) ** 2).mean(axis=-1, keepdims=True) + eps)
    xhat = (x - mu) * rstd
    return xhat * g + b, (xhat, rstd, g)


def layer_norm_backward(dy, cache):
    xhat, rstd, g = cache
    dg = (dy * xhat).reshape(-1, xhat.shape[-1]).sum(axis=0)
    db = dy.reshape(-1, dy.shape[-1]).sum(axis=0)
    dxhat = dy * g
    dx = dxhat - dxhat.mean(axis=-1, keepdims=True) - \
        xhat * (dxhat * xhat).mean(axis=-1, keepdims=True)
    return dx * rstd, dg, db


def gelu(x):  # GPT-2's gelu_new
    t = np.tanh(GELU_C * (x + 0.044715 * x ** 3))
    return 0.5 * x * (1.0 + t), t


def gelu_backward(dy, x, t):
    return dy * (0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * GELU_C * (1.0 + 3 * 0.044715 * x * x))


def softmax(s):
    e = np.exp(s - s.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


class Block:
    def __init__(self, n_embd: int, n_head: int, rng: np.random.Generator, eps: float = 1e-5):
        C = n_embd
        self.n_head, self.eps = n_head, eps
        self.ln_1_g, self.ln_1_b, self.ln_2_g, self.ln_2_b = (np.ones(C), np.zeros(C),
                                                              np.ones(C), np.zeros(C))
        for n in ("q", "k", "v", "o"):
            setattr(self, f"attn_w{n}", 0.02 * rng.standard_normal((C, C)))
            setattr(self, f"attn_b{n}", np.zeros(C))
        self.mlp_w_fc, self.mlp_b_fc = 0.02 * rng.standard_normal((C, 4 * C)), np.zeros(4 * C)
        self.mlp_w_proj, self.mlp_b_proj = 0.02 * rng.standard_normal((4 * C, C)), np.zeros(C)

    def _heads(self, t):  # [B, T, C] -> [B, nh, T, hs]
        B, T, C = t.shape
        return t.reshape(B, T, self.n_head, C // self.n_head).transpose(0, 2, 1, 3)

    @staticmethod
    def _merge(t):  # [B, nh, T, hs] -> [B, T, C]
        B, nh, T, hs = t.shape
        return t.transpose(0, 2, 1, 3).reshape(B, T, nh * hs)

    def forward(self, x, attn_mask=None):
        a, self.c_ln1 = layer_norm(x, self.ln_1_g, self.ln_1_b, self.eps)
        q, k, v = (self._heads(a @ getattr(self, f"attn_w{n}") + getattr(self, f"attn_b{n}"))
                   for n in "qkv")
        self.scores = q @ k.transpose(0, 1, 3, 2) / np.sqrt(q.shape[-1]).astype(x.dtype)
        att = softmax(self.scores if attn_mask is None else self.scores + attn_mask)
        self.a, self.q, self.k, self.v, self.att = a, q, k, v, att
        self.y = self._merge(att @ v)
        h = x + self.y @ self.attn_wo + self.attn_bo
        m, self.c_ln2 = layer_norm(h, self.ln_2_g, self.ln_2_b, self.eps)
        self.m, self.u = m, m @ self.mlp_w_fc + self.mlp_b_fc
        self.g, self.t = gelu(self.u)
        return h + self.g @ self.mlp_w_proj + self.mlp_b_proj

    def backward(self, dout):
        def flat(t):
            return t.reshape(-1, t.shape[-1])

        self.dmlp_w_proj, self.dmlp_b_proj = flat(self.g).T @ flat(dout), flat(dout).sum(0)
        du = gelu_backward(dout @ self.mlp_w_proj.T, self.u, self.t)
        self.dmlp_w_fc, self.dmlp_b_fc = flat(self.m).T @ flat(du), flat(du).sum(0)
        dh, self.dln_2_g, self.dln_2_b = layer_norm_backward(du @ self.mlp_w_fc.T, self.c_ln2)
        if "residual" not in BUGS:
            dh = dh + dout  # h's residual path into the output
        self.dattn_wo, self.dattn_bo = flat(self.y).T @ flat(dh), flat(dh).sum(0)
        dy = self._heads(dh @ self.attn_wo.T)
        att = softmax(self.scores) if "mask" in BUGS else self.att
        datt = dy @ self.v.transpose(0, 1, 3, 2)
        ds = att * (datt - (datt * att).sum(axis=-1, keepdims=True))
        ds = ds / np.sqrt(self.q.shape[-1]).astype(ds.dtype)
        da = np.zeros_like(self.a)
        for n, d in (("q", ds @ self.k), ("k", ds.transpose(0, 1, 3, 2) @ self.q),
                     ("v", att.transpose(0, 1, 3, 2) @ dy)):
            d = self._merge(d)
            setattr(self, f"dattn_w{n}", flat(self.a).T @ flat(d))
            setattr(self, f"dattn_b{n}", flat(d).sum(0))
            da = da + d @ getattr(self, f"attn_w{n}").T
        dx, self.dln_1_g, self.dln_1_b = layer_norm_backward(da, self.c_ln1)
        return dh + dx


# ----------------------------------------------------------------------------- the adapter
CAPABILITIES = {"key_mask": True, "block": {"norm": "pre", "causal": (False, True)},
                "ffn": {"activation": "gelu_tanh"}}
NAMES = {**{f"ln{i}.{k}": f"ln_{i}_{k[0]}" for i in (1, 2) for k in ("gamma", "beta")},
         **{f"attn.{w}_{n}": f"attn_{w.lower()}{n}" for w in "Wb" for n in "qkvo"},
         "ffn.W_1": "mlp_w_fc", "ffn.b_1": "mlp_b_fc", "ffn.W_2": "mlp_w_proj",
         "ffn.b_2": "mlp_b_proj"}
block_forward, block_backward = layer(
    "block", lambda p, n_heads: Block(len(p["ln1.gamma"]), n_heads, np.random.default_rng(0)),
    params={**NAMES, "eps": "eps"}, grads={k: f"d{v}" for k, v in NAMES.items()},
    fixed={"norm": "pre", "activation": "gelu_tanh"}, mask=additive_mask)
