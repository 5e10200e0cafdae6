"""The SwiGLU feed-forward network (silu(x W_1 + b_1) * (x W_3 + b_3)) W_2 + b_2 and its
gradients.

None of the five documents uses a gated FFN (they use max(0, x W_1 + b_1) W_2 + b_2); LLaMA-style
code does (Shazeer, "GLU variants improve Transformer", 2020; Meta's ``w2(silu(w1(x)) * w3(x))``,
Hugging Face's LlamaMLP), so it is a protocol op of its own, built on the SiLU op.  SiLU is
written with an opaque exponential (``_sym.Exp``) and every exp(-h) replaced by a positive symbol
after ``sympy.diff``, so the identities are rational.
"""

from __future__ import annotations

import numpy as np

from minibert_spec.equations import Equation, Numeric, Proof, register
from minibert_spec.equations._cache import maps_cache
from minibert_spec.equations._code import op_check
from minibert_spec.equations._nn import per_token_fns
from minibert_spec.equations._sym import Exp, arr, compare, exp_to_symbols, lambdify_map, vjp
from minibert_spec.sources import PROTOCOL_VARIANTS

SIZES = ((1, 2, 2), (2, 2, 1), (1, 3, 2))  # (tokens N, H, I) of the proofs
NUMERIC_SIZES = ((1, 2, 2, 3), (2, 1, 3, 2))  # (B, T, H, I) of the SymPy <-> code checks


def silu(h):
    """h sigmoid(h) with an opaque exponential: its derivative stays in terms of Exp(-h)."""
    return h / (1 + Exp(-h))


def _forward(x, W_1, W_2, W_3, b_1, b_2, b_3):
    """Tokens x [N, H] (or one token [H]) -> (y, h_1, h_3, g): the gate and up
    pre-activations and their product."""
    h_1, h_3 = x @ W_1 + b_1, x @ W_3 + b_3  # [N, I]
    g = np.vectorize(silu, otypes=[object])(h_1) * h_3
    return g @ W_2 + b_2, h_1, h_3, g


def _prove() -> Proof:
    """sympy.diff of sum(dy * y) w.r.t. every input equals the closed forms: with dg = dy W_2^T,
    s = sigmoid(h_1) and silu'(h) = s (1 + h (1 - s)), dh_3 = dg silu(h_1), dh_1 = dg h_3
    silu'(h_1), dx = dh_1 W_1^T + dh_3 W_3^T (x feeds both branches), dW_1 = x^T dh_1,
    dW_3 = x^T dh_3, dW_2 = g^T dy, and the biases' sums."""
    for N, H, I in SIZES:
        x, dy = arr("x", N, H), arr("dy", N, H)
        W_1, W_2, W_3 = arr("W1", H, I), arr("W2", I, H), arr("W3", H, I)
        b_1, b_2, b_3 = arr("b1", I), arr("b2", H), arr("b3", I)
        y, h_1, h_3, g = _forward(x, W_1, W_2, W_3, b_1, b_2, b_3)
        dg = dy @ W_2.T
        s = np.vectorize(lambda h: 1 / (1 + Exp(-h)), otypes=[object])(h_1)
        dh_3 = dg * h_1 * s  # dg * silu(h_1)
        dh_1 = dg * h_3 * s * (1 + h_1 * (1 - s))
        closed = {"x": dh_1 @ W_1.T + dh_3 @ W_3.T, "W_1": x.T @ dh_1, "W_2": g.T @ dy,
                  "W_3": x.T @ dh_3, "b_1": dh_1.sum(axis=0), "b_2": dy.sum(axis=0),
                  "b_3": dh_3.sum(axis=0)}
        wrt = {"x": x, "W_1": W_1, "W_2": W_2, "W_3": W_3, "b_1": b_1, "b_2": b_2, "b_3": b_3}
        for name, w in wrt.items():
            both = np.stack([vjp(y, dy, w).ravel(), np.ravel(closed[name])])
            rational, _, aux = exp_to_symbols(both, -h_1)
            ok, detail = compare(rational[0], rational[1], aux)
            if not ok:
                return Proof("refuted", (N, H, I), f"d{name}: {detail}")
    return Proof("proven", SIZES, "every gradient, the biases' included (sympy.diff)")


# --------------------------------------------------------------------------- SymPy <-> code
@maps_cache
def _token_swiglu(H: int, I: int):
    """One token's bias-free SwiGLU (the protocol's standard form) and its sympy.diff
    gradients, lambdified."""
    x, dy = arr("x", H), arr("dy", H)
    W_1, W_2, W_3 = arr("W_1", H, I), arr("W_2", I, H), arr("W_3", H, I)
    zeros = (np.zeros(I, dtype=object), np.zeros(H, dtype=object), np.zeros(I, dtype=object))
    y = _forward(x, W_1, W_2, W_3, *zeros)[0]
    inputs = dict(x=x, W_1=W_1, W_2=W_2, W_3=W_3, dy=dy)
    return lambdify_map(inputs, [y] + [vjp(y, dy, w) for w in (x, W_1, W_2, W_3)])


def _swiglu_fns(size):
    """SwiGLU acts on each token alone (minibert_spec.equations._nn.per_token_fns)."""
    return per_token_fns(_token_swiglu(*size[2:]), size)


def _inputs(size):
    B, T, H, I = size
    return dict(x=("float", (B, T, H), 2.0), W_1=("float", (H, I), 1.5),
                W_2=("float", (I, H), 1.5), W_3=("float", (H, I), 1.5),
                dy=("float", (B, T, H), 1.0))


def _numeric(which: int) -> Numeric:
    return op_check(which, NUMERIC_SIZES, _inputs, lambda s: _swiglu_fns(s)[which],
                    "swiglu_forward", "swiglu_backward",
                    lambda x, W_1, W_2, W_3, dy: ((x, W_1, W_2, W_3), {}), "dy", pick=slice(4))


register(Equation(
    "swiglu.forward", "SwiGLU feed-forward network", (PROTOCOL_VARIANTS,),
    r"\mathrm{SwiGLU}(x) = \bigl(\mathrm{SiLU}(x W_1 + b_1) \odot (x W_3 + b_3)\bigr) W_2 + b_2",
    _prove, torch_op="transformers LlamaMLP", numeric=_numeric(0),
    note="LLaMA's FFN: W_1 the gate (gate_proj), W_3 up (up_proj), W_2 down (down_proj); "
         "no biases in LLaMA (a declared variant here)",
    uses=("linear.forward", "silu.forward")))
register(Equation(
    "swiglu.backward", "SwiGLU gradients", (PROTOCOL_VARIANTS,),
    r"\delta g = \delta y W_2^\top,\ \delta h_3 = \delta g \odot \mathrm{SiLU}(h_1),\ "
    r"\delta h_1 = \delta g \odot h_3 \odot \mathrm{SiLU}'(h_1),\ "
    r"\delta x = \delta h_1 W_1^\top + \delta h_3 W_3^\top,\ \delta W_2 = g^\top \delta y",
    _prove, gradient=True, torch_op="transformers LlamaMLP", numeric=_numeric(1),
    uses=("swiglu.forward", "linear.backward.dx", "linear.backward.dW", "linear.backward.db",
          "silu.backward")))
