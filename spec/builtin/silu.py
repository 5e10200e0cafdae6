"""SiLU (swish), x sigmoid(x): LLaMA's gate activation (its SymPy derivation:
spec/equations/silu.py; its reference pair: minibert_reference.ops.activations)."""

from __future__ import annotations

import math

import numpy as np

from minibert_spec.builtin import Family, Identity, Mutant, OpDeclaration


def _draw(draw, k):
    shape = draw(k._lead_shapes()) + (draw(k.sizes(1, 4)),)
    return k.OpCase({"x": draw(k.arrays(shape, -4.0, 4.0))}, {}, draw(k.upstream(shape)),
                    draw(k._seed()))


def _example(rng, k):
    return k.OpCase({"x": rng.standard_normal((2, 3, 4)) * 2}, {},
                    k.upstream_like(rng, (2, 3, 4)))


def silu_is_x_times_sigmoid(impl, case, h):
    """At fixed points SiLU(x) = x / (1 + e^-x) (math.exp, float64) with SiLU'(0) = 1/2; on the
    case, SiLU(x) - SiLU(-x) = x (sigmoid(x) + sigmoid(-x) = 1)."""
    points = np.array([-6.0, -2.0, -0.5, 0.0, 0.5, 1.0, 3.0])
    y, _ = impl.silu_forward(points)
    _, c0 = impl.silu_forward(np.zeros(2))
    (d0,) = impl.silu_backward(np.ones(2), c0)
    x = case.inputs["x"]
    h.require([h.close("silu", "SiLU(x) = x sigmoid(x) at fixed points", y,
                       np.array([p / (1 + math.exp(-p)) for p in points])),
               h.close("silu", "SiLU'(0) = 1/2", d0, np.full(2, 0.5)),
               h.close("silu", "SiLU(x) - SiLU(-x) = x", impl.silu_forward(x)[0]
                       - impl.silu_forward(-x)[0], x)])


OP = OpDeclaration(
    "silu", after="gelu", inputs=("x",), equations=("silu.forward", "silu.backward"),
    unguarded="1 + exp(-x) >= 1: nothing to keep finite",
    doc="silu_forward(x) -> x sigmoid(x) (swish, LLaMA's gate activation)",
    families=(Family(_draw, _example, torch=lambda to: lambda x: to.F.silu(x)),),
    identities=(Identity("x_sigmoid_x", silu_is_x_times_sigmoid,
                         options=dict(equations=("silu.forward", "silu.backward"))),),
    mutants=(
        Mutant("silu_derivative_sigmoid_only", "silu.backward",
               "SiLU derivative taken as sigmoid(x) alone: the x sigmoid'(x) term of the "
               "product rule is lost", "ops._silu_backward", (("(s * (1 + x * (1 - s)))", "s"),)),
        Mutant("silu_sigmoid_sign_flipped", "silu.forward",
               "SiLU's sigmoid written 1 / (1 + exp(x)): x sigmoid(-x)",
               "ops._silu_forward", (("s = 1 / (1 + np.exp(-x))", "s = 1 / (1 + np.exp(x))"),)),
    ),
    probe=dict(params=(), shapes={"x": (2, 3, 4)}, sizes=()),
    aliases=("silu", "swish"),
)
