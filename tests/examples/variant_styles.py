"""Small NumPy implementations in the styles the protocol's variants describe (issue 23), each
with the few lines of adapter it needs and its CAPABILITIES -- in a correct and a buggy
version (``build(style, buggy)``):

* ``probs_loss``: a cross-entropy on softmax output whose backward returns dL/dp;
* ``probs_loss_dlogits``: the same loss whose backward returns the logit gradient of softmax +
  CE composed (p - onehot), the shape of most hand-written classifiers;
* ``rows_loss``: a cross-entropy without ignore_index that divides by the number of rows (the
  buggy one by ``logits.shape[0]``: right for [N, V], wrong for [1, N, V]);
* ``plain_layernorm``: LayerNorm without gamma and beta;
* ``ffn_no_b2``: an FFN without its second bias;
* ``per_head_attention``: attention built from per-head projection layers, without W_o;
* ``single_head_attention``: the slides' single-head attention (no ``n_heads``);
* ``gpt_block``: a GPT-style causal, pre-LN block with its final LayerNorm (attention causal
  only, a layer norm, per-head-free fused projections);
* ``lean_block``: a block whose parts declare their own variants (attention without W_o, an
  FFN without biases and with exact GELU, RMSNorm): the block row is checked as they declare.

Each buggy version has one realistic bug in code its op alone uses; tests/suite/test_variants.py
checks that the correct one is green in every row it provides (n/a elsewhere) and the buggy
one red on exactly its op.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np


# ----------------------------------------------------------------------------- the code
class SoftmaxCrossEntropy:
    """-mean log p[label] of probabilities p (the softmax output), over every row."""

    def __init__(self, buggy=False, logit_grad=False):
        self.buggy, self.logit_grad = buggy, logit_grad

    def forward(self, p, labels, reduction="mean"):
        self.p, self.labels = p, labels
        self.n = labels.size if reduction == "mean" else 1
        picked = np.take_along_axis(p, labels[..., None], -1)[..., 0]
        return -np.log(picked).sum() / p.dtype.type(self.n)

    def backward(self, dloss):
        w = self.p.dtype.type(dloss / self.n)
        if self.logit_grad:  # the gradient of softmax + CE w.r.t. the logits: p - onehot
            d = self.p * w
            hit = w if not self.buggy else w * self.p.shape[-1]  # bug: onehot scaled by V
            np.put_along_axis(d, self.labels[..., None],
                              np.take_along_axis(d, self.labels[..., None], -1) - hit, -1)
            return d
        d = np.zeros_like(self.p)
        picked = np.take_along_axis(self.p, self.labels[..., None], -1)
        # bug: d(-log p)/dp written as -1/p^2
        np.put_along_axis(d, self.labels[..., None],
                          -w / (picked ** 2 if self.buggy else picked), -1)
        return d


class RowsCrossEntropy:
    """Cross-entropy of logits over every row it is given (no ignore_index)."""

    def __init__(self, buggy=False):
        self.buggy = buggy

    def forward(self, logits, labels, reduction="mean"):
        z = logits - logits.max(-1, keepdims=True)
        self.logp = z - np.log(np.exp(z).sum(-1, keepdims=True))
        self.labels = labels
        rows = logits.shape[0] if self.buggy else labels.size  # bug: shape[0] is not the rows
        self.n = rows if reduction == "mean" else 1
        picked = np.take_along_axis(self.logp, labels[..., None], -1)
        return -picked.sum() / logits.dtype.type(self.n)

    def backward(self, dloss):
        d = np.exp(self.logp)
        np.put_along_axis(d, self.labels[..., None],
                          np.take_along_axis(d, self.labels[..., None], -1) - 1, -1)
        return d * d.dtype.type(dloss / self.n)


class PlainLayerNorm:
    """(x - mean) / sqrt(var + eps): no gamma, no beta."""

    def __init__(self, eps, buggy=False):
        self.eps, self.buggy = eps, buggy

    def forward(self, x):
        mu = x.mean(-1, keepdims=True)
        self.rstd = 1.0 / np.sqrt(x.var(-1, keepdims=True) + x.dtype.type(self.eps))
        self.x_hat = (x - mu) * self.rstd
        return self.x_hat

    def backward(self, dy):
        dx = dy - dy.mean(-1, keepdims=True)
        if not self.buggy:  # bug: the variance path -x_hat mean(dy x_hat) forgotten
            dx = dx - self.x_hat * (dy * self.x_hat).mean(-1, keepdims=True)
        return dx * self.rstd


class FFNNoBias2:
    """ReLU(x W_1 + b_1) W_2: the second projection without a bias."""

    def __init__(self, W_1, b_1, W_2, buggy=False):
        self.W_1, self.b_1, self.W_2, self.buggy = W_1, b_1, W_2, buggy

    def forward(self, x):
        self.x = x
        self.pre = x @ self.W_1 + self.b_1
        self.h = np.maximum(self.pre, 0)
        return self.h @ self.W_2

    def backward(self, dy):
        H, I = self.W_1.shape
        self.dW_2 = self.h.reshape(-1, I).T @ dy.reshape(-1, H)
        dpre = (dy @ self.W_2.T) * (self.pre > 0)
        self.dW_1 = self.x.reshape(-1, H).T @ dpre.reshape(-1, I)
        # bug: the bias gradient averaged over the rows instead of summed
        self.db_1 = dpre.reshape(-1, I).mean(0) if self.buggy else dpre.reshape(-1, I).sum(0)
        return dpre @ self.W_1.T


class Head:
    """One attention head with its own projections W_q, W_k, W_v [H, d], biases [d]."""

    def __init__(self, W_q, W_k, W_v, b_q, b_k, b_v, buggy=False):
        self.W = (W_q, W_k, W_v)
        self.b = (b_q, b_k, b_v)
        self.buggy = buggy

    def forward(self, x, mask=None):
        self.x = x
        self.q, self.k, self.v = (x @ W + (b if b is not None else 0) for W, b in
                                  zip(self.W, self.b))
        self.scale = x.dtype.type(1.0 / np.sqrt(self.W[0].shape[1]))
        s = self.q @ self.k.transpose(0, 2, 1) * self.scale
        if mask is not None:
            s = np.where(mask[:, None, :], s, -np.inf)
        e = np.exp(s - s.max(-1, keepdims=True))
        self.p = e / e.sum(-1, keepdims=True)
        return self.p @ self.v

    def backward(self, dc):
        dv = self.p.transpose(0, 2, 1) @ dc
        dp = dc @ self.v.transpose(0, 2, 1)
        ds = self.p * (dp - (self.p * dp).sum(-1, keepdims=True))
        if not self.buggy:  # bug: the 1/sqrt(d) of the scores forgotten in the backward
            ds = ds * self.scale
        dq, dk = ds @ self.k, ds.transpose(0, 2, 1) @ self.q
        H = self.x.shape[-1]
        x2 = self.x.reshape(-1, H)
        self.dW = [x2.T @ d.reshape(x2.shape[0], -1) for d in (dq, dk, dv)]
        self.db = [d.reshape(x2.shape[0], -1).sum(0) for d in (dq, dk, dv)]
        return sum(d @ W.T for d, W in zip((dq, dk, dv), self.W))


class GPTBlock:
    """GPT-2's block: x + attn(ln_1(x)), then + mlp(ln_2(.)), then ln_f; causal attention with
    fused [H, H] projections and biases; LayerNorm with gamma and beta, eps 1e-5."""

    def __init__(self, p, n_heads, eps=1e-5, buggy=False):
        self.p, self.A, self.eps, self.buggy = p, n_heads, eps, buggy

    def _ln(self, x, name):
        mu = x.mean(-1, keepdims=True)
        rstd = 1.0 / np.sqrt(x.var(-1, keepdims=True) + x.dtype.type(self.eps))
        x_hat = (x - mu) * rstd
        return x_hat * self.p[f"{name}.gamma"] + self.p[f"{name}.beta"], (x_hat, rstd, name)

    def _ln_back(self, dy, c, grads):
        x_hat, rstd, name = c
        g = dy * self.p[f"{name}.gamma"]
        H = dy.shape[-1]
        grads[f"{name}.gamma"] = (dy * x_hat).reshape(-1, H).sum(0)
        grads[f"{name}.beta"] = dy.reshape(-1, H).sum(0)
        return rstd * (g - g.mean(-1, keepdims=True)
                       - x_hat * (g * x_hat).mean(-1, keepdims=True))

    def _attn(self, x):
        p, A = self.p, self.A
        B, T, H = x.shape
        d = H // A
        q, k, v = (x @ p[f"attn.W_{n}"] + p[f"attn.b_{n}"] for n in "qkv")
        split = [t.reshape(B, T, A, d).transpose(0, 2, 1, 3) for t in (q, k, v)]
        scale = x.dtype.type(1.0 / np.sqrt(d))
        s = split[0] @ split[1].transpose(0, 1, 3, 2) * scale
        # bug: the mask lets each position see the next one too
        future = np.triu(np.ones((T, T), bool), k=2 if self.buggy else 1)
        s = np.where(future, -np.inf, s)
        e = np.exp(s - s.max(-1, keepdims=True))
        P = e / e.sum(-1, keepdims=True)
        ctx = (P @ split[2]).transpose(0, 2, 1, 3).reshape(B, T, H)
        return ctx @ p["attn.W_o"] + p["attn.b_o"], (x, split, P, ctx, scale)

    def _attn_back(self, dy, c, grads):
        p, A = self.p, self.A
        x, (q, k, v), P, ctx, scale = c
        B, T, H = x.shape
        d = H // A
        grads["attn.W_o"] = ctx.reshape(-1, H).T @ dy.reshape(-1, H)
        grads["attn.b_o"] = dy.reshape(-1, H).sum(0)
        dctx = (dy @ p["attn.W_o"].T).reshape(B, T, A, d).transpose(0, 2, 1, 3)
        dv = P.transpose(0, 1, 3, 2) @ dctx
        dP = dctx @ v.transpose(0, 1, 3, 2)
        ds = P * (dP - (P * dP).sum(-1, keepdims=True)) * scale
        dq, dk = ds @ k, ds.transpose(0, 1, 3, 2) @ q
        dx = 0
        for n, dt in zip("qkv", (dq, dk, dv)):
            dt = dt.transpose(0, 2, 1, 3).reshape(B, T, H)
            grads[f"attn.W_{n}"] = x.reshape(-1, H).T @ dt.reshape(-1, H)
            grads[f"attn.b_{n}"] = dt.reshape(-1, H).sum(0)
            dx = dx + dt @ p[f"attn.W_{n}"].T
        return dx

    def forward(self, x):
        p = self.p
        n1, c1 = self._ln(x, "ln1")
        a, ca = self._attn(n1)
        h = x + a
        n2, c2 = self._ln(h, "ln2")
        pre = n2 @ p["ffn.W_1"] + p["ffn.b_1"]
        m = np.maximum(pre, 0)
        out = h + m @ p["ffn.W_2"] + p["ffn.b_2"]
        y, cf = self._ln(out, "ln_f")
        self.cache = (c1, ca, c2, n2, pre, m, cf)
        return y

    def backward(self, dy):
        p, grads = self.p, {}
        c1, ca, c2, n2, pre, m, cf = self.cache
        H, I = p["ffn.W_1"].shape
        dout = self._ln_back(dy, cf, grads)
        grads["ffn.W_2"] = m.reshape(-1, I).T @ dout.reshape(-1, H)
        grads["ffn.b_2"] = dout.reshape(-1, H).sum(0)
        dpre = (dout @ p["ffn.W_2"].T) * (pre > 0)
        grads["ffn.W_1"] = n2.reshape(-1, H).T @ dpre.reshape(-1, I)
        grads["ffn.b_1"] = dpre.reshape(-1, I).sum(0)
        dh = dout + self._ln_back(dpre @ p["ffn.W_1"].T, c2, grads)
        dx = dh + self._ln_back(self._attn_back(dh, ca, grads), c1, grads)
        return dx, grads


class LeanBlock:
    """A post-norm block built from lean parts, each declared on its own op: attention without
    an output projection (heads concatenated), an FFN without biases and with exact GELU,
    RMSNorm for both norms -- the block row is checked as these parts declare."""

    def __init__(self, p, n_heads, eps, buggy=False):
        self.p, self.A, self.eps, self.buggy = p, n_heads, eps, buggy

    def _rms(self, x, name):
        rstd = 1.0 / np.sqrt((x * x).mean(-1, keepdims=True) + x.dtype.type(self.eps))
        return x * rstd * self.p[f"{name}.gamma"], (x * rstd, rstd, name)

    def _rms_back(self, dy, c, grads):
        x_hat, rstd, name = c
        grads[f"{name}.gamma"] = (dy * x_hat).reshape(-1, dy.shape[-1]).sum(0)
        g = dy * self.p[f"{name}.gamma"]
        if self.buggy:  # bug: the rms treated as a constant (the x_hat mean(g x_hat) term lost)
            return g * rstd
        return (g - x_hat * (g * x_hat).mean(-1, keepdims=True)) * rstd

    def _gelu(self, z):
        return 0.5 * z * (1 + erf(z * z.dtype.type(np.sqrt(0.5))))

    def forward(self, x):
        p, A = self.p, self.A
        B, T, H = x.shape
        d = H // A
        qkv = [x @ p[f"attn.W_{n}"] + p.get(f"attn.b_{n}", 0) for n in "qkv"]
        q, k, v = (t.reshape(B, T, A, d).transpose(0, 2, 1, 3) for t in qkv)
        s = q @ k.transpose(0, 1, 3, 2) / np.sqrt(x.dtype.type(d))
        e = np.exp(s - s.max(-1, keepdims=True))
        P = e / e.sum(-1, keepdims=True)
        a = (P @ v).transpose(0, 2, 1, 3).reshape(B, T, H)
        h, c1 = self._rms(x + a, "ln1")
        pre = h @ p["ffn.W_1"]
        out, c2 = self._rms(h + self._gelu(pre) @ p["ffn.W_2"], "ln2")
        self.cache = (x, q, k, v, P, c1, h, pre, c2)
        return out

    def backward(self, dy):
        p, grads = self.p, {}
        x, q, k, v, P, c1, h, pre, c2 = self.cache
        B, T, H = x.shape
        I = pre.shape[-1]
        dr2 = self._rms_back(dy, c2, grads)
        grads["ffn.W_2"] = self._gelu(pre).reshape(-1, I).T @ dr2.reshape(-1, H)
        pdf = np.exp(-pre * pre / 2) * pre.dtype.type(1 / np.sqrt(2 * np.pi))
        cdf = 0.5 * (1 + erf(pre * pre.dtype.type(np.sqrt(0.5))))
        dpre = (dr2 @ p["ffn.W_2"].T) * (cdf + pre * pdf)
        grads["ffn.W_1"] = h.reshape(-1, H).T @ dpre.reshape(-1, I)
        dr1 = self._rms_back(dr2 + dpre @ p["ffn.W_1"].T, c1, grads)
        dctx = dr1.reshape(B, T, self.A, -1).transpose(0, 2, 1, 3)
        dv = P.transpose(0, 1, 3, 2) @ dctx
        dP = dctx @ v.transpose(0, 1, 3, 2)
        ds = P * (dP - (P * dP).sum(-1, keepdims=True)) / np.sqrt(x.dtype.type(q.shape[-1]))
        dx = dr1
        for n, dt in zip("qkv", (ds @ k, ds.transpose(0, 1, 3, 2) @ q, dv)):
            dt = dt.transpose(0, 2, 1, 3).reshape(B, T, H)
            grads[f"attn.W_{n}"] = x.reshape(-1, H).T @ dt.reshape(-1, H)
            if f"attn.b_{n}" in p:
                grads[f"attn.b_{n}"] = dt.reshape(-1, H).sum(0)
            dx = dx + dt @ p[f"attn.W_{n}"].T
        return dx, grads


def erf(x):
    """erf to float64 precision (Abramowitz-Stegun is too coarse for FD at 1e-6)."""
    from math import erf as scalar_erf

    return np.vectorize(scalar_erf, otypes=[x.dtype])(x)


# ----------------------------------------------------------------------------- the adapters
def _probs_loss(buggy, logit_grad):
    def cross_entropy_forward(p, labels, *, reduction="mean"):
        loss = SoftmaxCrossEntropy(buggy, logit_grad)
        return loss.forward(p, labels, reduction), loss

    def cross_entropy_backward(dloss, loss):
        return (loss.backward(dloss),)

    form = "probabilities_dlogits" if logit_grad else "probabilities"
    return dict(cross_entropy_forward=cross_entropy_forward,
                cross_entropy_backward=cross_entropy_backward,
                CAPABILITIES={"cross_entropy": {"input": form, "ignore_index": False}})


def _rows_loss(buggy):
    def cross_entropy_forward(logits, labels, *, reduction="mean"):
        loss = RowsCrossEntropy(buggy)
        return loss.forward(logits, labels, reduction), loss

    def cross_entropy_backward(dloss, loss):
        return (loss.backward(dloss),)

    return dict(cross_entropy_forward=cross_entropy_forward,
                cross_entropy_backward=cross_entropy_backward,
                CAPABILITIES={"cross_entropy": {"ignore_index": False}})


def _plain_layernorm(buggy):
    def layernorm_forward(x, gamma, beta, eps=1e-12):
        ln = PlainLayerNorm(eps, buggy)
        return ln.forward(x), ln

    def layernorm_backward(dy, ln):
        return ln.backward(dy), None, None

    return dict(layernorm_forward=layernorm_forward, layernorm_backward=layernorm_backward,
                CAPABILITIES={"layernorm": {"affine": False}})


def _ffn_no_b2(buggy):
    def ffn_forward(x, W_1, b_1, W_2, b_2):
        ffn = FFNNoBias2(W_1, b_1, W_2, buggy)
        return ffn.forward(x), ffn

    def ffn_backward(dy, ffn):
        return ffn.backward(dy), ffn.dW_1, ffn.db_1, ffn.dW_2, None

    return dict(ffn_forward=ffn_forward, ffn_backward=ffn_backward,
                CAPABILITIES={"ffn": {"b_2": False}})


def _per_head_attention(buggy):
    def attention_forward(x, W_q, W_k, W_v, W_o, b_q=None, b_k=None, b_v=None, b_o=None, *,
                          n_heads, mask=None):
        heads = [Head(W_q[a], W_k[a], W_v[a], *(None if b is None else b[a]
                                                 for b in (b_q, b_k, b_v)), buggy=buggy)
                 for a in range(n_heads)]
        return np.concatenate([h.forward(x, mask) for h in heads], -1), heads

    def attention_backward(dy, heads):
        d = dy.shape[-1] // len(heads)
        dx = sum(h.backward(dy[..., a * d:(a + 1) * d]) for a, h in enumerate(heads))
        dW = [np.stack([h.dW[i] for h in heads]) for i in range(3)]
        db = [np.stack([h.db[i] for h in heads]) if heads[0].b[i] is not None else None
              for i in range(3)]
        return (dx, *dW, None, *db, None)

    return dict(attention_forward=attention_forward, attention_backward=attention_backward,
                CAPABILITIES={"attention": {"W_o": False, "heads": "per_head"}})


def _single_head_attention(buggy):
    """The slides' single-head attention: no n_heads, d_k = H, with W_o and b_o."""
    def attention_forward(x, W_q, W_k, W_v, W_o, b_q=None, b_k=None, b_v=None, b_o=None, *,
                          mask=None):
        head = Head(W_q, W_k, W_v, b_q, b_k, b_v, buggy=buggy)
        ctx = head.forward(x, mask)
        return ctx @ W_o + (0 if b_o is None else b_o), (head, ctx, W_o, b_o is not None)

    def attention_backward(dy, cache):
        head, ctx, W_o, has_b = cache
        H = ctx.shape[-1]
        dW_o = ctx.reshape(-1, H).T @ dy.reshape(-1, H)
        dx = head.backward(dy @ W_o.T)
        db = head.db if has_b else [None] * 3
        return (dx, *head.dW, dW_o, *db, dy.reshape(-1, H).sum(0) if has_b else None)

    return dict(attention_forward=attention_forward, attention_backward=attention_backward,
                CAPABILITIES={"attention": {"heads": "single"}})


