"""A LLaMA block written by hand (pre-norm RMSNorms, causal attention with RoPE on queries and
keys in Hugging Face's half-split pairs, a bias-free SwiGLU): the reference's RMSNorm and
attention pairs, its own SwiGLU pair and the residual wiring forward and backward.
``CAPABILITIES`` declares that form alone (block.norm "pre", causal, RMSNorm, block.ffn
"swiglu", attention.rope "half"): the block's ``p`` has ``swiglu.W_1`` (gate), ``swiglu.W_3``
(up), ``swiglu.W_2`` (down) and no ``ffn.*``.

``build(bug)``: None is the correct block (``correct``); ``"silu"`` plants the SwiGLU backward
whose gate derivative is sigmoid(g) alone (SiLU's ``g s (1 - s)`` term dropped: ``buggy``).
tests/suite/test_llama_block.py checks both."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from minibert_reference import ops as R

ATTN = ("W_q", "W_k", "W_v", "W_o", "b_q", "b_k", "b_v", "b_o")
CAPABILITIES = {"block": {"norm": "pre", "causal": True, "normalization": "rmsnorm",
                          "ffn": "swiglu"},
                "attention": {"causal": True, "rope": "half"}}


def swiglu(x, W_1, W_2, W_3):
    g, u = x @ W_1, x @ W_3
    s = 1.0 / (1.0 + np.exp(-g))
    return (g * s * u) @ W_2, (x, g, u, s, W_1, W_2, W_3)


def swiglu_backward(dy, cache, bug=None):
    x, g, u, s, W_1, W_2, W_3 = cache
    silu = g * s
    dh = dy @ W_2.T
    dsilu = s if bug == "silu" else s * (1.0 + g * (1.0 - s))
    dg, du = dh * u * dsilu, dh * silu
    flat = x.reshape(-1, x.shape[-1])
    dW_1 = flat.T @ dg.reshape(-1, dg.shape[-1])
    dW_3 = flat.T @ du.reshape(-1, du.shape[-1])
    dW_2 = (silu * u).reshape(-1, u.shape[-1]).T @ dy.reshape(-1, dy.shape[-1])
    return dg @ W_1.T + du @ W_3.T, {"swiglu.W_1": dW_1, "swiglu.W_2": dW_2,
                                     "swiglu.W_3": dW_3}


def build(bug: str | None = None) -> SimpleNamespace:
    def block_forward(x, p, *, n_heads, mask=None, eps=1e-6, rope_base=10000.0, **form):
        # ``form``: the keywords the suite passes for this declared form (norm, causal,
        # normalization, ffn, rope): the block has that form alone
        n1, c_n1 = R.rmsnorm_forward(x, p["ln1.gamma"], eps)
        a, c_attn = R.attention_forward(n1, *(p.get(f"attn.{n}") for n in ATTN),
                                        n_heads=n_heads, mask=mask, causal=True, rope="half",
                                        rope_base=rope_base)
        h = x + a
        n2, c_n2 = R.rmsnorm_forward(h, p["ln2.gamma"], eps)
        f, c_mlp = swiglu(n2, p["swiglu.W_1"], p["swiglu.W_2"], p["swiglu.W_3"])
        return h + f, (c_n1, c_attn, c_n2, c_mlp, tuple(p))

    def block_backward(dout, cache):
        c_n1, c_attn, c_n2, c_mlp, names = cache
        dn2, grads = swiglu_backward(dout, c_mlp, bug)
        dr2, grads["ln2.gamma"] = R.rmsnorm_backward(dn2, c_n2)
        dh = dout + dr2
        dn1, *dattn = R.attention_backward(dh, c_attn)
        dr1, grads["ln1.gamma"] = R.rmsnorm_backward(dn1, c_n1)
        grads.update({f"attn.{n}": g for n, g in zip(ATTN, dattn)})
        return dh + dr1, {n: grads[n] for n in names}

    # ------------------------------------------------------------------------- the adapter
    return SimpleNamespace(CAPABILITIES=CAPABILITIES, block_forward=block_forward,
                           block_backward=block_backward)


# ---------------------------------------- the correct and the buggy build (for the tests)
correct = build()
buggy = build("silu")
