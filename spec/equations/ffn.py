"""The position-wise feed-forward network max(0, x W1 + b1) W2 + b2 and its gradients."""

from __future__ import annotations

import numpy as np

from minibert_spec.equations import Equation, Numeric, Proof, register
from minibert_spec.equations._cache import maps_cache
from minibert_spec.equations._code import op_code
from minibert_spec.equations._nn import KINK, per_token_fns, relu_expr
from minibert_spec.equations._sym import arr, compare, lambdify_map, vjp
from minibert_spec.sources import BLOG, GUIDE, MINIBERT, PROTOCOL_VARIANTS, SEED001, SLIDES

FFN_SIZES = ((1, 2, 2, 3), (2, 1, 3, 2))  # (B, T, H, I)


def _prove_ffn() -> Proof:
    """On every activation region (a fixed on/off pattern m of the hidden units, pre-activations
    of sign m) FFN(x) = ((x W1 + b1) ⊙ m) W2 + b2, and sympy.diff gives
    dx = ((dy W2^T) ⊙ m) W1^T, dW1 = x^T ((dy W2^T) ⊙ m), db1 = sum((dy W2^T) ⊙ m),
    dW2 = relu(h)^T dy, db2 = sum(dy)."""
    rng = np.random.default_rng(0)
    for B, T, H, I in FFN_SIZES:
        x, W1, b1, W2, b2 = arr("x", B, T, H), arr("W1", H, I), arr("b1", I), arr("W2", I, H), \
            arr("b2", H)
        dy = arr("dy", B, T, H)
        m = rng.integers(0, 2, (B, T, I))  # the region: which hidden units are on
        h = x @ W1 + b1
        a = h * m
        y = a @ W2 + b2
        da = (dy @ W2.T) * m
        pairs = ((x, da @ W1.T), (W1, x.reshape(-1, H).T @ da.reshape(-1, I)),
                 (b1, da.sum(axis=(0, 1))), (W2, a.reshape(-1, I).T @ dy.reshape(-1, H)),
                 (b2, dy.sum(axis=(0, 1))))
        for w, closed in pairs:
            ok, detail = compare(vjp(y, dy, w), closed)
            if not ok:
                return Proof("refuted", (B, T, H, I), detail)
    return Proof("proven", FFN_SIZES, "on each activation region (ReLU pattern fixed)")


# --------------------------------------------------------------------------- SymPy <-> code
@maps_cache
def _token_ffn(H: int, I: int):
    """One token's FFN and its sympy.diff gradients, lambdified."""
    x, W1, b1, W2, b2, dy = arr("x", H), arr("W_1", H, I), arr("b_1", I), arr("W_2", I, H), \
        arr("b_2", H), arr("dy", H)
    y = np.vectorize(relu_expr, otypes=[object])(x @ W1 + b1) @ W2 + b2
    inputs = dict(x=x, W_1=W1, b_1=b1, W_2=W2, b_2=b2, dy=dy)
    return lambdify_map(inputs, [y] + [vjp(y, dy, w) for w in (x, W1, b1, W2, b2)])


def _ffn_fns(size):
    """The FFN acts on each token alone (minibert_spec.equations._nn.per_token_fns)."""
    return per_token_fns(_token_ffn(*size[2:]), size)


def _ffn_inputs(size):
    B, T, H, I = size
    return dict(x=("float", (B, T, H), 2.0), W_1=("float", (H, I), 2.0), b_1=("float", (I,), 1.0),
                W_2=("float", (I, H), 2.0), b_2=("float", (H,), 1.0),
                dy=("float", (B, T, H), 1.0))


def _ffn_accept(size, x, W_1, b_1, **_):
    return bool(np.min(np.abs(x @ W_1 + b_1)) > KINK)


def _ffn_code(which):
    return op_code(which, "ffn_forward", "ffn_backward",
                   lambda x, W_1, b_1, W_2, b_2, dy: ((x, W_1, b_1, W_2, b_2), {}), "dy",
                   pick=slice(None))


register(Equation(
    "ffn.forward", "Position-wise feed-forward network",
    (f"{MINIBERT} §2.4", f"{SEED001} §1.4", f"{SLIDES} (FFN)", f"{BLOG} (forward)",
     f"{GUIDE} §5"),
    r"\mathrm{FFN}(x) = \max(0, x W_1 + b_1) W_2 + b_2", _prove_ffn,
    numeric=Numeric(FFN_SIZES, _ffn_inputs, lambda s: _ffn_fns(s)[0], _ffn_code(0), _ffn_accept,
                    needs=("ffn_forward",)),
    uses=("linear.forward", "relu.forward", "gelu.forward.erf", "gelu.forward.tanh",
          "relu2.forward")))
