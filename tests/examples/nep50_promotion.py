"""A softmax with a temperature, scaled the way much real code scales attention scores,
``/ np.sqrt(d)`` with an int: under NumPy >= 2 (NEP 50) ``np.sqrt(TEMPERATURE)`` is a float64
NumPy scalar and the float32 scores become float64.  Everything else is right.  The suite
names the line and the fix (tests/suite/test_messages.py)."""

from __future__ import annotations

import numpy as np

TEMPERATURE = 1  # an int, as d is in scores / np.sqrt(d)


def softmax_forward(x, mask=None):
    s = x / np.sqrt(TEMPERATURE)  # float32 / float64 scalar -> float64 under NEP 50
    if mask is not None:
        s = np.where(mask, s, -np.inf)
    e = np.exp(s - s.max(-1, keepdims=True))
    p = e / e.sum(-1, keepdims=True)
    return p, p


def softmax_backward(dp, p):
    return (p * (dp - (p * dp).sum(-1, keepdims=True)),)
