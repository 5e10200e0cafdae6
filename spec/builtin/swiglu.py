"""SwiGLU, (silu(x W_1 + b_1) * (x W_3 + b_3)) W_2 + b_2: LLaMA's feed-forward part, W_1 the
gate, W_3 up, W_2 down (its SymPy derivation: spec/equations/swiglu.py; its reference pair:
minibert_reference.ops.blocks).  A block's SwiGLU (block.ffn "swiglu": its families, its torch
twin's block_swiglu) stays with the block; the twin itself is torch_swiglu.swiglu, which the
block's twin calls too."""

from __future__ import annotations

import numpy as np

from minibert_reference.ops import SWIGLU_PARAMS
from minibert_spec.builtin import NOTHING_TO_GUARD, Family, Identity, Mutant, OpDeclaration

NAME = "swiglu"


def _draw(draw, k, bias: bool = False):
    """x [..., H] (one to three leading axes), W_1, W_3 [H, I], W_2 [I, H] in [-1.5, 1.5];
    ``bias``: b_1, b_2, b_3 too (None without: LLaMA's form)."""
    lead = draw(k._lead_shapes(3).filter(len))
    H, I = draw(k.sizes(1, 4)), draw(k.sizes(1, 5))
    inputs = {"x": draw(k.arrays(lead + (H,))), "W_1": draw(k.arrays((H, I), -1.5, 1.5)),
              "W_2": draw(k.arrays((I, H), -1.5, 1.5)), "W_3": draw(k.arrays((H, I), -1.5, 1.5))}
    inputs.update({n: draw(k.arrays((size,), -1.0, 1.0)) if bias else None
                   for n, size in (("b_1", I), ("b_2", H), ("b_3", I))})
    return k.OpCase(inputs, {}, draw(k.upstream(lead + (H,))), draw(k._seed()))


def _example(rng, k, bias: bool = False):
    H, I = 4, 6
    inputs = {"x": rng.standard_normal((2, 3, H)), "W_1": 0.7 * rng.standard_normal((H, I)),
              "W_2": 0.7 * rng.standard_normal((I, H)), "W_3": 0.7 * rng.standard_normal((H, I)),
              "b_1": 0.3 * rng.standard_normal(I) if bias else None,
              "b_2": 0.3 * rng.standard_normal(H) if bias else None,
              "b_3": 0.3 * rng.standard_normal(I) if bias else None}
    return k.OpCase(inputs, {}, k.upstream_like(rng, (2, 3, H)))


def swiglu_is_linear_in_up_and_down_weights(impl, case, h):
    """Without biases the output is linear in W_3 and in W_2, so <dW_3, W_3> = <dW_2, W_2> =
    <dy, y> (Euler's identity for a function of degree 1); a zero gate (W_1 = 0: silu(0) = 0)
    gives exactly zero output, dW_2 and dW_3, and dW_1 = x^T (dy W_2^T * x W_3) / 2
    (silu'(0) = 1/2)."""
    p = case.inputs
    x, W_1, W_2, W_3, dy = p["x"], p["W_1"], p["W_2"], p["W_3"], case.dout
    y, cache = impl.swiglu_forward(x, W_1, W_2, W_3)
    _, _, dW_2, dW_3, *_ = impl.swiglu_backward(dy, cache)
    y0, cache0 = impl.swiglu_forward(x, np.zeros_like(W_1), W_2, W_3)
    _, dW_1_0, dW_2_0, dW_3_0, *_ = impl.swiglu_backward(dy, cache0)
    H = x.shape[-1]
    half = (x.reshape(-1, H).T @ ((dy @ W_2.T) * (x @ W_3)).reshape(-1, W_3.shape[1])) / 2
    # the inner products sum terms of |dy y| (|W dW| as large): their rounding is of that size
    terms = float(np.sum(np.abs(dy * y)) + np.sum(np.abs(dW_2 * W_2)) + np.sum(np.abs(dW_3 * W_3)))
    zero = np.zeros(())
    h.require([h.close(NAME, "<dW_3, W_3> = <dy, y>", np.sum(dW_3 * W_3) - np.sum(dy * y),
                       zero, terms),
               h.close(NAME, "<dW_2, W_2> = <dy, y>", np.sum(dW_2 * W_2) - np.sum(dy * y),
                       zero, terms),
               h.exact(NAME, "a zero gate: y = 0", y0, np.zeros_like(y0)),
               h.exact(NAME, "a zero gate: dW_2 = 0", dW_2_0, np.zeros_like(dW_2_0)),
               h.exact(NAME, "a zero gate: dW_3 = 0", dW_3_0, np.zeros_like(dW_3_0)),
               h.close(NAME, "a zero gate: dW_1 = x^T (dg * x W_3) / 2", dW_1_0, half)])


