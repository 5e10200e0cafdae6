"""A small NumPy encoder as tutorials write it: token + learned position embeddings, post-LN
blocks (multi-head attention with a key padding mask, a GELU MLP), a linear head and a masked
token cross-entropy; one ``loss_and_grads(params, input_ids, attention_mask, labels)`` with a
hand-written backward.  Judged by the ``whole_model`` row with no adapter at all
(``minibert check tests.examples.wm_encoder:loss_and_grads --model``; the params are this
module's ``init_params()``).

``make(bug=...)`` plants one backward bug (tests/suite/test_whole_model.py): ``layernorm``
(dx without its mean(dxhat * xhat) term), ``attn_scale`` (the scores' 1/sqrt(d) dropped on the
way back), ``gelu`` (GELU's derivative without its tanh' term), ``head_bias`` (the head's bias
gradient taken from the first sequence alone); ``dtype=np.float32`` computes in float32
whatever it is given.
"""

from __future__ import annotations

import numpy as np

V, H, A, F, T_MAX, LAYERS = 11, 8, 2, 16, 8, 2
EPS = 1e-5
C = float(np.sqrt(2.0 / np.pi))


def init_params(seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    p = {"tok_emb": rng.normal(0, 0.5, (V, H)), "pos_emb": rng.normal(0, 0.5, (T_MAX, H))}
    for i in range(LAYERS):
        for w in ("wq", "wk", "wv", "wo"):
            p[f"layers.{i}.attn.{w}"] = rng.normal(0, 0.4, (H, H))
            p[f"layers.{i}.attn.b{w[1]}"] = np.zeros(H)
        p[f"layers.{i}.ln1.gamma"], p[f"layers.{i}.ln1.beta"] = np.ones(H), np.zeros(H)
        p[f"layers.{i}.mlp.w1"], p[f"layers.{i}.mlp.b1"] = rng.normal(0, 0.4, (H, F)), np.zeros(F)
        p[f"layers.{i}.mlp.w2"], p[f"layers.{i}.mlp.b2"] = rng.normal(0, 0.4, (F, H)), np.zeros(H)
        p[f"layers.{i}.ln2.gamma"], p[f"layers.{i}.ln2.beta"] = np.ones(H), np.zeros(H)
    p["head.w"], p["head.b"] = rng.normal(0, 0.4, (H, V)), np.zeros(V)
    return p


def make(bug: str | None = None, dtype=None):
    """``loss_and_grads`` with the planted ``bug`` (None: correct); ``dtype``: compute in it."""

    def layernorm(x, g, b):
        mu = x.mean(-1, keepdims=True)
        std = np.sqrt(((x - mu) ** 2).mean(-1, keepdims=True) + EPS)
        xh = (x - mu) / std
        return g * xh + b, (xh, std, g)

    def layernorm_back(dy, cache):
        xh, std, g = cache
        dxh = dy * g
        dx = dxh - dxh.mean(-1, keepdims=True)
        if bug != "layernorm":
            dx = dx - xh * (dxh * xh).mean(-1, keepdims=True)
        axes = tuple(range(dy.ndim - 1))
        return dx / std, (dy * xh).sum(axes), dy.sum(axes)

    def gelu(x):
        t = np.tanh(C * (x + 0.044715 * x**3))
        return 0.5 * x * (1 + t), (x, t)

    def gelu_back(dy, cache):
        x, t = cache
        d = 0.5 * (1 + t)
        if bug != "gelu":
            d = d + 0.5 * x * (1 - t**2) * C * (1 + 3 * 0.044715 * x**2)
        return dy * d

    def split(x):  # [B,T,H] -> [B,A,T,d]
        B, T, _ = x.shape
        return x.reshape(B, T, A, H // A).transpose(0, 2, 1, 3)

    def merge(x):
        B, _, T, _ = x.shape
        return x.transpose(0, 2, 1, 3).reshape(B, T, H)

    def attention(x, p, pre, mask):
        q, k, v = (split(x @ p[pre + "w" + n] + p[pre + "b" + n]) for n in "qkv")
        scale = float(1.0 / np.sqrt(H // A))  # a Python float: float32 stays float32
        s = q @ k.transpose(0, 1, 3, 2) * scale + np.where(mask[:, None, None, :] > 0, 0.0,
                                                           -1e9).astype(x.dtype)
        e = np.exp(s - s.max(-1, keepdims=True))
        a = e / e.sum(-1, keepdims=True)
        ctx = merge(a @ v)
        return ctx @ p[pre + "wo"] + p[pre + "bo"], (x, q, k, v, a, ctx, scale)

    def attention_back(dout, cache, p, pre, g):
        x, q, k, v, a, ctx, scale = cache
        g[pre + "wo"] = np.einsum("bth,btk->hk", ctx, dout)
        g[pre + "bo"] = dout.sum((0, 1))
        dctx = split(dout @ p[pre + "wo"].T)
        da = dctx @ v.transpose(0, 1, 3, 2)
        dv = a.transpose(0, 1, 3, 2) @ dctx
        ds = a * (da - (da * a).sum(-1, keepdims=True))
        if bug != "attn_scale":
            ds = ds * scale
        dq, dk = ds @ k, ds.transpose(0, 1, 3, 2) @ q
        dx = 0
        for n, d in zip("qkv", (dq, dk, dv)):
            d = merge(d)
            g[pre + "w" + n] = np.einsum("bth,btk->hk", x, d)
            g[pre + "b" + n] = d.sum((0, 1))
            dx = dx + d @ p[pre + "w" + n].T
        return dx

    def loss_and_grads(params, input_ids, attention_mask, labels):
        p = {k: v.astype(dtype) for k, v in params.items()} if dtype is not None else params
        B, T = input_ids.shape
        x = p["tok_emb"][input_ids] + p["pos_emb"][:T]
        caches = []
        for i in range(LAYERS):
            pre = f"layers.{i}."
            att, c_att = attention(x, p, pre + "attn.", attention_mask)
            h, c_ln1 = layernorm(x + att, p[pre + "ln1.gamma"], p[pre + "ln1.beta"])
            z = h @ p[pre + "mlp.w1"] + p[pre + "mlp.b1"]
            u, c_gelu = gelu(z)
            f = u @ p[pre + "mlp.w2"] + p[pre + "mlp.b2"]
            x, c_ln2 = layernorm(h + f, p[pre + "ln2.gamma"], p[pre + "ln2.beta"])
            caches.append((c_att, c_ln1, h, u, c_gelu, c_ln2))
        logits = x @ p["head.w"] + p["head.b"]
        z = logits - logits.max(-1, keepdims=True)
        logp = z - np.log(np.exp(z).sum(-1, keepdims=True))
        valid = attention_mask > 0
        n = int(valid.sum())  # a Python int: float32 stays float32
        picked = np.take_along_axis(logp, labels[..., None], -1)[..., 0]
        loss = -(picked * valid).sum() / n
        # backward
        g = {}
        dlogits = np.exp(logp)
        np.put_along_axis(dlogits, labels[..., None],
                          np.take_along_axis(dlogits, labels[..., None], -1) - 1, -1)
        dlogits = dlogits * valid[..., None] / n
        g["head.w"] = np.einsum("bth,btv->hv", x, dlogits)
        g["head.b"] = dlogits[0].sum(0) if bug == "head_bias" else dlogits.sum((0, 1))
        dx = dlogits @ p["head.w"].T
        for i in reversed(range(LAYERS)):
            pre = f"layers.{i}."
            c_att, c_ln1, h, u, c_gelu, c_ln2 = caches[i]
            dhf, g[pre + "ln2.gamma"], g[pre + "ln2.beta"] = layernorm_back(dx, c_ln2)
            g[pre + "mlp.w2"] = np.einsum("btf,bth->fh", u, dhf)
            g[pre + "mlp.b2"] = dhf.sum((0, 1))
            dz = gelu_back(dhf @ p[pre + "mlp.w2"].T, c_gelu)
            g[pre + "mlp.w1"] = np.einsum("bth,btf->hf", h, dz)
            g[pre + "mlp.b1"] = dz.sum((0, 1))
            dh = dhf + dz @ p[pre + "mlp.w1"].T
            dxa, g[pre + "ln1.gamma"], g[pre + "ln1.beta"] = layernorm_back(dh, c_ln1)
            dx = dxa + attention_back(dxa, c_att, p, pre + "attn.", g)
        g["tok_emb"] = np.zeros_like(p["tok_emb"])
        np.add.at(g["tok_emb"], input_ids, dx)
        g["pos_emb"] = np.zeros_like(p["pos_emb"])
        g["pos_emb"][:T] = dx.sum(0)
        return loss, {k: g[k] for k in params}

    return loss_and_grads


loss_and_grads = make()
