"""The affine map ``y = x W + b`` over every leading axis."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from minibert_reference.ops._common import _rows, _sum_to_last
from minibert_reference.registry import implements
from minibert_reference.validate import as_float_array

# the public ops of this section: the package gathers them into minibert_reference.ops.__all__
__all__ = ["linear_forward", "linear_backward"]


# --------------------------------------------------------------------------- linear
class LinearCache(NamedTuple):
    x: np.ndarray  # [..., n_in]
    W: np.ndarray  # [n_in, n_out]
    has_b: bool


@implements("linear.forward")
def _linear_forward(x, W, b=None):
    """y = x @ W + b."""
    y = _rows(x) @ W  # [N, n_out]
    if b is not None:
        y += b
    return y.reshape(x.shape[:-1] + (W.shape[1],)), LinearCache(x, W, b is not None)


@implements("linear.backward.dx", "linear.backward.dW", "linear.backward.db")
def _linear_backward(dy, cache):
    """dx = dy @ W^T;  dW = x^T @ dy (summed over every leading axis);  db = sum(dy)."""
    x, W = cache.x, cache.W
    dx = (_rows(dy) @ W.T).reshape(x.shape)  # [..., n_in]
    dW = _rows(x).T @ _rows(dy)  # [n_in, n_out]
    db = _sum_to_last(dy) if cache.has_b else None  # [n_out]
    return dx, dW, db


def _check_linear(x, W, b, names=("x", "W", "b")) -> None:
    """x [..., n_in], W [n_in, n_out], b [n_out] or None; ``names`` as the caller calls them."""
    x_name, W_name, b_name = names
    as_float_array(x_name, x, min_ndim=1)
    as_float_array(W_name, W, ndim=2, dtype=x.dtype)
    if x.shape[-1] != W.shape[0]:
        raise ValueError(f"{W_name}: expected shape ({x.shape[-1]}, *) to match "
                         f"{x_name}'s last axis, got {W.shape}")
    if b is not None:
        as_float_array(b_name, b, shape=(W.shape[1],), dtype=x.dtype)


def linear_forward(x, W, b=None):
    """x [..., n_in], W [n_in, n_out], b [n_out] or None -> x @ W + b [..., n_out]."""
    _check_linear(x, W, b)
    return _linear_forward(x, W, b)


def linear_backward(dy, cache):
    x, W = cache.x, cache.W
    as_float_array("dy", dy, shape=x.shape[:-1] + (W.shape[1],), dtype=x.dtype)
    return _linear_backward(dy, cache)
