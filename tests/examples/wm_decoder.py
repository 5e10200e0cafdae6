"""A small GPT-style NumPy decoder as ports write it: token and learned position embeddings
*and* RoPE (half split) on q and k, pre-RMSNorm blocks with one fused ``c_attn`` projection
and causal attention, a GELU MLP, no final norm, an untied head with a bias, next-token
cross-entropy; a ``forward(params, idx) -> (loss, cache)`` / ``backward(dloss, cache) ->
grads`` pair written by hand.  Judged by the ``whole_model`` row:
``whole_model(forward=forward, backward=backward, params=init_params())`` (``MODEL``).

``make(bug=...)`` plants one backward bug (tests/suite/test_whole_model.py): ``rope`` (the
backward turns the gradient the same way as the forward instead of back: a bug in RoPE's
backward alone), ``head_bias`` (the head's bias gradient from the last position alone),
``rmsnorm`` (the gain's gradient from x instead of x / rms), ``wpe`` (the position table's
gradient from the first sequence alone).
"""

from __future__ import annotations

import numpy as np

from minibert_spec.suite import whole_model

V, H, A, F, T_MAX, LAYERS = 13, 8, 2, 16, 8, 2
D = H // A
EPS = 1e-6
C = float(np.sqrt(2.0 / np.pi))


