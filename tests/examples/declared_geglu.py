"""A user's own op, declared (minibert_spec.ops): GeGLU, out = GELU(a) * b with [a | b] = x split
in halves along the last axis (Shazeer 2020, erf GELU), which no row of the op table has.

``BUG`` plants a backward bug a user could write (the derivative of GELU without its
x * phi(x) term, that of a gate a * Phi(a)'s first factor alone): FD and the oracle must be red
on it, naming d/dx, the index and both values; the correct module green.  ``make(bug)`` builds
a module-like namespace of either form, so one file serves both.
"""

from __future__ import annotations

import math
import types

import numpy as np

from minibert_spec import ops

CAPABILITIES: dict = {}
SQRT2 = math.sqrt(2.0)


def _erf(x):
    return np.vectorize(math.erf, otypes=[x.dtype])(x) if x.size else x


def make(bug: bool = False):
    def geglu_forward(x):
        if not isinstance(x, np.ndarray) or x.dtype.kind != "f":
            raise ValueError(f"x: expected a float array, got {getattr(x, 'dtype', type(x))}")
        if x.ndim != 2 or x.shape[-1] % 2:
            raise ValueError(f"x: expected shape (n, 2d), got {x.shape}")
        if not np.all(np.isfinite(x)):
            raise ValueError("x: expected finite entries, got NaN or inf")
        a, b = np.split(x, 2, axis=-1)
        cdf = 0.5 * (1.0 + _erf(a / x.dtype.type(SQRT2)))
        return a * cdf * b, (a, b, cdf)

    def geglu_backward(dout, cache):
        a, b, cdf = cache
        pdf = np.exp(-0.5 * a * a) / a.dtype.type(math.sqrt(2 * math.pi))
        dgelu = cdf if bug else cdf + a * pdf  # the bug: x * phi(x) left out
        return (np.concatenate([dout * b * dgelu, dout * a * cdf], axis=-1),)

    def twin(torch, F, x):
        a, b = x.chunk(2, dim=-1)
        return F.gelu(a) * b

    return types.SimpleNamespace(
        CAPABILITIES={}, geglu_forward=geglu_forward, geglu_backward=geglu_backward,
        OPS=[ops.declare("geglu", forward=geglu_forward, backward=geglu_backward,
                         args={"x": ops.array("n", "2*d")}, sizes={"n": (1, 3), "d": (1, 4)},
                         torch=twin)])


_correct = make()
geglu_forward, geglu_backward, OPS = _correct.geglu_forward, _correct.geglu_backward, _correct.OPS
buggy = make(bug=True)
