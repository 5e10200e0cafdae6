"""microgpt's RMSNorm as its NumPy ports write it: no gain, the eps 1e-5 written in the code
(``x / sqrt(mean(x^2) + 1e-5)``), a forward returning ``(y, cache)`` and a hand-written backward
returning dx alone.  Three protocol lines name the pair (gamma None: there is none; eps: the
code's own) and ``CAPABILITIES`` declares the form: ``rmsnorm.gain`` False, ``rmsnorm.eps``
1e-5.

``build(bug)``: ``bug`` None is the correct pair (``correct``); ``"cube"`` plants the backward
bug of a port that differentiates the scale as ``-scale**2`` instead of ``-scale**3`` (right only
where mean(x^2) + eps = 1: ``buggy``).  tests/suite/test_rmsnorm_forms.py checks both."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

EPS = 1e-5


def rmsnorm(x):
    ms = np.mean(x**2, axis=-1, keepdims=True)
    scale = (ms + EPS) ** -0.5
    return x * scale, (x, scale)


def rmsnorm_backward(dout, cache, bug=None):
    x, scale = cache
    n = x.shape[-1]
    # d scale / d x_j = -scale^3 x_j / n
    power = 2 if bug == "cube" else 3
    return scale * dout - x * scale**power * np.sum(dout * x, axis=-1, keepdims=True) / n


# ----------------------------------------------------------------------------- the adapter
def build(bug: str | None = None) -> SimpleNamespace:
    return SimpleNamespace(
        CAPABILITIES={"rmsnorm": {"gain": False, "eps": EPS}},
        rmsnorm_forward=lambda x, gamma=None, eps=EPS: rmsnorm(x),
        rmsnorm_backward=lambda dy, cache: (rmsnorm_backward(dy, cache, bug), None),
    )


# ---------------------------------------- the correct and the buggy build (for the tests)
correct = build()
buggy = build("cube")
