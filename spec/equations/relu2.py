"""Squared ReLU, max(0, x)^2 (Primer; the nanoGPT speedrun's MLP), with its derivative derived
by ``sympy.diff``.

None of the five documents uses it; real decoders do, as the MLP's activation (Hugging Face
``hidden_act="relu2"``, torch ``F.relu(x).square()``).  It is no protocol op of its own but a
form of the FFN (``ffn.activation`` "relu2"): its SymPy <-> code check reaches it through
``ffn_forward`` with identity weights and zero biases, which pass x and dy through exactly.
"""

from __future__ import annotations

import numpy as np
import sympy as sp

from minibert_spec.equations import Equation, Proof, register
from minibert_spec.equations._nn import elementwise_numeric, relu_expr
from minibert_spec.sources import PROTOCOL_VARIANTS


def relu2(x):
    return relu_expr(x) ** 2


def _prove() -> Proof:
    """d max(0, x)^2 / dx = 2 max(0, x) on x > 0 and x < 0 (sympy.diff of Max on signed
    symbols), and both one-sided difference quotients at 0 tend to 0 = 2 max(0, 0): squared
    ReLU is C^1, so unlike ReLU it needs no subgradient convention at the kink."""
    xp, xn = sp.Symbol("xp", positive=True), sp.Symbol("xn", negative=True)
    for v in (xp, xn):
        gap = sp.simplify(sp.diff(relu2(v), v) - 2 * relu_expr(v))
        if gap != 0:
            return Proof("refuted", ("symbolic",), f"d relu2 - 2 max(0, x) = {gap} at {v}")
    h = sp.Symbol("h", real=True)
    for side in ("+", "-"):
        slope = sp.limit((relu2(h) - relu2(sp.S(0))) / h, h, 0, dir=side)
        if slope != 0:
            return Proof("refuted", ("symbolic",), f"derivative at 0{side} is {slope}, not 0")
    return Proof("proven", (1,), "2 max(0, x) for every x (continuous at 0)")


# --------------------------------------------------------------------------- SymPy <-> code
def _through_ffn(which):
    """impl.ffn_forward(x, I, 0, I, 0, activation="relu2") = relu2(x) and its ffn_backward's
    dx = relu2'(x) dy, bit for bit: the identity matmuls and zero biases add nothing."""
    def run(impl, size, x, dy):
        eye, zero = np.eye(x.shape[-1]), np.zeros(x.shape[-1])
        y, cache = impl.ffn_forward(x, eye, zero, eye, zero, activation="relu2")
        return (y,) if which == 0 else (impl.ffn_backward(dy, cache)[0],)
    return run


FWD, BWD = elementwise_numeric(relu2, "ffn_forward", "ffn_backward", code=_through_ffn,
                               variant={"ffn.activation": "relu2"})

register(Equation(
    "relu2.forward", "Squared ReLU", (PROTOCOL_VARIANTS,),
    r"\mathrm{ReLU}^2(x) = \max(0, x)^2", _prove,
    torch_op="torch.nn.functional.relu", numeric=FWD))
register(Equation(
    "relu2.backward", "Squared ReLU gradient", (PROTOCOL_VARIANTS,),
    r"\frac{\partial L}{\partial x} = \frac{\partial L}{\partial y} \odot 2 \max(0, x)", _prove,
    gradient=True, torch_op="torch.nn.functional.relu", numeric=BWD,
    uses=("relu2.forward",)))
