"""Feed-forward networks: the two-layer MLP and the SwiGLU gate."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from minibert_reference.ops.activations import (
    GeluCache,
    Relu2Cache,
    ReluCache,
    SiLUCache,
    _activation_backward,
    _activation_forward,
    _check_activation,
    _silu_backward,
    _silu_forward,
)
from minibert_reference.ops.linear import LinearCache, _linear_backward, _linear_forward
from minibert_reference.registry import implements
from minibert_reference.validate import as_float_array

# the public ops of this section: the package gathers them into minibert_reference.ops.__all__
__all__ = [
    "ffn_forward", "ffn_backward", "swiglu_forward", "swiglu_backward", "FFN_PARAMS",
    "SWIGLU_PARAMS",
]

# --------------------------------------------------------------------------- feed-forward
FFN_PARAMS = ("W_1", "b_1", "W_2", "b_2")


class FFNCache(NamedTuple):
    lin_1: LinearCache  # h = x W_1 + b_1
    act: ReluCache | GeluCache | Relu2Cache  # a = act(h): ReLU (the documents), GELU (BERT) or
    # squared ReLU (Primer, the nanoGPT speedrun)
    lin_2: LinearCache  # y = a W_2 + b_2 (b_2 may be None: no second bias)


@implements("ffn.forward", "ffn.no_b2")
def _ffn_forward(x, W_1, b_1, W_2, b_2, activation: str = "relu"):
    """FFN(x) = act(x W_1 + b_1) W_2 + b_2, act ReLU (default), GELU or squared ReLU;
    ``b_1 = None`` or ``b_2 = None``: without that bias (its gradient is then None)."""
    h, c_1 = _linear_forward(x, W_1, b_1)  # [..., I]
    a, c_act = _activation_forward(h, activation)  # [..., I]
    y, c_2 = _linear_forward(a, W_2, b_2)  # [..., H]
    return y, FFNCache(lin_1=c_1, act=c_act, lin_2=c_2)


@implements("ffn.backward", "ffn.no_b2")
def _ffn_backward(dy, cache):
    """Returns (dx, dW_1, db_1, dW_2, db_2)."""
    da, dW_2, db_2 = _linear_backward(dy, cache.lin_2)  # [..., I]
    (dh,) = _activation_backward(da, cache.act)
    dx, dW_1, db_1 = _linear_backward(dh, cache.lin_1)  # [..., H]
    return dx, dW_1, db_1, dW_2, db_2


def _check_ffn_params(H: int, dtype, W_1, b_1, W_2, b_2, *, b_1_optional=False,
                      b_2_optional=False) -> None:
    as_float_array("W_1", W_1, shape=(H, None), dtype=dtype)
    I = W_1.shape[1]
    if b_1 is not None or not b_1_optional:
        as_float_array("b_1", b_1, shape=(I,), dtype=dtype)
    as_float_array("W_2", W_2, shape=(I, H), dtype=dtype)
    if b_2 is not None or not b_2_optional:
        as_float_array("b_2", b_2, shape=(H,), dtype=dtype)


def ffn_forward(x, W_1, b_1, W_2, b_2, activation: str = "relu"):
    """x [..., H], W_1 [H, I], b_1 [I] or None, W_2 [I, H], b_2 [H] or None -> [..., H];
    ``activation`` relu, gelu, gelu_tanh or relu2 (squared ReLU)."""
    as_float_array("x", x, min_ndim=1)
    _check_ffn_params(x.shape[-1], x.dtype, W_1, b_1, W_2, b_2, b_1_optional=True,
                      b_2_optional=True)
    _check_activation(activation)
    return _ffn_forward(x, W_1, b_1, W_2, b_2, activation)


def ffn_backward(dy, cache):
    x = cache.lin_1.x
    as_float_array("dy", dy, shape=x.shape, dtype=x.dtype)
    return _ffn_backward(dy, cache)


# --------------------------------------------------------------------------- SwiGLU FFN
# Meta's LLaMA names: W_1 the gate (Hugging Face gate_proj), W_3 the up projection (up_proj),
# W_2 the down projection (down_proj); the biases are optional (LLaMA has none)
SWIGLU_PARAMS = ("W_1", "W_2", "W_3", "b_1", "b_2", "b_3")


class SwiGLUCache(NamedTuple):
    gate: LinearCache  # h_1 = x W_1 + b_1  [..., I]
    act: SiLUCache  # silu(h_1)
    s: np.ndarray  # silu(h_1)  [..., I]
    up: LinearCache  # h_3 = x W_3 + b_3  [..., I]
    h_3: np.ndarray  # [..., I]
    down: LinearCache  # y = (s * h_3) W_2 + b_2  [..., H]


@implements("swiglu.forward")
def _swiglu_forward(x, W_1, W_2, W_3, b_1=None, b_2=None, b_3=None):
    """SwiGLU(x) = (silu(x W_1 + b_1) * (x W_3 + b_3)) W_2 + b_2 (Shazeer 2020; LLaMA's FFN):
    the protocol's linear and SiLU kernels composed."""
    h_1, c_gate = _linear_forward(x, W_1, b_1)  # [..., I]
    h_3, c_up = _linear_forward(x, W_3, b_3)  # [..., I]
    s, c_act = _silu_forward(h_1)
    y, c_down = _linear_forward(s * h_3, W_2, b_2)  # [..., H]
    return y, SwiGLUCache(c_gate, c_act, s, c_up, h_3, c_down)


@implements("swiglu.backward")
def _swiglu_backward(dy, cache):
    """Returns (dx, dW_1, dW_2, dW_3, db_1, db_2, db_3): dg = dy W_2^T splits at the product,
    dh_3 = dg * silu(h_1) and dh_1 = silu'(h_1) (dg * h_3); x feeds both branches, so dx sums
    them."""
    dg, dW_2, db_2 = _linear_backward(dy, cache.down)  # [..., I]
    dh_3 = dg * cache.s
    (dh_1,) = _silu_backward(dg * cache.h_3, cache.act)
    dx_gate, dW_1, db_1 = _linear_backward(dh_1, cache.gate)  # [..., H]
    dx_up, dW_3, db_3 = _linear_backward(dh_3, cache.up)
    return dx_gate + dx_up, dW_1, dW_2, dW_3, db_1, db_2, db_3


def swiglu_forward(x, W_1, W_2, W_3, b_1=None, b_2=None, b_3=None):
    """x [..., H], W_1, W_3 [H, I], W_2 [I, H], b_1, b_3 [I] and b_2 [H] or None ->
    (silu(x W_1 + b_1) * (x W_3 + b_3)) W_2 + b_2 [..., H]."""
    as_float_array("x", x, min_ndim=1)
    H, dtype = x.shape[-1], x.dtype
    as_float_array("W_1", W_1, shape=(H, None), dtype=dtype)
    I = W_1.shape[1]
    as_float_array("W_2", W_2, shape=(I, H), dtype=dtype)
    as_float_array("W_3", W_3, shape=(H, I), dtype=dtype)
    for name, b, n in (("b_1", b_1, I), ("b_2", b_2, H), ("b_3", b_3, I)):
        if b is not None:
            as_float_array(name, b, shape=(n,), dtype=dtype)
    return _swiglu_forward(x, W_1, W_2, W_3, b_1, b_2, b_3)


def swiglu_backward(dy, cache):
    x = cache.gate.x
    as_float_array("dy", dy, shape=x.shape, dtype=x.dtype)
    return _swiglu_backward(dy, cache)