def _block_style(cls, capabilities: dict):
    """The adapter of a class-based block (a fresh object per forward is the cache)."""
    def make(buggy):
        def block_forward(x, p, *, n_heads, mask=None, eps=1e-12):
            block = cls(p, n_heads, eps, buggy)
            return block.forward(x), block

        def block_backward(dout, block):
            return block.backward(dout)

        return dict(block_forward=block_forward, block_backward=block_backward,
                    CAPABILITIES=capabilities)

    return make


_gpt_block = _block_style(GPTBlock, {"key_mask": False,
                                     "block": {"norm": "pre_final", "causal": True}})
# declared on the parts: the block's dict has no attn.W_o / attn.b_o, ffn.b_1, ffn.b_2
_lean_block = _block_style(LeanBlock, {"key_mask": False, "attention": {"W_o": False},
                                       "ffn": {"b_1": False, "b_2": False,
                                               "activation": "gelu"},
                                       "block": {"normalization": "rmsnorm"}})


STYLES = {
    "probs_loss": (lambda buggy: _probs_loss(buggy, False), "cross_entropy"),
    "probs_loss_dlogits": (lambda buggy: _probs_loss(buggy, True), "cross_entropy"),
    "rows_loss": (_rows_loss, "cross_entropy"),
    "plain_layernorm": (_plain_layernorm, "layernorm"),
    "ffn_no_b2": (_ffn_no_b2, "ffn"),
    "per_head_attention": (_per_head_attention, "attention"),
    "single_head_attention": (_single_head_attention, "attention"),
    "gpt_block": (_gpt_block, "block"),
    "lean_block": (_lean_block, "block"),
}


def build(style: str, buggy: bool = False) -> SimpleNamespace:
    """The implementation of ``style`` (correct, or with its one bug) as a namespace: its
    protocol names and its CAPABILITIES."""
    make, _ = STYLES[style]
    ns = SimpleNamespace(**make(buggy))
    ns.__name__ = f"{style}{'_buggy' if buggy else ''}"
    return ns