register(Equation(
    "ffn.backward", "FFN gradients", (f"{MINIBERT} §3.1", f"{MINIBERT} §3.5"),
    r"\delta h = (\delta y W_2^\top) \odot [h > 0],\ \delta x = \delta h W_1^\top,\ "
    r"\delta W_1 = x^\top \delta h,\ \delta W_2 = \mathrm{ReLU}(h)^\top \delta y",
    _prove_ffn, gradient=True,
    numeric=Numeric(FFN_SIZES, _ffn_inputs, lambda s: _ffn_fns(s)[1], _ffn_code(1), _ffn_accept,
                    needs=("ffn_forward", "ffn_backward")),
    uses=("ffn.forward", "linear.backward.dx", "linear.backward.dW", "linear.backward.db",
          "relu.backward", "gelu.backward.erf", "gelu.backward.tanh", "relu2.backward")))


# --------------------------------------------------------------------------- without b_2
def _prove_no_b2() -> Proof:
    """Without the second bias, FFN(x) = relu(x W1 + b1) W2: on every activation region
    sympy.diff gives the same dx, dW1, db1, dW2 as with b2 (the bias only shifts the output;
    its gradient does not exist), FFN_SIZES."""
    rng = np.random.default_rng(1)
    for B, T, H, I in FFN_SIZES:
        x, W1, b1, W2 = arr("x", B, T, H), arr("W1", H, I), arr("b1", I), arr("W2", I, H)
        dy = arr("dy", B, T, H)
        m = rng.integers(0, 2, (B, T, I))
        a = (x @ W1 + b1) * m
        y = a @ W2
        da = (dy @ W2.T) * m
        for w, closed in ((x, da @ W1.T), (W1, x.reshape(-1, H).T @ da.reshape(-1, I)),
                          (b1, da.sum(axis=(0, 1))), (W2, a.reshape(-1, I).T @ dy.reshape(-1, H))):
            ok, detail = compare(vjp(y, dy, w), closed)
            if not ok:
                return Proof("refuted", (B, T, H, I), detail)
    return Proof("proven", FFN_SIZES, "on each activation region: dx, dW1, db1, dW2 of "
                                      "relu(x W1 + b1) W2")


def _no_b2_sympy(size):
    forward, grads = _ffn_fns(size)

    def run(x, W_1, b_1, W_2, dy):
        b_2 = np.zeros(W_2.shape[1])  # no second bias: the map with b_2 = 0
        y = forward(x=x, W_1=W_1, b_1=b_1, W_2=W_2, b_2=b_2, dy=dy)[0]
        return (y, *grads(x=x, W_1=W_1, b_1=b_1, W_2=W_2, b_2=b_2, dy=dy)[:4])

    return run


def _no_b2_code(impl, size, x, W_1, b_1, W_2, dy):
    y, c = impl.ffn_forward(x, W_1, b_1, W_2, None)
    *grads, db_2 = impl.ffn_backward(dy, c)
    if db_2 is not None:
        raise AssertionError(f"ffn without b_2: db_2 must come back None, got "
                             f"{type(db_2).__name__}")
    return (y, *grads)


def _no_b2_inputs(size):
    spec = _ffn_inputs(size)
    del spec["b_2"]
    return spec


register(Equation(
    "ffn.no_b2", "FFN without the second bias (forward and gradients)", (PROTOCOL_VARIANTS,),
    r"\mathrm{FFN}(x) = \max(0, x W_1 + b_1) W_2,\ \delta h = (\delta y W_2^\top) \odot "
    r"[h > 0],\ \delta x = \delta h W_1^\top,\ \delta W_2 = \mathrm{ReLU}(h)^\top \delta y",
    _prove_no_b2, gradient=True,
    numeric=Numeric(FFN_SIZES, _no_b2_inputs, _no_b2_sympy, _no_b2_code, _ffn_accept,
                    needs=("ffn_forward", "ffn_backward"), variant={"ffn.b_2": False}),
    note="a variant of the protocol (CAPABILITIES ffn b_2=False): b_2 = None, db_2 None",
    uses=("ffn.forward", "ffn.backward")))