def init_params(seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    p = {"wte": rng.normal(0, 0.5, (V, H)), "wpe": rng.normal(0, 0.3, (T_MAX, H))}
    for i in range(LAYERS):
        b = f"h.{i}."
        p[b + "ln_1.g"] = np.ones(H)
        p[b + "attn.c_attn.w"], p[b + "attn.c_attn.b"] = rng.normal(0, 0.4, (H, 3 * H)), \
            np.zeros(3 * H)
        p[b + "attn.c_proj.w"], p[b + "attn.c_proj.b"] = rng.normal(0, 0.4, (H, H)), np.zeros(H)
        p[b + "ln_2.g"] = np.ones(H)
        p[b + "mlp.c_fc.w"], p[b + "mlp.c_fc.b"] = rng.normal(0, 0.4, (H, F)), np.zeros(F)
        p[b + "mlp.c_proj.w"], p[b + "mlp.c_proj.b"] = rng.normal(0, 0.4, (F, H)), np.zeros(H)
    p["lm_head.w"], p["lm_head.b"] = rng.normal(0, 0.4, (H, V)), np.zeros(V)
    return p


def rope_tables(T):
    inv = 10000.0 ** (-np.arange(0, D, 2) / D)
    ang = np.arange(T)[:, None] * inv[None, :]  # [T, D/2]
    return np.concatenate([np.cos(ang)] * 2, -1), np.concatenate([np.sin(ang)] * 2, -1)


def rotate_half(x):
    x1, x2 = x[..., :D // 2], x[..., D // 2:]
    return np.concatenate([-x2, x1], -1)


def rotate_half_t(x):  # the transpose of rotate_half
    x1, x2 = x[..., :D // 2], x[..., D // 2:]
    return np.concatenate([x2, -x1], -1)


def make(bug: str | None = None):
    """(forward, backward) with the planted ``bug`` (None: correct)."""

    def rope(x, cos, sin):
        return x * cos + rotate_half(x) * sin

    def rope_back(dy, cos, sin):
        if bug == "rope":
            return dy * cos + rotate_half(dy * sin)
        return dy * cos + rotate_half_t(dy * sin)

    def rmsnorm(x, g):
        r = np.sqrt((x * x).mean(-1, keepdims=True) + EPS)
        return g * x / r, (x, r, g)

    def rmsnorm_back(dy, cache):
        x, r, g = cache
        xn = x / r
        dxn = dy * g
        dx = (dxn - xn * (dxn * xn).mean(-1, keepdims=True)) / r
        dg = (dy * (x if bug == "rmsnorm" else xn)).sum((0, 1))
        return dx, dg

    def forward(params, idx):
        p = params
        B, T = idx.shape
        cos, sin = rope_tables(T)
        causal = np.triu(np.full((T, T), -1e9), 1)
        x = p["wte"][idx] + p["wpe"][:T]
        caches = []
        for i in range(LAYERS):
            b = f"h.{i}."
            n1, c1 = rmsnorm(x, p[b + "ln_1.g"])
            qkv = n1 @ p[b + "attn.c_attn.w"] + p[b + "attn.c_attn.b"]
            q, k, v = (t.reshape(B, T, A, D).transpose(0, 2, 1, 3)
                       for t in np.split(qkv, 3, -1))
            qr, kr = rope(q, cos, sin), rope(k, cos, sin)
            s = qr @ kr.transpose(0, 1, 3, 2) / np.sqrt(D) + causal
            e = np.exp(s - s.max(-1, keepdims=True))
            a = e / e.sum(-1, keepdims=True)
            ctx = (a @ v).transpose(0, 2, 1, 3).reshape(B, T, H)
            x = x + ctx @ p[b + "attn.c_proj.w"] + p[b + "attn.c_proj.b"]
            n2, c2 = rmsnorm(x, p[b + "ln_2.g"])
            z = n2 @ p[b + "mlp.c_fc.w"] + p[b + "mlp.c_fc.b"]
            t = np.tanh(C * (z + 0.044715 * z**3))
            u = 0.5 * z * (1 + t)
            x = x + u @ p[b + "mlp.c_proj.w"] + p[b + "mlp.c_proj.b"]
            caches.append((c1, n1, q, k, v, qr, kr, a, ctx, c2, n2, z, t, u))
        logits = x @ p["lm_head.w"] + p["lm_head.b"]
        zl = logits[:, :-1] - logits[:, :-1].max(-1, keepdims=True)
        logp = zl - np.log(np.exp(zl).sum(-1, keepdims=True))
        targets = idx[:, 1:]
        loss = -np.take_along_axis(logp, targets[..., None], -1).mean()
        return loss, (p, idx, x, logp, caches, cos, sin)

    def backward(dloss, cache):
        p, idx, x, logp, caches, cos, sin = cache
        B, T = idx.shape
        g = {}
        dl = np.exp(logp)
        np.put_along_axis(dl, idx[:, 1:, None],
                          np.take_along_axis(dl, idx[:, 1:, None], -1) - 1, -1)
        dlogits = np.zeros((B, T, V))
        dlogits[:, :-1] = dl * dloss / (B * (T - 1))
        g["lm_head.w"] = np.einsum("bth,btv->hv", x, dlogits)
        g["lm_head.b"] = dlogits[:, -2].sum(0) if bug == "head_bias" else dlogits.sum((0, 1))
        dx = dlogits @ p["lm_head.w"].T
        for i in reversed(range(LAYERS)):
            b = f"h.{i}."
            c1, n1, q, k, v, qr, kr, a, ctx, c2, n2, z, t, u = caches[i]
            g[b + "mlp.c_proj.w"] = np.einsum("btf,bth->fh", u, dx)
            g[b + "mlp.c_proj.b"] = dx.sum((0, 1))
            du = dx @ p[b + "mlp.c_proj.w"].T
            dz = du * (0.5 * (1 + t) + 0.5 * z * (1 - t**2) * C * (1 + 3 * 0.044715 * z**2))
            g[b + "mlp.c_fc.w"] = np.einsum("bth,btf->hf", n2, dz)
            g[b + "mlp.c_fc.b"] = dz.sum((0, 1))
            dn2, g[b + "ln_2.g"] = rmsnorm_back(dz @ p[b + "mlp.c_fc.w"].T, c2)
            dx = dx + dn2
            g[b + "attn.c_proj.w"] = np.einsum("bth,btk->hk", ctx, dx)
            g[b + "attn.c_proj.b"] = dx.sum((0, 1))
            dctx = (dx @ p[b + "attn.c_proj.w"].T).reshape(B, T, A, D).transpose(0, 2, 1, 3)
            da = dctx @ v.transpose(0, 1, 3, 2)
            dv = a.transpose(0, 1, 3, 2) @ dctx
            ds = a * (da - (da * a).sum(-1, keepdims=True)) / np.sqrt(D)
            dq = rope_back(ds @ kr, cos, sin)
            dk = rope_back(ds.transpose(0, 1, 3, 2) @ qr, cos, sin)
            dqkv = np.concatenate([d.transpose(0, 2, 1, 3).reshape(B, T, H)
                                   for d in (dq, dk, dv)], -1)
            g[b + "attn.c_attn.w"] = np.einsum("bth,btk->hk", n1, dqkv)
            g[b + "attn.c_attn.b"] = dqkv.sum((0, 1))
            dn1, g[b + "ln_1.g"] = rmsnorm_back(dqkv @ p[b + "attn.c_attn.w"].T, c1)
            dx = dx + dn1
        g["wte"] = np.zeros_like(p["wte"])
        np.add.at(g["wte"], idx, dx)
        g["wpe"] = np.zeros_like(p["wpe"])
        g["wpe"][:T] = dx[0] if bug == "wpe" else dx.sum(0)
        return {k: g[k] for k in p}

    return forward, backward


forward, backward = make()
MODEL = whole_model(forward=forward, backward=backward, params=init_params())
# the RoPE backward bug alone, for the command line (minibert check ...:MODEL_ROPE_BUG --model)
_rope_forward, _rope_backward = make("rope")
MODEL_ROPE_BUG = whole_model(forward=_rope_forward, backward=_rope_backward, params=init_params())
