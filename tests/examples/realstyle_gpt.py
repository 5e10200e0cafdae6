"""A GPT-style NumPy decoder as small ports write it (its own weight names, one class with a
hand-written backward; GPT-2's pre-LN blocks with gelu_new, or LLaMA's RMSNorm / RoPE (half
split) / SwiGLU), judged as the suite's ``decoder`` row through the thin adapter at the end.

``BUGS`` switches on one realistic bug each (tests/suite/test_decoder_examples.py):
``causal`` (the mask hides the past instead of the future), ``final_ln`` (the final norm's
Jacobian skipped on the way back), ``tied`` (the tied table's gradient overwritten by the
head's share: counted once), ``rope_sign`` (RoPE turns the other way, forward and backward
consistently: only the oracle sees it), ``rope_base`` (the blocks' RoPE at the default base
10000 whatever the config's ``rope_base``: only a case off that default sees it).
"""

from __future__ import annotations

import os

import numpy as np

from minibert_spec.suite.adapters import decoder

# e.g. MINIBERT_EXAMPLE_BUGS=tied minibert check tests.examples.realstyle_gpt --ops decoder
BUGS: set = set(filter(None, os.environ.get("MINIBERT_EXAMPLE_BUGS", "").split(",")))
C_GELU = float(np.sqrt(2.0 / np.pi))


class Norm:
    """LayerNorm (g, b) or, without b, RMSNorm (g only), over the last axis."""

    def __init__(self, g, b, eps):
        self.g, self.b, self.eps = g, b, eps

    def forward(self, x):
        xc = x - x.mean(-1, keepdims=True) if self.b is not None else x
        self.rstd = 1.0 / np.sqrt((xc * xc).mean(-1, keepdims=True) + self.eps)
        self.xh = xc * self.rstd
        return self.xh * self.g + (self.b if self.b is not None else 0)

    def backward(self, dy):
        H = dy.shape[-1]
        self.dg = (dy * self.xh).reshape(-1, H).sum(0)
        self.db = dy.reshape(-1, H).sum(0) if self.b is not None else None
        dxh = dy * self.g
        centre = dxh.mean(-1, keepdims=True) if self.b is not None else 0
        return self.rstd * (dxh - centre - self.xh * (dxh * self.xh).mean(-1, keepdims=True))


def rotate_half(x):
    d = x.shape[-1] // 2
    return np.concatenate([-x[..., d:], x[..., :d]], axis=-1)


class Attention:
    def __init__(self, w, n_head, rope_base=None):
        self.w, self.A, self.rope_base = w, n_head, rope_base

    def _lin(self, x, n):
        return x @ self.w[f"{n}.w"] + (self.w[f"{n}.b"] if f"{n}.b" in self.w else 0)

    def _rope(self, T, d, dtype):
        base = 10000.0 if "rope_base" in BUGS else self.rope_base
        inv = base ** (-np.arange(0, d, 2) / d)
        ang = np.arange(T)[:, None] * inv[None]
        ang = np.concatenate([ang, ang], -1)
        s = -1.0 if "rope_sign" in BUGS else 1.0
        return np.cos(ang).astype(dtype), (s * np.sin(ang)).astype(dtype)

    def forward(self, x):
        B, T, H = x.shape
        d = H // self.A
        self.x = x
        q, k, v = (self._lin(x, n).reshape(B, T, self.A, d).transpose(0, 2, 1, 3)
                   for n in "qkv")
        if self.rope_base is not None:
            self.cos, self.sin = self._rope(T, d, x.dtype)
            q = q * self.cos + rotate_half(q) * self.sin
            k = k * self.cos + rotate_half(k) * self.sin
        self.q, self.k, self.v, self.scale = q, k, v, 1.0 / float(np.sqrt(d))
        s = q @ k.transpose(0, 1, 3, 2) * self.scale
        keep = np.triu(np.ones((T, T), bool)) if "causal" in BUGS else np.tril(np.ones((T, T),
                                                                                    bool))
        s = np.where(keep, s, -np.inf)
        e = np.exp(s - s.max(-1, keepdims=True))
        self.p = e / e.sum(-1, keepdims=True)
        self.ctx = (self.p @ v).transpose(0, 2, 1, 3).reshape(B, T, H)
        return self._lin(self.ctx, "o")

    def backward(self, dy):
        B, T, H = dy.shape
        d = H // self.A
        g = {}
        g["o.w"], g["o.b"] = self.ctx.reshape(-1, H).T @ dy.reshape(-1, H), dy.sum((0, 1))
        dctx = (dy @ self.w["o.w"].T).reshape(B, T, self.A, d).transpose(0, 2, 1, 3)
        dp = dctx @ self.v.transpose(0, 1, 3, 2)
        dv = self.p.transpose(0, 1, 3, 2) @ dctx
        ds = self.p * (dp - (dp * self.p).sum(-1, keepdims=True)) * self.scale
        dq, dk = ds @ self.k, ds.transpose(0, 1, 3, 2) @ self.q
        if self.rope_base is not None:  # the transpose of the rotation
            dq = dq * self.cos - rotate_half(dq * self.sin)
            dk = dk * self.cos - rotate_half(dk * self.sin)
        dx = 0
        for n, dt in zip("qkv", (dq, dk, dv)):
            dt = dt.transpose(0, 2, 1, 3).reshape(B, T, H)
            g[f"{n}.w"], g[f"{n}.b"] = self.x.reshape(-1, H).T @ dt.reshape(-1, H), dt.sum((0, 1))
            dx = dx + dt @ self.w[f"{n}.w"].T
        self.grads = {n: v for n, v in g.items() if n in self.w}
        return dx


