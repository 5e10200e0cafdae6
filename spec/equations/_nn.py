"""Helpers shared by the layer modules (relu, tanh, ffn, residual, block, the embeddings and
heads): the ReLU and a LayerNorm row as SymPy expressions, the kink margin, the code side of an
op's forward/backward SymPy <-> code checks, and the whole check of an elementwise activation.
Private: it registers no equation."""

from __future__ import annotations

import numpy as np
import sympy as sp

from minibert_spec.equations import Numeric
from minibert_spec.equations._cache import maps_cache
from minibert_spec.equations._code import forward_backward_code
from minibert_spec.equations._sym import arr, forward_backward_maps

# SymPy <-> code samples keep ReLU inputs this far from 0 (minibert_spec.tolerances.KINK_MARGIN)
KINK = 1e-3
LN_EPS = sp.Rational(1, 10 ** 5)  # the block check's LayerNorm eps (passed to the code too)


def relu_expr(e):
    """max(0, e) as SymPy."""
    return sp.Max(0, e)


def ln_row(v, gamma=None, beta=None, eps=LN_EPS):
    """LayerNorm of one row v (a sequence of SymPy expressions); gamma, beta optional."""
    N = len(v)
    mu = sp.Add(*v) / N
    var = sp.Add(*[(e - mu) ** 2 for e in v]) / N
    out = np.array([(e - mu) / sp.sqrt(var + eps) for e in v], dtype=object)
    if gamma is not None:
        out = out * gamma + beta
    return out


def per_token_fns(token_map, size):
    """The (forward, backward) maps of an op acting on each token alone, from its lambdified
    one-token map ``token_map(x=[H], dy=[H], **params) -> (y, dx, *dparams)``: the map per
    position of x [B, T, H]; the parameters' gradients add up over positions."""
    B, T, H = size[:3]

    def run(x, dy, **p):
        outs = [token_map(x=x[b, t], dy=dy[b, t], **p) for b in range(B) for t in range(T)]
        y = np.stack([o[0] for o in outs]).reshape(B, T, H)
        dx = np.stack([o[1] for o in outs]).reshape(B, T, H)
        return y, (dx, *(sum(o[k] for o in outs) for k in range(2, len(outs[0]))))

    return (lambda **a: (run(**a)[0],), lambda **a: run(**a)[1])


def elementwise_numeric(fn, attr_f, attr_b, accept=None, kwargs=None, code=None,
                        variant=None):
    """The forward and backward SymPy <-> code checks of y = fn(x) elementwise against
    impl.<attr_f>(x, **kwargs) -> (y, cache) and impl.<attr_b>(dy, cache); ``code`` (which ->
    code side) replaces that call for an activation reached through another op, ``variant``
    the protocol form it needs (minibert_spec.equations.Numeric)."""
    kwargs = dict(kwargs or {})
    shapes = ((2, 3), (1, 4))

    @maps_cache(name=f"elementwise.{fn.__name__}.{attr_f}.{sorted(kwargs.items())}")
    def fns(shape):
        x, dy = arr("x", *shape), arr("dy", *shape)
        y = np.vectorize(fn, otypes=[object])(x)
        return forward_backward_maps(dict(x=x, dy=dy), y, dy, [x])

    code = code or forward_backward_code(attr_f, attr_b, ("x",), "dy", **kwargs)

    def inputs(shape):
        # "float_away": |x| in [KINK, 2] with either sign -- the kink stays out by construction
        return dict(x=("float_away", shape, 2.0, KINK), dy=("float", shape, 1.0))

    return [Numeric(shapes, inputs, lambda s, w=w: fns(s)[w], code(w), accept,
                    needs=(attr_f, attr_b), variant=dict(variant or {})) for w in (0, 1)]
