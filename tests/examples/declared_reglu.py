"""A user's own op, declared (minibert_spec.ops): ReGLU, out = relu(a) * b with [a | b] = x split
in halves along the last axis (Shazeer 2020), which no row of the op table has (GeGLU, its GELU
sibling, is a built-in op: ``declare`` refuses that name).  ReGLU has a kink at a = 0: ``smooth=``
keeps the gate half that far from it that a central difference never crosses it.

``BUG`` plants a backward bug a user could write (relu's derivative with its inequality flipped,
a < 0 for a > 0, red at every entry of the gate half): FD and the oracle must be red on it,
naming d/dx, the index and both values; the correct module green.  ``make(bug)`` builds a
module-like namespace of either form, so one file serves both.
"""

from __future__ import annotations

import types

import numpy as np

from minibert_spec import ops

CAPABILITIES: dict = {}
KINK = 1e-3  # the gate half's distance from relu's kink (minibert_spec.tolerances.KINK_MARGIN)


def make(bug: bool = False):
    def reglu_forward(x):
        if not isinstance(x, np.ndarray) or x.dtype.kind != "f":
            raise ValueError(f"x: expected a float array, got {getattr(x, 'dtype', type(x))}")
        if x.ndim != 2 or x.shape[-1] % 2:
            raise ValueError(f"x: expected shape (n, 2d), got {x.shape}")
        if not np.all(np.isfinite(x)):
            raise ValueError("x: expected finite entries, got NaN or inf")
        a, b = np.split(x, 2, axis=-1)
        return np.maximum(a, 0) * b, (a, b)

    def reglu_backward(dout, cache):
        a, b = cache
        step = (a < 0) if bug else (a > 0)  # the bug: relu's derivative flipped
        return (np.concatenate([dout * b * step, dout * np.maximum(a, 0)], axis=-1),)

    def twin(torch, F, x):
        a, b = x.chunk(2, dim=-1)
        return F.relu(a) * b

    def smooth(x):
        return bool(np.all(np.abs(np.split(x, 2, axis=-1)[0]) > KINK))

    return types.SimpleNamespace(
        CAPABILITIES={}, reglu_forward=reglu_forward, reglu_backward=reglu_backward,
        OPS=[ops.declare("reglu", forward=reglu_forward, backward=reglu_backward,
                         args={"x": ops.array("n", "2*d")}, sizes={"n": (1, 3), "d": (1, 4)},
                         torch=twin, smooth=smooth)])


_correct = make()
reglu_forward, reglu_backward, OPS = _correct.reglu_forward, _correct.reglu_backward, _correct.OPS
buggy = make(bug=True)