def _args(b):
    """x, W_1 [H, I], W_2 [I, H], W_3 [H, I] of the bad-input module ``b`` (no biases: LLaMA's
    form)."""
    return (b.X, b.rng.standard_normal((b.H, b.I)), b.rng.standard_normal((b.I, b.H)),
            b.rng.standard_normal((b.H, b.I)))


_SWIGLU = dict(also=("silu",), torch_requires=("transformers",))

OP = OpDeclaration(
    NAME, after="ffn", inputs=("x", *SWIGLU_PARAMS), params=SWIGLU_PARAMS,
    equations=("swiglu.forward", "swiglu.backward"),
    unguarded=NOTHING_TO_GUARD,
    doc="swiglu_forward(x [...,H], W_1 [H,I], W_2 [I,H], W_3 [H,I], b_1 [I], b_2 [H], b_3 [I] "
        "or None) -> (silu(x W_1 + b_1) * (x W_3 + b_3)) W_2 + b_2 (LLaMA's FFN: W_1 gate, "
        "W_3 up, W_2 down); variant: the biases (standard: none, as LLaMA)",
    # torch_swiglu.swiglu: transformers' LlamaMLP, the block's twin calls it too
    families=(Family(_draw, _example, torch="swiglu",
                     options=dict(needs={"swiglu.bias": False}, **_SWIGLU)),
              Family(_draw, _example, "bias", torch="swiglu",
                     options=dict(needs={"swiglu.bias": True}, **_SWIGLU))),
    identities=(Identity("bilinear_gate", swiglu_is_linear_in_up_and_down_weights),),
    mutants=(
        Mutant("swiglu_gate_and_up_swapped", "swiglu.forward",
               "SwiGLU gates the up projection: silu(x W_3) * (x W_1), W_1 and W_3 swapped "
               "(Meta's w1/w3 names read the other way round)", "ops._swiglu_forward",
               (("h_1, c_gate = _linear_forward(x, W_1, b_1)",
                 "h_1, c_gate = _linear_forward(x, W_3, b_3)"),
                ("h_3, c_up = _linear_forward(x, W_3, b_3)",
                 "h_3, c_up = _linear_forward(x, W_1, b_1)"))),
        Mutant("swiglu_up_grad_without_silu", "swiglu.backward",
               "SwiGLU's up-branch gradient takes the gate's pre-activation h_1 for silu(h_1)",
               "ops._swiglu_backward", (("dh_3 = dg * cache.s", "dh_3 = dg * cache.act.x"),)),
        Mutant("swiglu_dx_drops_up_branch", "swiglu.backward",
               "SwiGLU's dx keeps the gate branch only: x feeds W_3 too, its gradient is lost",
               "ops._swiglu_backward", (("return dx_gate + dx_up,", "return dx_gate,"),)),
    ),
    options={
        "bias": dict(values=(False, True), meaning={
            False: "without biases (LLaMA): the suite passes b_1 = b_2 = b_3 = None and "
                   "expects None gradients",
            True: "with biases b_1, b_2, b_3"}, pieces=("b_1",), also=("block",)),
    },
    bad_inputs=(
        ("swiglu W_1 shape", "W_1",
         lambda m, b: m.swiglu_forward(b.X, np.ones((b.H + 1, b.I)), *_args(b)[2:])),
        ("swiglu W_2 shape", "W_2", lambda m, b: m.swiglu_forward(
            b.X, _args(b)[1], np.ones((b.I, b.H + 1)), _args(b)[3])),
        ("swiglu W_3 shape", "W_3",
         lambda m, b: m.swiglu_forward(*_args(b)[:3], np.ones((b.H, b.I + 1)))),
        ("swiglu W_3 f32", "W_3",
         lambda m, b: m.swiglu_forward(*_args(b)[:3], b.f32(_args(b)[3]))),
        ("swiglu b_2 shape", "b_2",
         lambda m, b: m.swiglu_forward(*_args(b), None, np.ones(b.I))),
    ),
)
