"""tanh (the pooler's activation) and its gradient 1 - tanh^2."""

from __future__ import annotations

import sympy as sp

from minibert_spec.equations import Equation, Proof, register
from minibert_spec.equations._nn import elementwise_numeric
from minibert_spec.sources import BLOG


def _prove_tanh() -> Proof:
    x = sp.Symbol("x", real=True)
    if sp.simplify(sp.diff(sp.tanh(x), x) - (1 - sp.tanh(x) ** 2)) != 0:
        return Proof("refuted", ("symbolic",), "d tanh != 1 - tanh^2")
    return Proof("proven", (1,))


# --------------------------------------------------------------------------- SymPy <-> code
TANH_FWD, TANH_BWD = elementwise_numeric(sp.tanh, "tanh_forward", "tanh_backward")


register(Equation(
    "tanh.forward", "tanh (pooler activation)", (f"{BLOG} (final)",), r"y = \tanh(x)",
    _prove_tanh, torch_op="torch.tanh", numeric=TANH_FWD))
register(Equation(
    "tanh.backward", "tanh gradient", (f"{BLOG} (final)",),
    r"\frac{\partial L}{\partial x} = \frac{\partial L}{\partial y} (1 - \tanh^2 x)", _prove_tanh,
    gradient=True, torch_op="torch.tanh", numeric=TANH_BWD,
    uses=("tanh.forward",)))
