"""Rotary position embedding (RoPE): the two pairings of features and the rotation by position."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from minibert_reference.registry import implements
from minibert_reference.validate import as_float_array, as_index_array

# the public ops of this section: the package gathers them into minibert_reference.ops.__all__
__all__ = ["rope_forward", "rope_backward", "ROPE_CONVENTIONS"]

# --------------------------------------------------------------------------- RoPE
# which features a rotary embedding rotates together: "interleaved" pairs (2i, 2i+1) (the
# RoFormer paper, Meta's LLaMA as complex numbers, GPT-J), "half" pairs (i, i + d/2) (Hugging
# Face's rotate_half); pair i turns by the angle m theta_i at position m either way
ROPE_CONVENTIONS = ("interleaved", "half")


class RoPECache(NamedTuple):
    cos: np.ndarray  # cos(m theta_i)  [T, d/2], x's dtype
    sin: np.ndarray  # sin(m theta_i)  [T, d/2]
    convention: str  # which features pair up
    x_shape: tuple  # [..., T, d]


def _rope_angles(positions, d: int, base: float) -> np.ndarray:
    """m theta_i with theta_i = base^(-2i/d), i < d/2, in float64 (cast once, after cos and
    sin: the float32 and float64 rotations agree to rounding).  [T, d/2]"""
    theta = float(base) ** (-np.arange(0, d, 2, dtype=np.float64) / d)  # [d/2]
    return positions.astype(np.float64)[:, None] * theta[None, :]


def _rope_pairs(d: int, convention: str) -> tuple[slice, slice]:
    """The first and second member of every rotated pair, as slices of the feature axis."""
    if convention == "interleaved":
        return slice(0, d, 2), slice(1, d, 2)
    return slice(0, d // 2), slice(d // 2, d)


def _rotate(x, cos, sin, convention: str):
    """Each pair (x_a, x_b) turned by its angle: (x_a cos - x_b sin, x_a sin + x_b cos)."""
    a, b = _rope_pairs(x.shape[-1], convention)
    x_a, x_b = x[..., a], x[..., b]  # [..., T, d/2] each
    y = np.empty_like(x)
    y[..., a] = x_a * cos - x_b * sin
    y[..., b] = x_a * sin + x_b * cos
    return y


@implements("rope.forward.interleaved", "rope.forward.half")
def _rope_forward(x, positions, base: float = 10000.0, convention: str = "interleaved"):
    """y = R(m theta) x per position m: a rotation of each feature pair (RoFormer §3.2)."""
    angle = _rope_angles(positions, x.shape[-1], base)  # [T, d/2]
    cos, sin = np.cos(angle).astype(x.dtype), np.sin(angle).astype(x.dtype)
    return _rotate(x, cos, sin, convention), RoPECache(cos, sin, convention, x.shape)


@implements("rope.backward.interleaved", "rope.backward.half")
def _rope_backward(dy, cache):
    """dx = R(m theta)^T dy: a rotation is orthogonal, its transpose turns by the opposite
    angle (sin -> -sin)."""
    return (_rotate(dy, cache.cos, -cache.sin, cache.convention),)


def _rope_positions(positions, T: int) -> np.ndarray:
    """None -> 0..T-1; an int p0 -> p0..p0+T-1 (Meta's start_pos); else an int array [T]."""
    if positions is None:
        return np.arange(T)
    if isinstance(positions, (int, np.integer)) and not isinstance(positions, bool):
        if positions < 0:
            raise ValueError(f"positions: expected a start position >= 0, got {positions}")
        return np.arange(int(positions), int(positions) + T)
    return as_index_array("positions", positions, shape=(T,), low=0)


def _check_rope_base(base, name: str = "base") -> None:
    if isinstance(base, bool) or not isinstance(base, (int, float, np.integer, np.floating)) \
            or not (np.isfinite(base) and base > 1):
        raise ValueError(f"{name}: expected a finite number > 1, got {base!r}")


def rope_forward(x, positions=None, *, base: float = 10000.0, convention: str = "interleaved"):
    """x [..., T, d] (d even), positions [T] int >= 0, a start position, or None (0..T-1) ->
    x with each feature pair rotated by m base^(-2i/d) at position m [..., T, d]."""
    as_float_array("x", x, min_ndim=2)
    T, d = x.shape[-2:]
    if d % 2:
        raise ValueError(f"x: expected an even feature size d (RoPE rotates pairs), got shape "
                         f"{x.shape}")
    positions = _rope_positions(positions, T)
    _check_rope_base(base)
    if convention not in ROPE_CONVENTIONS:
        raise ValueError(f"convention: expected one of {ROPE_CONVENTIONS}, got {convention!r}")
    return _rope_forward(x, positions, base, convention)


def rope_backward(dy, cache):
    as_float_array("dy", dy, shape=cache.x_shape, dtype=cache.cos.dtype)
    return _rope_backward(dy, cache)
