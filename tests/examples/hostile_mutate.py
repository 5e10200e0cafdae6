"""Hostile adapter: ``relu_forward`` clamps its input in place (and backward scales dout in
place) -- correct values, but the caller's arrays change under it."""

from __future__ import annotations

import numpy as np

from tests.examples.classy_adapter import *  # noqa: F403


def relu_forward(x):
    mask = x > 0
    np.maximum(x, 0, out=x)  # the caller's array
    return x, mask


def relu_backward(dy, mask):
    dy *= mask  # the caller's upstream gradient
    return (dy,)
