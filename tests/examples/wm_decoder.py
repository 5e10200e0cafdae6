"""A small GPT-style NumPy decoder as ports write it: token and learned position embeddings
*and* RoPE (half split) on q and k, pre-RMSNorm blocks with one fused ``c_attn`` projection
and causal attention, a GELU MLP, no final norm, an untied head with a bias, next-token
cross-entropy; a ``forward(params, idx) -> (loss, cache)`` / ``backward(dloss, cache) ->
grads`` pair written by hand.  Judged by the ``whole_model`` row:
``whole_model(forward=forward, backward=backward, params=init_params())`` (``MODEL``).

The same model is also the protocol's decoder row in its learned + RoPE form (``DECODER``:
``decoder_forward`` / ``decoder_backward`` / ``decoder_loss_and_grads`` through the name map of
``minibert_spec.suite.adapters.decoder`` at the end, its form declared;
tests/suite/test_decoder_forms.py).

Its attention is also an op pair of the protocol (``attention_forward`` /
``attention_backward``: causal, RoPE half split, biases; ``ATTENTION``, declared), as code
that factors its layers out has it: the op rows then localise what the model-level row sees.

``make(bug=...)`` plants one backward bug (tests/suite/test_whole_model.py): ``rope`` (the
backward turns the gradient the same way as the forward instead of back: a bug in RoPE's
backward alone; ``make_attention("rope")`` is the op pair with it), ``head_bias`` (the head's
bias gradient from the last position alone), ``rmsnorm`` (the gain's gradient from x instead
of x / rms), ``wpe`` (the position table's gradient from the first sequence alone);
``decoder_ops(bug)`` is the decoder row's adapter of the same model.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from minibert_spec.suite import whole_model
from minibert_spec.suite.adapters import decoder

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


def rope_tables(T, d=D, base=10000.0):
    inv = base ** (-np.arange(0, d, 2) / d)
    ang = np.arange(T)[:, None] * inv[None, :]  # [T, d/2]
    return np.concatenate([np.cos(ang)] * 2, -1), np.concatenate([np.sin(ang)] * 2, -1)


def rotate_half(x):
    x1, x2 = np.split(x, 2, -1)
    return np.concatenate([-x2, x1], -1)


def rotate_half_t(x):  # the transpose of rotate_half
    x1, x2 = np.split(x, 2, -1)
    return np.concatenate([x2, -x1], -1)


def make_attention(bug: str | None = None):
    """(attention_forward, attention_backward): one causal attention with RoPE (half split) on
    q and k, as the protocol calls it; ``bug`` "rope": RoPE's backward turns the wrong way."""

    def turn(x, cos, sin):  # RoPE
        return x * cos + rotate_half(x) * sin

    def turn_back(dy, cos, sin):  # its transpose
        if bug == "rope":
            return dy * cos + rotate_half(dy * sin)
        return dy * cos + rotate_half_t(dy * sin)

    def attention_forward(x, W_q, W_k, W_v, W_o, b_q, b_k, b_v, b_o, *, n_heads, mask=None,
                          causal=True, rope="half", rope_base=10000.0):
        if mask is not None or not causal or rope != "half":
            raise ValueError(f"causal RoPE (half) without a key mask only, got mask={mask}, "
                             f"causal={causal}, rope={rope}")
        B, T, H = x.shape
        d = H // n_heads
        cos, sin = (t.astype(x.dtype) for t in rope_tables(T, d, rope_base))  # float32 stays

        def heads(t):
            return t.reshape(B, T, n_heads, d).transpose(0, 2, 1, 3)

        q, k, v = heads(x @ W_q + b_q), heads(x @ W_k + b_k), heads(x @ W_v + b_v)
        qr, kr = turn(q, cos, sin), turn(k, cos, sin)
        s = qr @ kr.transpose(0, 1, 3, 2) / d**0.5 + np.triu(np.full((T, T), -1e9, x.dtype), 1)
        e = np.exp(s - s.max(-1, keepdims=True))
        a = e / e.sum(-1, keepdims=True)
        ctx = (a @ v).transpose(0, 2, 1, 3).reshape(B, T, H)
        return ctx @ W_o + b_o, (x, W_q, W_k, W_v, W_o, v, qr, kr, a, ctx, cos, sin)

    def attention_backward(dy, cache):
        x, W_q, W_k, W_v, W_o, v, qr, kr, a, ctx, cos, sin = cache
        B, A, T, d = v.shape
        dctx = (dy @ W_o.T).reshape(B, T, A, d).transpose(0, 2, 1, 3)
        da = dctx @ v.transpose(0, 1, 3, 2)
        dv = a.transpose(0, 1, 3, 2) @ dctx
        ds = a * (da - (da * a).sum(-1, keepdims=True)) / d**0.5
        dq = turn_back(ds @ kr, cos, sin)
        dk = turn_back(ds.transpose(0, 1, 3, 2) @ qr, cos, sin)
        dq, dk, dv = (t.transpose(0, 2, 1, 3).reshape(B, T, A * d) for t in (dq, dk, dv))
        dx = dq @ W_q.T + dk @ W_k.T + dv @ W_v.T
        dW = [np.einsum("bth,btk->hk", i, g) for i, g in ((x, dq), (x, dk), (x, dv), (ctx, dy))]
        return (dx, *dW, *(g.sum((0, 1)) for g in (dq, dk, dv, dy)))

    return attention_forward, attention_backward


