"""A post-LN encoder block whose LayerNorms have no gamma and no beta (``(x - mean) /
sqrt(var + eps)`` alone: the normalisation of several tutorial ports and of nGPT-style
blocks), written by hand around the reference's attention and FFN: its LayerNorm pair and the
block's residual wiring forward and backward.  ``CAPABILITIES = {"layernorm": {"affine":
False}}`` declares it: the block's ``p`` has no ``ln1.*`` / ``ln2.*`` keys.

``build(bug)``: None is the correct block (``correct``); ``"ln"`` plants the LayerNorm backward
that drops the ``x_hat mean(dy x_hat)`` term (the variance treated as a constant: ``buggy``).
tests/suite/test_plain_ln_block.py checks both."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from minibert_reference import ops as R

ATTN = ("W_q", "W_k", "W_v", "W_o", "b_q", "b_k", "b_v", "b_o")
FFN = ("ffn.W_1", "ffn.b_1", "ffn.W_2", "ffn.b_2")


def layer_norm(x, eps):
    xc = x - x.mean(axis=-1, keepdims=True)
    rstd = 1.0 / np.sqrt((xc * xc).mean(axis=-1, keepdims=True) + eps)
    return xc * rstd, (xc * rstd, rstd)


def layer_norm_backward(dy, cache, bug=None):
    x_hat, rstd = cache
    dx = dy - dy.mean(axis=-1, keepdims=True)
    if bug != "ln":
        dx = dx - x_hat * (dy * x_hat).mean(axis=-1, keepdims=True)
    return dx * rstd


def build(bug: str | None = None) -> SimpleNamespace:
    def block_forward(x, p, *, n_heads, mask=None, eps=1e-12):
        a, c_attn = R.attention_forward(x, *(p.get(f"attn.{n}") for n in ATTN),
                                        n_heads=n_heads, mask=mask)
        h, c_ln1 = layer_norm(x + a, eps)
        f, c_ffn = R.ffn_forward(h, *(p.get(n) for n in FFN))
        out, c_ln2 = layer_norm(h + f, eps)
        return out, (c_attn, c_ln1, c_ffn, c_ln2, tuple(p))

    def block_backward(dout, cache):
        c_attn, c_ln1, c_ffn, c_ln2, names = cache
        dr2 = layer_norm_backward(dout, c_ln2, bug)
        dh_ffn, *dffn = R.ffn_backward(dr2, c_ffn)
        dr1 = layer_norm_backward(dr2 + dh_ffn, c_ln1, bug)
        dx_attn, *dattn = R.attention_backward(dr1, c_attn)
        grads = {**{f"attn.{n}": g for n, g in zip(ATTN, dattn)}, **dict(zip(FFN, dffn))}
        return dr1 + dx_attn, {n: grads[n] for n in names}

    # ------------------------------------------------------------------------- the adapter
    return SimpleNamespace(CAPABILITIES={"layernorm": {"affine": False}},
                           block_forward=block_forward, block_backward=block_backward)


# ---------------------------------------- the correct and the buggy build (for the tests)
correct = build()
buggy = build("ln")
