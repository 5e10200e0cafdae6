"""GeGLU, GELU(a) * b with [a | b] = x split in halves along the last axis, the first the gate
(torch's ``x.chunk(2, -1)``; the erf GELU) -- its SymPy derivation: spec/equations/geglu.py;
its reference pair: minibert_reference.ops.activations."""

from __future__ import annotations

import math

import numpy as np

from minibert_spec.builtin import Family, Identity, Mutant, OpDeclaration


def _draw(draw, k):
    shape = draw(k._lead_shapes()) + (2 * draw(k.sizes(1, 4)),)
    return k.OpCase({"x": draw(k.arrays(shape, -4.0, 4.0))}, {},
                    draw(k.upstream(shape[:-1] + (shape[-1] // 2,))), draw(k._seed()))


def _example(rng, k):
    return k.OpCase({"x": rng.standard_normal((2, 3, 8)) * 2}, {},
                    k.upstream_like(rng, (2, 3, 4)))


def _torch(to):
    def geglu(x):
        a, b = x.chunk(2, dim=-1)
        return to.F.gelu(a) * b
    return geglu


def geglu_is_a_gelu_gate_times_its_value(impl, case, h):
    """With the value half 1, GeGLU is GELU: a Phi(a) at fixed points (math.erf, float64); on
    the case, GeGLU is linear in the value half (GeGLU([a | c b]) = c GeGLU([a | b])), and
    the value half's gradient is dy GELU(a) (GeGLU's own forward at b = 1)."""
    points = np.array([-6.0, -2.0, -0.5, 0.0, 0.5, 1.0, 3.0])
    y, _ = impl.geglu_forward(np.concatenate([points, np.ones_like(points)]))
    x = case.inputs["x"]
    n = x.shape[-1] // 2
    a, b = x[..., :n], x[..., n:]
    y_case, cache = impl.geglu_forward(x)
    (dx,) = impl.geglu_backward(case.dout, cache)
    gelu_a = impl.geglu_forward(np.concatenate([a, np.ones_like(b)], axis=-1))[0]
    h.require([h.close("geglu", "GeGLU([a | 1]) = a Phi(a) at fixed points", y,
                       np.array([p * (1 + math.erf(p / math.sqrt(2))) / 2 for p in points])),
               h.close("geglu", "GeGLU([a | 3 b]) = 3 GeGLU([a | b])",
                       impl.geglu_forward(np.concatenate([a, 3 * b], axis=-1))[0], 3 * y_case),
               h.close("geglu", "d/db = dy GELU(a)", dx[..., n:], case.dout * gelu_a)])


OP = OpDeclaration(
    "geglu", after="silu", inputs=("x",), equations=("geglu.forward", "geglu.backward"),
    unguarded="erf is bounded and nothing is divided: nothing to keep finite",
    doc="geglu_forward(x [...,2n]) -> GELU(a) * b, a, b = x[..., :n], x[..., n:] (the erf "
        "GELU; torch's x.chunk(2, -1): the first half the gate)",
    families=(Family(_draw, _example, torch=_torch),),
    identities=(Identity("gelu_gate_times_value", geglu_is_a_gelu_gate_times_its_value,
                         options=dict(equations=("geglu.forward", "geglu.backward"))),),
    mutants=(
        Mutant("geglu_halves_swapped", "geglu.forward",
               "GeGLU gates the first half by the second, GELU(b) * a (diffusers' order read as "
               "torch's)", "ops._geglu_forward",
               (("a, b = x[..., :n], x[..., n:]", "b, a = x[..., :n], x[..., n:]"),)),
        Mutant("geglu_value_grad_without_gelu", "geglu.backward",
               "GeGLU's value-half gradient taken as dy alone: the GELU(a) factor lost",
               "ops._geglu_backward", (("dy * cache.gelu", "dy"),)),
    ),
    # no infer probe: a probe makes every module infer reads report GeGLU "not mapped" where it
    # has none (tests/examples/infer_layers.py maps every op it probes); its adapter row is
    # written by hand
    probe=None,
)
