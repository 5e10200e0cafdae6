"""ReLU and its gradient (subgradient 0 at the kink, as torch)."""

from __future__ import annotations

import numpy as np
import sympy as sp

from minibert_spec.equations import Equation, Proof, register
from minibert_spec.equations._nn import KINK, elementwise_numeric, relu_expr
from minibert_spec.sources import BLOG, GUIDE, MINIBERT, SEED001, SLIDES


def _prove_relu() -> Proof:
    """d max(0, x)/dx = 1 for x > 0 and 0 for x < 0 (sympy.diff of Max on signed symbols); at
    x = 0 the derivative does not exist and the code takes 0 (as torch does)."""
    xp, xn = sp.Symbol("xp", positive=True), sp.Symbol("xn", negative=True)
    if sp.diff(relu_expr(xp), xp) != 1 or sp.diff(relu_expr(xn), xn) != 0:
        return Proof("refuted", ("symbolic",), "derivative of max(0, x) is not the step function")
    if relu_expr(xp) != xp or relu_expr(xn) != 0:
        return Proof("refuted", ("symbolic",), "max(0, x) is not x on x > 0, 0 on x < 0")
    return Proof("proven", (1,), "x != 0; the subgradient at 0 is taken as 0 (convention)")


# --------------------------------------------------------------------------- SymPy <-> code
def _away_from_kink(size, x, **_):
    return bool(np.min(np.abs(x)) > KINK)


RELU_FWD, RELU_BWD = elementwise_numeric(relu_expr, "relu_forward", "relu_backward",
                                          _away_from_kink)


register(Equation(
    "relu.forward", "ReLU", (f"{MINIBERT} §2.4", f"{MINIBERT} §3.5", f"{SEED001} §1.4",
                             f"{SLIDES} (FFN)", f"{BLOG} (forward)", f"{GUIDE} §5"),
    r"\mathrm{ReLU}(x) = \max(0, x)", _prove_relu, torch_op="torch.relu", numeric=RELU_FWD))
register(Equation(
    "relu.backward", "ReLU gradient", (f"{MINIBERT} §3.5",),
    r"\frac{\partial L}{\partial x} = \frac{\partial L}{\partial y} \odot [x > 0]", _prove_relu,
    gradient=True, torch_op="torch.relu", numeric=RELU_BWD,
    note="subgradient 0 at x = 0, as torch",
    uses=("relu.forward",)))