class MLP:
    """GPT-2's fc -> gelu_new -> proj, or LLaMA's down(silu(gate) * up)."""

    def __init__(self, w):
        self.w = w

    def _lin(self, x, n):
        return x @ self.w[f"{n}.w"] + (self.w[f"{n}.b"] if f"{n}.b" in self.w else 0)

    def forward(self, x):
        self.x = x
        if "gate.w" in self.w:
            self.g, self.u = self._lin(x, "gate"), self._lin(x, "up")
            self.sg = 1.0 / (1.0 + np.exp(-self.g))
            self.a = self.g * self.sg * self.u
            return self._lin(self.a, "down")
        self.h = self._lin(x, "fc")
        self.t = np.tanh(C_GELU * (self.h + 0.044715 * self.h ** 3))
        self.a = 0.5 * self.h * (1.0 + self.t)
        return self._lin(self.a, "proj")

    def _lin_back(self, dy, x, n, g):
        g[f"{n}.w"] = x.reshape(-1, x.shape[-1]).T @ dy.reshape(-1, dy.shape[-1])
        g[f"{n}.b"] = dy.sum((0, 1))
        return dy @ self.w[f"{n}.w"].T

    def backward(self, dy):
        g = {}
        if "gate.w" in self.w:
            da = self._lin_back(dy, self.a, "down", g)
            du = da * self.g * self.sg
            dg = da * self.u * self.sg * (1.0 + self.g * (1.0 - self.sg))
            dx = self._lin_back(dg, self.x, "gate", g) + self._lin_back(du, self.x, "up", g)
        else:
            da = self._lin_back(dy, self.a, "proj", g)
            dt = C_GELU * (1.0 + 3 * 0.044715 * self.h ** 2)
            dh = da * (0.5 * (1.0 + self.t) + 0.5 * self.h * (1.0 - self.t ** 2) * dt)
            dx = self._lin_back(dh, self.x, "fc", g)
        self.grads = {n: v for n, v in g.items() if n in self.w}
        return dx


