"""SiLU (swish), x sigmoid(x), with its derivative derived by ``sympy.diff``.

None of the five documents uses SiLU (they use ReLU, BERT uses GELU); real code does (LLaMA's
SwiGLU gate: ``torch.nn.functional.silu``), so it is a protocol op of its own.
"""

from __future__ import annotations

import sympy as sp

from minibert_spec.equations import Equation, Proof, register
from minibert_spec.equations._nn import elementwise_numeric
from minibert_spec.sources import PROTOCOL_VARIANTS


def silu(x):
    return x / (1 + sp.exp(-x))


def _prove() -> Proof:
    """d/dx [x s(x)] = s (1 + x (1 - s)), s = 1 / (1 + exp(-x)) (s' = s (1 - s))."""
    x = sp.Symbol("x", real=True)
    s = 1 / (1 + sp.exp(-x))
    diff = sp.simplify(sp.diff(silu(x), x) - s * (1 + x * (1 - s)))
    if diff != 0:
        return Proof("refuted", ("symbolic",), f"d SiLU - closed form = {diff}")
    return Proof("proven", (1,), "s (1 + x (1 - s)), s = sigmoid(x)")


FWD, BWD = elementwise_numeric(silu, "silu_forward", "silu_backward")

register(Equation(
    "silu.forward", "SiLU (swish)", (PROTOCOL_VARIANTS,),
    r"\mathrm{SiLU}(x) = x\,\sigma(x) = \frac{x}{1 + e^{-x}}", _prove,
    torch_op="torch.nn.functional.silu", numeric=FWD))
register(Equation(
    "silu.backward", "SiLU gradient", (PROTOCOL_VARIANTS,),
    r"\frac{\partial L}{\partial x} = \frac{\partial L}{\partial y}\,\sigma(x)"
    r"\left(1 + x (1 - \sigma(x))\right)", _prove, gradient=True,
    torch_op="torch.nn.functional.silu", numeric=BWD, uses=("silu.forward",)))