def make(bug: str | None = None, *, n_heads: int = A, rope_base: float = 10000.0):
    """(forward, backward) with the planted ``bug`` (None: correct); ``forward.logits`` /
    ``backward.logits`` are the same model from the ids to the logits (the loss left out)."""
    attention_forward, attention_backward = make_attention("rope" if bug == "rope" else None)

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

    def logits_forward(params, idx):
        p = params
        B, T = idx.shape
        x = p["wte"][idx] + p["wpe"][:T]
        caches = []
        for i in range(_layers(p)):
            b = f"h.{i}."
            n1, c1 = rmsnorm(x, p[b + "ln_1.g"])
            # the fused c_attn's column blocks are W_q, W_k, W_v (and its bias's)
            y, ca = attention_forward(
                n1, *np.split(p[b + "attn.c_attn.w"], 3, -1), p[b + "attn.c_proj.w"],
                *np.split(p[b + "attn.c_attn.b"], 3, -1), p[b + "attn.c_proj.b"],
                n_heads=n_heads, rope_base=rope_base)
            x = x + y
            n2, c2 = rmsnorm(x, p[b + "ln_2.g"])
            z = n2 @ p[b + "mlp.c_fc.w"] + p[b + "mlp.c_fc.b"]
            t = np.tanh(C * (z + 0.044715 * z**3))
            u = 0.5 * z * (1 + t)
            x = x + u @ p[b + "mlp.c_proj.w"] + p[b + "mlp.c_proj.b"]
            caches.append((c1, ca, c2, n2, z, t, u, idx))
        logits = x @ p["lm_head.w"] + p["lm_head.b"]
        return logits, (p, x, caches)

    def forward(params, idx):
        logits, cache = logits_forward(params, idx)
        loss, dloss_dlogits = next_token_loss(logits, idx)
        return loss, (cache, dloss_dlogits)

    def backward(dloss, cache):
        cache, dloss_dlogits = cache
        return logits_backward(dloss_dlogits(dloss), cache)

    def logits_backward(dlogits, cache):
        p, x, caches = cache
        T = x.shape[1]
        g = {}
        g["lm_head.w"] = np.einsum("bth,btv->hv", x, dlogits)
        g["lm_head.b"] = dlogits[:, -2].sum(0) if bug == "head_bias" else dlogits.sum((0, 1))
        dx = dlogits @ p["lm_head.w"].T
        for i in reversed(range(len(caches))):
            b = f"h.{i}."
            c1, ca, c2, n2, z, t, u, _ = caches[i]
            g[b + "mlp.c_proj.w"] = np.einsum("btf,bth->fh", u, dx)
            g[b + "mlp.c_proj.b"] = dx.sum((0, 1))
            du = dx @ p[b + "mlp.c_proj.w"].T
            dz = du * (0.5 * (1 + t) + 0.5 * z * (1 - t**2) * C * (1 + 3 * 0.044715 * z**2))
            g[b + "mlp.c_fc.w"] = np.einsum("bth,btf->hf", n2, dz)
            g[b + "mlp.c_fc.b"] = dz.sum((0, 1))
            dn2, g[b + "ln_2.g"] = rmsnorm_back(dz @ p[b + "mlp.c_fc.w"].T, c2)
            dx = dx + dn2
            dn1, dW_q, dW_k, dW_v, dW_o, db_q, db_k, db_v, db_o = attention_backward(dx, ca)
            g[b + "attn.c_attn.w"] = np.concatenate([dW_q, dW_k, dW_v], -1)
            g[b + "attn.c_attn.b"] = np.concatenate([db_q, db_k, db_v])
            g[b + "attn.c_proj.w"], g[b + "attn.c_proj.b"] = dW_o, db_o
            dn1, g[b + "ln_1.g"] = rmsnorm_back(dn1, c1)
            dx = dx + dn1
        g["wte"] = np.zeros_like(p["wte"])
        np.add.at(g["wte"], caches[0][-1], dx)
        g["wpe"] = np.zeros_like(p["wpe"])
        g["wpe"][:T] = dx[0] if bug == "wpe" else dx.sum(0)
        return {k: g[k] for k in p}

    forward.logits, backward.logits = logits_forward, logits_backward
    return forward, backward