class MiniGPT:
    """``weights``: wte [V, H], wpe [T_max, H] (learned positions), h.{i}.ln_1.g/b,
    h.{i}.attn.{q,k,v,o}.w [in, out] / .b, h.{i}.ln_2.g/b, h.{i}.mlp.{fc,proj} or
    {gate,up,down}, ln_f.g/b, lm_head [V, H] (untied); a missing .b: no bias (no LN beta:
    RMSNorm)."""

    def __init__(self, weights, n_layer, n_head, eps, rope_base=None, tied=True):
        self.w, self.L, self.tied = weights, n_layer, tied

        def sub(prefix):
            return {k[len(prefix):]: v for k, v in weights.items() if k.startswith(prefix)}

        self.layers = [(Norm(weights[f"h.{i}.ln_1.g"], weights.get(f"h.{i}.ln_1.b"), eps),
                        Attention(sub(f"h.{i}.attn."), n_head, rope_base),
                        Norm(weights[f"h.{i}.ln_2.g"], weights.get(f"h.{i}.ln_2.b"), eps),
                        MLP(sub(f"h.{i}.mlp."))) for i in range(n_layer)]
        self.ln_f = Norm(weights["ln_f.g"], weights.get("ln_f.b"), eps)

    def head(self):
        return self.w["wte"] if self.tied else self.w["lm_head"]

    def forward(self, ids):
        self.ids = ids
        x = self.w["wte"][ids]
        if "wpe" in self.w:
            x = x + self.w["wpe"][:ids.shape[1]]
        for ln1, attn, ln2, mlp in self.layers:
            x = x + attn.forward(ln1.forward(x))
            x = x + mlp.forward(ln2.forward(x))
        self.hf = self.ln_f.forward(x)
        return self.hf @ self.head().T

    def loss(self, ids, labels, ignore_index=-100):
        logits = self.forward(ids)
        z = logits[:, :-1] - logits[:, :-1].max(-1, keepdims=True)
        logp = z - np.log(np.exp(z).sum(-1, keepdims=True))
        target = labels[:, 1:]
        keep = target != ignore_index
        n = int(keep.sum())
        idx = np.where(keep, target, 0)[..., None]
        picked = np.take_along_axis(logp, idx, -1)[..., 0]
        p = np.exp(logp)
        np.put_along_axis(p, idx, np.take_along_axis(p, idx, -1) - 1, -1)
        self.dlogits = np.zeros_like(logits)
        self.dlogits[:, :-1] = p * keep[..., None] / n
        return -(picked * keep).sum() / n

    def backward(self, dlogits):
        H = self.hf.shape[-1]
        g = {"lm_head": dlogits.reshape(-1, dlogits.shape[-1]).T @ self.hf.reshape(-1, H)}
        dhf = dlogits @ self.head()
        dx = self.ln_f.backward(dhf)
        if "final_ln" in BUGS:  # the final norm's Jacobian skipped
            dx = dhf
        g["ln_f.g"], g["ln_f.b"] = self.ln_f.dg, self.ln_f.db
        for i in reversed(range(self.L)):
            ln1, attn, ln2, mlp = self.layers[i]
            dx = dx + ln2.backward(mlp.backward(dx))
            dx = dx + ln1.backward(attn.backward(dx))
            g.update({f"h.{i}.attn.{k}": v for k, v in attn.grads.items()})
            g.update({f"h.{i}.mlp.{k}": v for k, v in mlp.grads.items()})
            for name, ln in (("ln_1", ln1), ("ln_2", ln2)):
                g[f"h.{i}.{name}.g"], g[f"h.{i}.{name}.b"] = ln.dg, ln.db
        if "wpe" in self.w:
            g["wpe"] = np.zeros_like(self.w["wpe"])
            g["wpe"][:dx.shape[1]] = dx.sum(0)
        g["wte"] = np.zeros_like(self.w["wte"])
        np.add.at(g["wte"], self.ids, dx)
        if self.tied:  # one table, two uses
            g["wte"] = g["lm_head"] if "tied" in BUGS else g["wte"] + g["lm_head"]
        return {k: v for k, v in g.items() if k in self.w}


# ----------------------------------------------------------------------------- the adapter
CAPABILITIES = {"decoder": {"tied": (True, False)}, "ffn": {"activation": ("gelu_tanh",)},
                "block": {"normalization": ("layernorm", "rmsnorm"), "ffn": ("mlp", "swiglu")},
                "attention": {"rope": (None, "half")}}
TOP = {"embeddings.token.W": "wte", "embeddings.position.W": "wpe", "final_ln.gamma": "ln_f.g",
       "final_ln.beta": "ln_f.b", "lm_head.W": "lm_head"}
LAYER = {**{f"attn.{w}_{n}": f"attn.{n}.{w.lower()}" for w in "Wb" for n in "qkvo"},
         **{f"ln{i}.{a}": f"ln_{i}.{a[0]}" for i in (1, 2) for a in ("gamma", "beta")},
         **{f"{part}.{w}_{i}": f"mlp.{n}.{w.lower()}" for w in "Wb" for part, names in
            (("ffn", {1: "fc", 2: "proj"}), ("swiglu", {1: "gate", 2: "down", 3: "up"}))
            for i, n in names.items()}}


def _forward(params, config, input_ids):  # the model of the config, on our names
    rope = config.rope_base if config.position == "rope" else None
    model = MiniGPT(params, config.n_layers, config.n_heads, config.ln_eps, rope,
                    config.tie_embeddings)
    return model.forward(input_ids), model


decoder_forward, decoder_backward, decoder_loss_and_grads = decoder(
    _forward, lambda dlogits, model: model.backward(dlogits),
    names={**TOP, **{k: f"h.{{i}}.{v}" for k, v in LAYER.items()}},
    loss=lambda cache, input_ids, labels, ignore_index: (
        cache.loss(input_ids, labels, ignore_index), cache.dlogits))
