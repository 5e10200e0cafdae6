"""Residual connections (forward, the gradient through the skip) and the BERT-base blog's
variant that adds the embeddings X in every layer."""

from __future__ import annotations

import numpy as np
import sympy as sp

from minibert_spec.equations import Equation, Proof, register
from minibert_spec.equations._nn import ln_row
from minibert_spec.equations._sym import arr, floats, fmt_array, vjp
from minibert_spec.equations.block import BLOCK_CHECK
from minibert_spec.sources import BLOG, GUIDE, MINIBERT, SEED001, SLIDES


def _prove_residual() -> Proof:
    """out = x + f(x) for an arbitrary differentiable f: dx = dout + J_f^T dout -- the gradient
    reaches x unchanged through the skip connection and through f's backward."""
    for n in (2, 3):
        x, dout = arr("x", n), arr("dout", n)
        f = [sp.Function(f"f{i}")(*x) for i in range(n)]
        out = np.array([x[i] + f[i] for i in range(n)], dtype=object)
        closed = np.array([dout[i] + sp.Add(*[dout[j] * sp.diff(f[j], x[i]) for j in range(n)])
                           for i in range(n)], dtype=object)
        if not all(sp.expand(a - b) == 0 for a, b in zip(vjp(out, dout, x), closed)):
            return Proof("refuted", (n,), "dx != dout + J^T dout")
    return Proof("proven", (2, 3), "f an arbitrary (undefined) SymPy function of all of x")


def _prove_blog_residual() -> Proof:
    """The BERT-base blog adds X (the embeddings) in both residuals of every layer: Z̄_l =
    LN(X + Z̃_l), Z_l = LN(X + Z_l^out).  A residual adds the sublayer's own input: Z_{l-1}
    for the attention, Z̄_l for the FFN (BERT, every other document, the reference).  With the
    FFN sublayer's output held fixed, the second residual already differs in layer 1, since
    Z̄_1 = LN(X + Z̃_1) != X."""
    X = np.array([sp.Integer(1), sp.Integer(2), sp.Integer(4)], dtype=object)
    Zt = np.array([sp.Integer(0), sp.Integer(3), sp.Integer(-1)], dtype=object)  # attention out
    Zout = np.array([sp.Integer(2), sp.Integer(-1), sp.Integer(1)], dtype=object)  # FFN out
    Zbar = ln_row(X + Zt)
    blog = ln_row(X + Zout)
    bert = ln_row(Zbar + Zout)
    a, b = floats(blog), floats(bert)
    return Proof("refuted", (3,),
                 f"layer 1, X={X.tolist()}, attention output {Zt.tolist()}, FFN output "
                 f"{Zout.tolist()}: LN(X + Z_out) = {fmt_array(a)} vs LN(Z̄ + Z_out) = "
                 f"{fmt_array(b)}; from layer 2 on the first residual differs too (X != Z_(l-1))")


register(Equation(
    "residual.forward", "Residual connection", (f"{MINIBERT} §2.5", f"{SEED001} §1.3",
                                                f"{SLIDES} (step 2)", f"{GUIDE} §10"),
    r"\mathrm{out} = x + \mathrm{sublayer}(x)", _prove_residual,
    numeric=BLOCK_CHECK,
    note="checked inside the block's forward (the reference has no standalone residual op)"))
register(Equation(
    "residual.backward", "Gradient through a residual connection", (f"{SEED001} §2.3",),
    r"\frac{\partial L}{\partial x} = \delta + J_{\mathrm{sublayer}}^\top \delta",
    _prove_residual, gradient=True,
    numeric_na="the block's dx is the only place the code adds the two branches; it is checked "
               "by finite differences (block op) and the identity itself is proven for an "
               "arbitrary sublayer",
    uses=("residual.forward",)))
register(Equation(
    "residual.from_embeddings", "Residuals that add the embeddings X in every layer",
    (f"{BLOG} (forward)",),
    r"\bar Z_l = \mathrm{LN}(X + \tilde Z_l),\ Z_l = \mathrm{LN}(X + Z_l^{out})",
    _prove_blog_residual, kind="document", expected="refuted", target="residual.forward"))