def _layers(p) -> int:
    return sum(k.endswith("ln_1.g") for k in p)


def next_token_loss(logits, labels, ignore_index: int = -100):
    """Mean cross-entropy of logits[:, t] against labels[:, t + 1] over the labels that are not
    ``ignore_index``; returns (loss, dloss -> dlogits), in the logits' dtype."""
    B, T, V = logits.shape
    targets = labels[:, 1:]
    keep = targets != ignore_index
    safe = np.where(keep, targets, 0)[..., None]
    zl = logits[:, :-1] - logits[:, :-1].max(-1, keepdims=True)
    logp = zl - np.log(np.exp(zl).sum(-1, keepdims=True))
    n = logits.dtype.type(keep.sum())  # float32 stays float32
    loss = -(np.take_along_axis(logp, safe, -1)[..., 0] * keep).sum() / n

    def dlogits(dloss):
        dl = np.exp(logp)
        np.put_along_axis(dl, safe, np.take_along_axis(dl, safe, -1) - 1, -1)
        out = np.zeros_like(logits)
        out[:, :-1] = dl * keep[..., None] * (dloss / n)
        return out

    return loss, dlogits


forward, backward = make()
MODEL = whole_model(forward=forward, backward=backward, params=init_params())


def attention_ops(bug: str | None = None) -> SimpleNamespace:
    """The model's attention as the protocol's op pair, declared (checked by the op rows
    attention_causal_rope_half: ``minibert check tests.examples.wm_decoder:ATTENTION``)."""
    forward, backward = make_attention(bug)
    return SimpleNamespace(attention_forward=forward, attention_backward=backward,
                           CAPABILITIES={"attention_bias": True, "key_mask": False,
                                         "attention": {"causal": (True,), "rope": ("half",)}})


ATTENTION = attention_ops()
ATTENTION_ROPE_BUG = attention_ops("rope")
# the RoPE backward bug alone, for the command line (minibert check ...:MODEL_ROPE_BUG --model)
_rope_forward, _rope_backward = make("rope")
MODEL_ROPE_BUG = whole_model(forward=_rope_forward, backward=_rope_backward, params=init_params())


# ------------------------------------------------------------------ the decoder row's adapter
# The same model as the protocol's decoder row takes it (``minibert check
# tests.examples.wm_decoder:DECODER --ops decoder``): the protocol's parameter names to ours
# (c_attn holds W_q | W_k | W_v side by side, lm_head.w is [H, V]), the sizes and the RoPE base
# from the config, the form declared (learned + RoPE positions, no final norm, a biased head).
NAMES = {"embeddings.token.W": "wte", "embeddings.position.W": "wpe", "lm_head.W": "lm_head.w",
         "lm_head.b": "lm_head.b", "ln1.gamma": "h.{i}.ln_1.g", "ln2.gamma": "h.{i}.ln_2.g",
         "attn.W_o": "h.{i}.attn.c_proj.w", "attn.b_o": "h.{i}.attn.c_proj.b",
         "ffn.W_1": "h.{i}.mlp.c_fc.w", "ffn.b_1": "h.{i}.mlp.c_fc.b",
         "ffn.W_2": "h.{i}.mlp.c_proj.w", "ffn.b_2": "h.{i}.mlp.c_proj.b"}
FUSED = {f"h.{{i}}.attn.c_attn.{w.lower()}": tuple(f"attn.{w}_{q}" for q in "qkv") for w in "Wb"}


def decoder_ops(bug: str | None = None) -> SimpleNamespace:
    """The protocol's decoder_forward / decoder_backward / decoder_loss_and_grads of the model
    with the planted ``bug``, and its declaration."""

    def logits_forward(params, config, input_ids):  # a model of the config's sizes
        forward, backward = make(bug, n_heads=config.n_heads, rope_base=config.rope_base)
        logits, cache = forward.logits(params, input_ids)
        return logits, (backward, cache)

    return decoder(
        logits_forward, lambda dlogits, cache: cache[0].logits(dlogits, cache[1]), names=NAMES,
        fused=FUSED, transposed=("lm_head.w",), loss=next_token_loss,
        capabilities={"decoder": {"position": "learned_rope", "final_norm": False,
                                  "head_bias": True, "tied": False},
                      "block": {"normalization": "rmsnorm"}, "attention": {"rope": "half"},
                      "ffn": {"activation": "gelu_tanh"}, "key_mask": False})


DECODER = decoder_ops()
