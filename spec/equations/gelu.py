"""GELU, BERT's activation: the exact form x Phi(x) (erf) and the tanh approximation
(Hugging Face ``gelu_new``), each with its derivative derived by ``sympy.diff``.

None of the five documents uses GELU (the Mini-BERT derivation and the blog use ReLU); real
BERT does (hidden_act="gelu"), so every BERT checkpoint needs it.
"""

from __future__ import annotations

import sympy as sp

from minibert_spec.equations import Equation, Proof, register
from minibert_spec.equations._nn import elementwise_numeric

BERT = "BERT (Hugging Face hidden_act)"
C = sp.sqrt(2 / sp.pi)
K = sp.Rational(44715, 10 ** 6)


def gelu_erf(x):
    return x * (1 + sp.erf(x / sp.sqrt(2))) / 2


def gelu_tanh(x):
    return x * (1 + sp.tanh(C * (x + K * x ** 3))) / 2


def _prove_erf() -> Proof:
    """d/dx [x Phi(x)] = Phi(x) + x phi(x), phi(x) = exp(-x^2/2) / sqrt(2 pi)."""
    x = sp.Symbol("x", real=True)
    closed = (1 + sp.erf(x / sp.sqrt(2))) / 2 + x * sp.exp(-x ** 2 / 2) / sp.sqrt(2 * sp.pi)
    diff = sp.simplify(sp.diff(gelu_erf(x), x) - closed)
    if diff != 0:
        return Proof("refuted", ("symbolic",), f"d GELU - closed form = {diff}")
    return Proof("proven", (1,), "Phi(x) + x phi(x)")


def _prove_tanh() -> Proof:
    """d/dx [x (1 + tanh u) / 2] = (1 + t) / 2 + x (1 - t^2) u' / 2, t = tanh u,
    u = sqrt(2/pi) (x + 0.044715 x^3), u' = sqrt(2/pi) (1 + 3 * 0.044715 x^2); and the forms
    the reference evaluates (no cancellation of 1 + t for u << 0): (1 + t) / 2 = s =
    1 / (1 + exp(-2u)), so GELU_tanh = x s and its derivative = s + 2 x s (1 - s) u'."""
    x = sp.Symbol("x", real=True)
    u = C * (x + K * x ** 3)
    t = sp.tanh(u)
    du = C * (1 + 3 * K * x ** 2)
    closed = (1 + t) / 2 + x * (1 - t ** 2) * du / 2
    diff = sp.simplify(sp.diff(gelu_tanh(x), x) - closed)
    if diff != 0:
        return Proof("refuted", ("symbolic",), f"d gelu_tanh - closed form = {diff}")
    s = 1 / (1 + sp.exp(-2 * u))
    for what, lhs, rhs in (("(1 + t) / 2 = s", (1 + t) / 2, s),
                           ("derivative = s + 2 x s (1 - s) u'", closed,
                            s + 2 * x * s * (1 - s) * du)):
        gap = sp.simplify((lhs - rhs).rewrite(sp.exp))
        if gap != 0:
            return Proof("refuted", ("symbolic",), f"{what}: difference {gap}")
    return Proof("proven", (1,), "(1 + t) / 2 + x (1 - t^2) u' / 2 = s + 2 x s (1 - s) u', "
                                 "s = 1 / (1 + exp(-2u))")


# --------------------------------------------------------------------------- SymPy <-> code
ERF_FWD, ERF_BWD = elementwise_numeric(gelu_erf, "gelu_forward", "gelu_backward",
                                       kwargs={"approximate": "none"})
TANH_FWD, TANH_BWD = elementwise_numeric(gelu_tanh, "gelu_forward", "gelu_backward",
                                         kwargs={"approximate": "tanh"})

register(Equation(
    "gelu.forward.erf", "GELU, exact (erf)", (BERT,),
    r"\mathrm{GELU}(x) = x \Phi(x) = \tfrac{x}{2}\left(1 + \mathrm{erf}(x/\sqrt{2})\right)",
    _prove_erf, torch_op="torch.nn.functional.gelu", numeric=ERF_FWD))
register(Equation(
    "gelu.backward.erf", "GELU gradient, exact", (BERT,),
    r"\frac{\partial L}{\partial x} = \frac{\partial L}{\partial y}\left(\Phi(x) + x\,"
    r"\frac{e^{-x^2/2}}{\sqrt{2\pi}}\right)", _prove_erf, gradient=True,
    torch_op="torch.nn.functional.gelu", numeric=ERF_BWD,
    uses=("gelu.forward.erf",)))
register(Equation(
    "gelu.forward.tanh", "GELU, tanh approximation (gelu_new)", (BERT,),
    r"\mathrm{GELU}_{\tanh}(x) = \tfrac{x}{2}\left(1 + \tanh\left(\sqrt{2/\pi}"
    r"(x + 0.044715 x^3)\right)\right)", _prove_tanh,
    torch_op="torch.nn.functional.gelu", numeric=TANH_FWD))
register(Equation(
    "gelu.backward.tanh", "GELU gradient, tanh approximation", (BERT,),
    r"\frac{\partial L}{\partial x} = \frac{\partial L}{\partial y}\left(\tfrac{1 + t}{2} + "
    r"\tfrac{x}{2}(1 - t^2)\sqrt{2/\pi}(1 + 3 \cdot 0.044715 x^2)\right)", _prove_tanh,
    gradient=True, torch_op="torch.nn.functional.gelu", numeric=TANH_BWD,
    uses=("gelu.forward.tanh",)))
