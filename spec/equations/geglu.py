"""GeGLU, GELU(a) * b with [a | b] the input's last axis split in halves (the erf GELU of
spec/equations/gelu.py), with its gradient derived by ``sympy.diff``.

None of the five documents uses a gated activation; Shazeer's "GLU variants improve
Transformer" (2020) and diffusers' GEGLU do, so it is a protocol op of its own: torch's
``a, b = x.chunk(2, -1)``, ``F.gelu(a) * b``, the first half the gate.
"""

from __future__ import annotations

import numpy as np
import sympy as sp

from minibert_spec.equations import Equation, Proof, register
from minibert_spec.equations._cache import maps_cache
from minibert_spec.equations._code import fb_checks
from minibert_spec.equations._sym import arr, forward_backward_maps, vjp
from minibert_spec.equations.gelu import gelu_erf
from minibert_spec.sources import PROTOCOL_VARIANTS

SIZES = ((1, 2), (2, 4))  # (rows, 2n) of the proofs and the SymPy <-> code checks


def geglu(x: np.ndarray) -> np.ndarray:
    """Rows x [..., 2n] (object array) -> GELU(a) * b, a = x[..., :n], b = x[..., n:]."""
    n = x.shape[-1] // 2
    return np.vectorize(gelu_erf, otypes=[object])(x[..., :n]) * x[..., n:]


def _prove() -> Proof:
    """sympy.diff of sum(dy * y) w.r.t. x equals [dy b (Phi(a) + a phi(a)) | dy GELU(a)]:
    the gate half through GELU's derivative, the value half times GELU(a)."""
    for rows, two_n in SIZES:
        x, dy = arr("x", rows, two_n), arr("dy", rows, two_n // 2)
        n = two_n // 2
        a, b = x[:, :n], x[:, n:]
        dgelu = np.vectorize(lambda v: (1 + sp.erf(v / sp.sqrt(2))) / 2
                             + v * sp.exp(-v ** 2 / 2) / sp.sqrt(2 * sp.pi), otypes=[object])
        closed = np.concatenate([dy * b * dgelu(a),
                                 dy * np.vectorize(gelu_erf, otypes=[object])(a)], axis=1)
        for derived, want in zip(vjp(geglu(x), dy, x).ravel(), closed.ravel()):
            gap = sp.simplify(derived - want)
            if gap != 0:
                return Proof("refuted", (rows, two_n), f"dx: difference {gap}")
    return Proof("proven", SIZES, "[dy b (Phi(a) + a phi(a)) | dy GELU(a)]")


# --------------------------------------------------------------------------- SymPy <-> code
@maps_cache
def _fns(shape):
    x, dy = arr("x", *shape), arr("dy", shape[0], shape[1] // 2)
    return forward_backward_maps(dict(x=x, dy=dy), geglu(x), dy, [x])


def _inputs(shape):
    return dict(x=("float", shape, 2.0), dy=("float", (shape[0], shape[1] // 2), 1.0))


FWD, BWD = fb_checks(SIZES, _inputs, lambda w: lambda s: _fns(s)[w], "geglu_forward",
                     "geglu_backward", ("x",), "dy", needs=("geglu_forward", "geglu_backward"))

register(Equation(
    "geglu.forward", "GeGLU (GELU-gated halves)", (PROTOCOL_VARIANTS,),
    r"\mathrm{GeGLU}(x) = \mathrm{GELU}(a) \odot b,\quad [a \mid b] = x",
    _prove, torch_op="torch.nn.functional.gelu(a) * b, a, b = x.chunk(2, -1)", numeric=FWD,
    note="the first half the gate (torch's chunk order); GELU the exact (erf) form",
    uses=("gelu.forward.erf",)))
register(Equation(
    "geglu.backward", "GeGLU gradient", (PROTOCOL_VARIANTS,),
    r"\frac{\partial L}{\partial x} = \left[\frac{\partial L}{\partial y} \odot b \odot "
    r"\mathrm{GELU}'(a) \ \middle|\ \frac{\partial L}{\partial y} \odot \mathrm{GELU}(a)\right]",
    _prove, gradient=True, torch_op="torch.nn.functional.gelu(a) * b, a, b = x.chunk(2, -1)",
    numeric=BWD, uses=("geglu.forward", "gelu.backward.erf")))
