"""The pooler tanh(h[:, 0] W + b) and the BERT-base blog's orientation of it."""

from __future__ import annotations

import numpy as np
import sympy as sp

from minibert_spec.equations import Equation, Numeric, Proof, register
from minibert_spec.equations._cache import maps_cache
from minibert_spec.equations._sym import arr, compare, lambdify_map, vjp
from minibert_spec.sources import BLOG


def _prove_pooler() -> Proof:
    """pooled = tanh(h[:, 0] W + b): sympy.diff gives dh[:, 0] = (dy ⊙ (1 - pooled^2)) W^T and
    dh[:, t] = 0 for t > 0 (only the first token feeds the pooler)."""
    B, T, H = 2, 3, 2
    h, W, b, dy = arr("h", B, T, H), arr("W", H, H), arr("b", H), arr("dy", B, H)
    pooled = np.vectorize(sp.tanh, otypes=[object])(h[:, 0] @ W + b)
    closed = np.zeros((B, T, H), dtype=object)
    closed[:, 0] = (dy * (1 - pooled ** 2)) @ W.T
    ok, detail = compare(vjp(pooled, dy, h), closed)
    return Proof("proven" if ok else "refuted", (B, T, H), detail)


def _prove_pooler_orientation() -> Proof:
    """The blog writes tanh(W^final Z[0, :]) with the row Z[0, :]; read as a column it is
    tanh(Z[0, :] W^T) -- the reference's tanh(h[:, 0] W + b) with W = (W^final)^T (proven) and
    a bias the blog leaves out."""
    H = 3
    W, z = arr("W", H, H), arr("z", H)
    ok, detail = compare(W @ z, z @ W.T)
    if not ok:
        return Proof("refuted", (H,), detail)
    return Proof("convention", (H,), "W z (column) = z W^T (row), proven; bias: blog none, "
                                     "BERT and the reference b")


# --------------------------------------------------------------------------- SymPy <-> code
@maps_cache
def _pooler_fn(size):
    B, T, H = size
    h, W, b = arr("h", B, T, H), arr("W", H, H), arr("b", H)
    pooled = np.vectorize(sp.tanh, otypes=[object])(h[:, 0] @ W + b)
    return lambdify_map(dict(h=h, W=W, b=b), [pooled])


register(Equation(
    "pooler.forward", "Pooler: tanh of the first token's projection", (f"{BLOG} (final)",),
    r"\mathrm{pooled} = \tanh(h_{[:, 0]} W + b)", _prove_pooler, gradient=True,
    numeric=Numeric(((2, 3, 2),), lambda s: dict(h=("float", s, 2.0), W=("float", (2, 2), 2.0),
                                                 b=("float", (2,), 1.0)),
                    lambda s: _pooler_fn(s),
                    lambda impl, s, h, W, b: (impl.pooler_forward(h, W, b)[0],),
                    needs=("pooler_forward",)),
    uses=("linear.forward", "tanh.forward")))
register(Equation(
    "pooler.orientation", "tanh(W^final Z[0,:])", (f"{BLOG} (final)",),
    r"\tanh(W^{final} Z_{n_{layers}}[0, :])", _prove_pooler_orientation, kind="document",
    expected="convention", target="pooler.forward"))
