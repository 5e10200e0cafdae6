"""Op pairs, llm.c style: ``X_forward(...) -> (out, cache)``, ``X_backward(dout, cache) -> grads``.

Conventions
-----------
* Pure functions, no hidden state: everything backward needs travels in ``cache``, a
  ``typing.NamedTuple`` whose field names are the derivation's (``LayerNormCache(x_hat, rstd,
  gamma)``).  Backwards read the fields by name.  The cache is opaque to the adapter protocol:
  only this module reads it (and, for the reference only, the claims ledger).
* A backward returns a tuple with one gradient per differentiable input of the forward, in the
  forward's argument order (``None`` where an optional input such as a bias was ``None``).
* float32 and float64 go through the same code; the dtype of the inputs is the dtype of every
  output (no silent casts, mixing dtypes is a ValueError).
* Shapes in comments: B batch, T sequence, H hidden, A heads, d_k = H / A, I intermediate, V vocab.
* Equation IDs (``@implements``) name the derivation in ``spec/`` each function realises; they sit
  on the kernels, which hold the maths.

Validation at the edge: kernels and public ops
----------------------------------------------
Every op comes in two layers, side by side:

* ``_X_forward(...)`` / ``_X_backward(dout, cache)`` -- the *kernel*: the maths only, no argument
  checks.  Kernels call kernels.  Private to the ``minibert_reference`` package
  (``minibert_reference.model`` composes them), never part of ``__all__``.
* ``X_forward`` / ``X_backward`` -- the *public op* of the protocol: checks every argument once
  (a ValueError naming the argument, see ``minibert_reference.validate``) and calls its kernel.
  Argument checks shared with composite ops live in ``_check_X`` helpers.

A composite op (attention, ffn, block, pooler) checks its own arguments once and then runs kernels
only; ``minibert_reference.model.forward`` checks params, ids and mask once and then runs kernels
only.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from minibert_reference.registry import implements
from minibert_reference.validate import FLOAT_DTYPES, as_float_array, as_index_array, as_mask

__all__ = [
    "embedding_forward",
    "embedding_backward",
    "tied_embedding_forward",
    "tied_embedding_backward",
    "position_embedding_forward",
    "position_embedding_backward",
    "sinusoidal_encoding",
    "sinusoidal_position_forward",
    "sinusoidal_position_backward",
    "rope_forward",
    "rope_backward",
    "ROPE_CONVENTIONS",
    "linear_forward",
    "linear_backward",
    "layernorm_forward",
    "layernorm_backward",
    "rmsnorm_forward",
    "rmsnorm_backward",
    "softmax_forward",
    "softmax_backward",
    "softmax_jacobian",
    "relu_forward",
    "relu_backward",
    "tanh_forward",
    "tanh_backward",
    "gelu_forward",
    "gelu_backward",
    "silu_forward",
    "silu_backward",
    "token_type_embedding_forward",
    "token_type_embedding_backward",
    "embedding_ln_forward",
    "embedding_ln_backward",
    "mlm_head_forward",
    "mlm_head_backward",
    "classifier_forward",
    "classifier_backward",
    "ACTIVATIONS",
    "split_heads",
    "merge_heads",
    "attention_forward",
    "attention_backward",
    "ffn_forward",
    "ffn_backward",
    "swiglu_forward",
    "swiglu_backward",
    "block_param_names",
    "block_param_shapes",
    "block_forward",
    "block_backward",
    "pooler_forward",
    "pooler_backward",
    "cross_entropy_forward",
    "cross_entropy_backward",
    "next_token_cross_entropy_forward",
    "next_token_cross_entropy_backward",
    "linear_cross_entropy_forward",
    "linear_cross_entropy_backward",
    "mse_forward",
    "mse_backward",
    "IGNORE_INDEX",
    "ATTENTION_PARAMS",
    "FFN_PARAMS",
    "SWIGLU_PARAMS",
]

IGNORE_INDEX = -100


def _rows(a: np.ndarray) -> np.ndarray:
    """[..., n] -> [N, n], every leading axis flattened into rows (a view when ``a`` is
    contiguous).  Matrix products go through this: ``np.matmul`` of a [B, T, n] array runs one
    small GEMM per batch row (repacking the weight each time), 1.2-1.5x slower than one GEMM
    over all B*T rows (measured for every Mini-BERT projection)."""
    return a.reshape(-1, a.shape[-1])


def _sum_to_last(a: np.ndarray) -> np.ndarray:
    """Sum every leading axis: the gradient of a parameter broadcast over [*, n]."""
    return _rows(a).sum(axis=0)


# --------------------------------------------------------------------------- embeddings
class EmbeddingCache(NamedTuple):
    ids: np.ndarray  # [B, T]
    W_shape: tuple  # (V, H)
    dtype: np.dtype


@implements("embedding.forward")
def _embedding_forward(ids, W):
    """Token lookup ``E[b, t] = W[ids[b, t]]``."""
    return W[ids], EmbeddingCache(ids, W.shape, W.dtype)  # [B, T, H]


@implements("embedding.backward")
def _embedding_backward(dout, cache):
    """dW[v] = sum of dout over every position holding id v.

    ``np.add.at`` is unbuffered: a plain ``dW[ids] += dout`` keeps only one of repeated ids.
    """
    H = cache.W_shape[1]
    dW = np.zeros(cache.W_shape, dtype=cache.dtype)  # [V, H]
    np.add.at(dW, cache.ids.reshape(-1), dout.reshape(-1, H))
    return (dW,)


def embedding_forward(ids, W):
    """ids [B, T] int, W [V, H] -> W[ids] [B, T, H]."""
    as_float_array("W", W, ndim=2)
    as_index_array("ids", ids, low=0, high=W.shape[0])
    return _embedding_forward(ids, W)


def embedding_backward(dout, cache):
    as_float_array("dout", dout, shape=cache.ids.shape + (cache.W_shape[1],), dtype=cache.dtype)
    return _embedding_backward(dout, cache)


class TiedEmbeddingCache(NamedTuple):
    lookup: EmbeddingCache  # e = W_E[ids]
    head: LinearCache  # logits = h W_E^T, h = e + x (the linear kernel with W = W_E^T)


@implements("tied_embedding.forward")
def _tied_embedding_forward(ids, x, W_E):
    """One table used twice, as GPT-2 ties it: the token lookup e = W_E[ids] and the LM head
    logits = (e + x) W_E^T; x is what the body between them adds to the residual stream."""
    e, c_lookup = _embedding_forward(ids, W_E)  # [B, T, H]
    logits, c_head = _linear_forward(e + x, W_E.T)  # [B, T, V]
    return logits, TiedEmbeddingCache(c_lookup, c_head)


@implements("tied_embedding.backward")
def _tied_embedding_backward(dlogits, cache):
    """Returns (dx, dW_E): dh = dlogits W_E reaches x and, scattered by id, the lookup's rows;
    the head's share is dlogits^T h.  One table, two uses: dW_E is the sum of both shares."""
    dh, dW_head_T, _ = _linear_backward(dlogits, cache.head)  # [B, T, H], [H, V]
    (dW_lookup,) = _embedding_backward(dh, cache.lookup)  # [V, H]
    return dh, dW_lookup + dW_head_T.T


def tied_embedding_forward(ids, x, W_E):
    """ids [B, T] int in [0, V), x [B, T, H], W_E [V, H] -> (W_E[ids] + x) W_E^T [B, T, V]."""
    as_float_array("W_E", W_E, ndim=2)
    as_index_array("ids", ids, ndim=2, low=0, high=W_E.shape[0])
    as_float_array("x", x, shape=ids.shape + (W_E.shape[1],), dtype=W_E.dtype)
    return _tied_embedding_forward(ids, x, W_E)


def tied_embedding_backward(dlogits, cache):
    as_float_array("dlogits", dlogits, shape=cache.lookup.ids.shape + (cache.lookup.W_shape[0],),
                   dtype=cache.lookup.dtype)
    return _tied_embedding_backward(dlogits, cache)


class PositionEmbeddingCache(NamedTuple):
    x_shape: tuple  # (B, T, H)
    W_shape: tuple  # (T_max, H)
    dtype: np.dtype


@implements("position.learned.forward")
def _position_embedding_forward(x, W_pos):
    """Add learned positions: ``x[b, t] + W_pos[t]``."""
    T = x.shape[1]
    return x + W_pos[:T], PositionEmbeddingCache(x.shape, W_pos.shape, x.dtype)


@implements("position.learned.backward")
def _position_embedding_backward(dout, cache):
    """dx = dout; dW_pos[t] = sum_b dout[b, t] for t < T, 0 for unused positions."""
    T = cache.x_shape[1]
    dW_pos = np.zeros(cache.W_shape, dtype=dout.dtype)  # [T_max, H]
    dW_pos[:T] = dout.sum(axis=0)
    return dout, dW_pos


def position_embedding_forward(x, W_pos):
    """x [B, T, H], W_pos [T_max, H] -> x + W_pos[:T]."""
    as_float_array("x", x, ndim=3)
    as_float_array("W_pos", W_pos, ndim=2, dtype=x.dtype)
    B, T, H = x.shape
    if W_pos.shape[1] != H:
        raise ValueError(f"W_pos: expected shape (*, {H}) to match x, got {W_pos.shape}")
    if T > W_pos.shape[0]:
        raise ValueError(
            f"x: sequence length {T} exceeds the {W_pos.shape[0]} positions of W_pos")
    return _position_embedding_forward(x, W_pos)


def position_embedding_backward(dout, cache):
    as_float_array("dout", dout, shape=cache.x_shape, dtype=cache.dtype)
    return _position_embedding_backward(dout, cache)


@implements("position.sinusoidal")
def _sinusoidal_encoding(T: int, d: int, dtype=np.float64) -> np.ndarray:
    """PE[pos, 2i] = sin(pos / 10000^(2i/d)), PE[pos, 2i+1] = cos(pos / 10000^(2i/d)).  [T, d]

    Computed in float64 then cast once, so float32 and float64 tables agree to rounding.
    """
    pos = np.arange(T, dtype=np.float64)[:, None]  # [T, 1]
    two_i = np.arange(0, d, 2, dtype=np.float64)[None, :]  # [1, ceil(d/2)]
    angle = pos / np.power(10000.0, two_i / d)  # [T, ceil(d/2)]
    pe = np.empty((T, d), dtype=np.float64)
    pe[:, 0::2] = np.sin(angle)
    pe[:, 1::2] = np.cos(angle[:, : d // 2])
    return pe.astype(dtype)


def sinusoidal_encoding(T: int, d: int, dtype=np.float64) -> np.ndarray:
    for name, n in (("T", T), ("d", d)):
        if not isinstance(n, (int, np.integer)) or isinstance(n, bool) or n < 1:
            raise ValueError(f"{name}: expected a positive integer, got {n!r}")
    try:
        dt = np.dtype(dtype)
    except TypeError:
        raise ValueError(f"dtype: expected float32 or float64, got {dtype!r}") from None
    if dt not in FLOAT_DTYPES:  # an int table would be sin/cos rounded to 0 and +-1
        raise ValueError(f"dtype: expected float32 or float64, got {dt}")
    return _sinusoidal_encoding(int(T), int(d), dt)


class SinusoidalPositionCache(NamedTuple):
    x_shape: tuple  # (B, T, H)
    dtype: np.dtype


def _sinusoidal_position_forward(x):
    """x + PE (no parameters)."""
    B, T, H = x.shape
    return x + _sinusoidal_encoding(T, H, x.dtype), SinusoidalPositionCache(x.shape, x.dtype)


def _sinusoidal_position_backward(dout, cache):
    return (dout,)


def sinusoidal_position_forward(x):
    """x [B, T, H] -> x + PE."""
    as_float_array("x", x, ndim=3)
    return _sinusoidal_position_forward(x)


def sinusoidal_position_backward(dout, cache):
    as_float_array("dout", dout, shape=cache.x_shape, dtype=cache.dtype)
    return _sinusoidal_position_backward(dout, cache)


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


# ----------------------------------------------------------- BERT embeddings (token types, LN)
class TokenTypeCache(NamedTuple):
    type_ids: np.ndarray  # [B, T]
    W_shape: tuple  # (n_types, H)
    dtype: np.dtype


@implements("token_type.forward")
def _token_type_embedding_forward(x, type_ids, W_type):
    """Add segment embeddings: ``x[b, t] + W_type[type_ids[b, t]]``."""
    return x + W_type[type_ids], TokenTypeCache(type_ids, W_type.shape, x.dtype)


@implements("token_type.backward")
def _token_type_embedding_backward(dout, cache):
    """dx = dout; dW_type[s] = sum of dout over every position of segment s (a scatter-add:
    every row of a sentence shares its segment id)."""
    dW_type = np.zeros(cache.W_shape, dtype=cache.dtype)  # [n_types, H]
    np.add.at(dW_type, cache.type_ids.reshape(-1), dout.reshape(-1, cache.W_shape[1]))
    return dout, dW_type


def token_type_embedding_forward(x, type_ids, W_type):
    """x [B, T, H], type_ids [B, T] int in [0, n_types), W_type [n_types, H] -> [B, T, H]."""
    as_float_array("x", x, ndim=3)
    as_float_array("W_type", W_type, shape=(None, x.shape[2]), dtype=x.dtype)
    as_index_array("type_ids", type_ids, shape=x.shape[:2], low=0, high=W_type.shape[0])
    return _token_type_embedding_forward(x, type_ids, W_type)


def token_type_embedding_backward(dout, cache):
    as_float_array("dout", dout, shape=cache.type_ids.shape + (cache.W_shape[1],),
                   dtype=cache.dtype)
    return _token_type_embedding_backward(dout, cache)


class EmbeddingLNCache(NamedTuple):
    token: EmbeddingCache
    position: PositionEmbeddingCache
    token_type: TokenTypeCache
    ln: LayerNormCache


@implements("embedding_ln.forward")
def _embedding_ln_forward(ids, type_ids, W_word, W_pos, W_type, gamma, beta, eps=1e-12):
    """BERT's embedding layer: LN(W_word[ids] + W_pos[:T] + W_type[type_ids])."""
    e, c_tok = _embedding_forward(ids, W_word)  # [B, T, H]
    e, c_pos = _position_embedding_forward(e, W_pos)
    e, c_type = _token_type_embedding_forward(e, type_ids, W_type)
    y, c_ln = _layernorm_forward(e, gamma, beta, eps)
    return y, EmbeddingLNCache(c_tok, c_pos, c_type, c_ln)


@implements("embedding_ln.backward")
def _embedding_ln_backward(dy, cache):
    """Returns (dW_word, dW_pos, dW_type, dgamma, dbeta): the LayerNorm's input gradient
    reaches all three tables, each by its own scatter."""
    de, dgamma, dbeta = _layernorm_backward(dy, cache.ln)  # d(sum of the three) [B, T, H]
    de, dW_type = _token_type_embedding_backward(de, cache.token_type)
    de, dW_pos = _position_embedding_backward(de, cache.position)
    (dW_word,) = _embedding_backward(de, cache.token)
    return dW_word, dW_pos, dW_type, dgamma, dbeta


def _check_embedding_ln(ids, type_ids, W_word, W_pos, W_type, gamma, beta, eps):
    as_float_array("W_word", W_word, ndim=2)
    H, dtype = W_word.shape[1], W_word.dtype
    as_index_array("ids", ids, ndim=2, low=0, high=W_word.shape[0])
    as_float_array("W_pos", W_pos, shape=(None, H), dtype=dtype)
    if ids.shape[1] > W_pos.shape[0]:
        raise ValueError(f"ids: sequence length {ids.shape[1]} exceeds the {W_pos.shape[0]} "
                         "positions of W_pos")
    as_float_array("W_type", W_type, shape=(None, H), dtype=dtype)
    as_index_array("type_ids", type_ids, shape=ids.shape, low=0, high=W_type.shape[0])
    _check_layernorm_params(H, dtype, gamma, beta, eps)


def embedding_ln_forward(ids, type_ids, W_word, W_pos, W_type, gamma, beta, eps=1e-12):
    """ids, type_ids [B, T] int; W_word [V, H], W_pos [T_max, H], W_type [n_types, H],
    gamma, beta [H] -> LN(token + position + token type) [B, T, H]."""
    _check_embedding_ln(ids, type_ids, W_word, W_pos, W_type, gamma, beta, eps)
    return _embedding_ln_forward(ids, type_ids, W_word, W_pos, W_type, gamma, beta, eps)


def embedding_ln_backward(dy, cache):
    as_float_array("dy", dy, shape=cache.ln.x_hat.shape, dtype=cache.ln.x_hat.dtype)
    return _embedding_ln_backward(dy, cache)


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


# --------------------------------------------------------------------------- layernorm
class LayerNormCache(NamedTuple):
    x_hat: np.ndarray  # [..., N]
    rstd: np.ndarray  # 1 / sqrt(var + eps)  [..., 1]
    gamma: np.ndarray | None  # [N]; None without the affine map


@implements("layernorm.forward", "layernorm.plain")
def _layernorm_forward(x, gamma, beta, eps: float = 1e-12):
    """y = gamma * x_hat + beta, x_hat = (x - mu) / sqrt(var + eps), statistics over the last axis.

    var is the biased (1/N) variance, as in the Mini-BERT derivation and torch.nn.LayerNorm.
    ``gamma = beta = None``: no affine map, y = x_hat (torch's ``elementwise_affine=False``, the
    derivation at gamma = 1, beta = 0); ``eps = 0``: no guard (rows must not be constant).
    """
    eps = x.dtype.type(eps)
    with np.errstate(over="ignore"):  # an overflow is caught just below and redone exactly
        mu = x.mean(axis=-1, keepdims=True)  # [..., 1]
        x_mu = x - mu
        var = (x_mu * x_mu).mean(axis=-1, keepdims=True)  # [..., 1]
    if not np.isfinite(var).all() and np.isfinite(x).all():  # finite x, squares overflowed
        return _layernorm_forward_scaled(x, gamma, beta, eps)
    rstd = 1.0 / np.sqrt(var + eps)  # [..., 1]
    x_hat = np.multiply(x_mu, rstd, out=x_mu)  # in place: x_mu is this function's own array
    if gamma is None:  # no affine map: the output is x_hat (a copy: the cache keeps x_hat)
        return x_hat.copy(), LayerNormCache(x_hat, rstd, None)
    y = x_hat * gamma
    y += beta
    return y, LayerNormCache(x_hat, rstd, gamma)


def _layernorm_forward_scaled(x, gamma, beta, eps):
    """The LayerNorm of rows too large to square: without this a float32 row with |x| ~ 1e19
    squares to inf, rstd becomes 0 and the output is silently ``beta``.  Each row is multiplied
    by the power of two 2^-k that brings max|x| below 1 (exact), normalised, and rstd scaled
    back: the same x_hat, bit for bit, as the plain formula wherever that one does not
    overflow.  Only reached when the plain statistics came out non-finite (no extra pass over
    every input)."""
    _, exponent = np.frexp(np.abs(x).max(axis=-1, keepdims=True))
    scale = np.ldexp(np.ones(exponent.shape, dtype=x.dtype), -np.maximum(exponent, 0))
    y, cache = _layernorm_forward(x * scale, gamma, beta, eps * (scale * scale))
    return y, cache._replace(rstd=cache.rstd * scale)  # 1 / std of the unscaled x


@implements("layernorm.backward.dx", "layernorm.backward.dgamma", "layernorm.backward.dbeta",
            "layernorm.plain")
def _layernorm_backward(dy, cache):
    """dx = rstd * (g - mean(g) - x_hat * mean(g * x_hat)) with g = dy * gamma.

    gamma multiplies dy *before* the feature means: pulling it outside (as the Mini-BERT
    derivation §3.3 writes it) is only right when gamma is constant across features.
    """
    x_hat, rstd = cache.x_hat, cache.rstd
    g = dy if cache.gamma is None else dy * cache.gamma  # dL/dx_hat  [..., N]
    dx = g - g.mean(axis=-1, keepdims=True)
    dx -= x_hat * (g * x_hat).mean(axis=-1, keepdims=True)
    dx *= rstd
    if cache.gamma is None:  # no affine map: no gamma, no beta to differentiate
        return dx, None, None
    dgamma = _sum_to_last(dy * x_hat)  # [N]
    dbeta = _sum_to_last(dy)  # [N]
    return dx, dgamma, dbeta


def _check_eps(eps) -> None:
    if not (np.isfinite(eps) and eps >= 0):
        raise ValueError(f"eps: expected a finite value >= 0, got {eps}")


def _check_layernorm_params(N: int, dtype, gamma, beta, eps, *, affine_optional=False) -> None:
    """gamma, beta [N] of the input's dtype (both None: no affine map, where the op allows it);
    eps finite and >= 0."""
    if affine_optional and gamma is None and beta is None:
        _check_eps(eps)
        return
    if affine_optional and (gamma is None) != (beta is None):
        raise ValueError(f"gamma, beta: expected both arrays or both None, got gamma "
                         f"{'None' if gamma is None else 'an array'} and beta "
                         f"{'None' if beta is None else 'an array'}")
    as_float_array("gamma", gamma, shape=(N,), dtype=dtype)
    as_float_array("beta", beta, shape=(N,), dtype=dtype)
    _check_eps(eps)


def layernorm_forward(x, gamma, beta, eps: float = 1e-12):
    """x [..., N], gamma [N], beta [N] (both None: no affine map) -> gamma * x_hat + beta
    [..., N]."""
    as_float_array("x", x, min_ndim=1)
    _check_layernorm_params(x.shape[-1], x.dtype, gamma, beta, eps, affine_optional=True)
    return _layernorm_forward(x, gamma, beta, eps)


def layernorm_backward(dy, cache):
    as_float_array("dy", dy, shape=cache.x_hat.shape, dtype=cache.x_hat.dtype)
    return _layernorm_backward(dy, cache)


# --------------------------------------------------------------------------- RMSNorm
class RMSNormCache(NamedTuple):
    x_hat: np.ndarray  # x / rms  [..., N]
    rstd: np.ndarray  # 1 / rms = 1 / sqrt(mean(x^2) + eps)  [..., 1]
    gamma: np.ndarray  # [N]


@implements("rmsnorm.forward")
def _rmsnorm_forward(x, gamma, eps: float = 1e-6):
    """y = gamma * x / rms(x), rms = sqrt(mean(x^2) + eps) over the last axis: LayerNorm without
    the mean and without beta (LLaMA, T5; torch.nn.functional.rms_norm)."""
    rstd = 1.0 / np.sqrt((x * x).mean(axis=-1, keepdims=True) + x.dtype.type(eps))  # [..., 1]
    x_hat = x * rstd
    return x_hat * gamma, RMSNormCache(x_hat, rstd, gamma)


@implements("rmsnorm.backward.dx", "rmsnorm.backward.dgamma")
def _rmsnorm_backward(dy, cache):
    """dx = rstd * (g - x_hat * mean(g * x_hat)) with g = dy * gamma; dgamma = sum dy x_hat."""
    x_hat, rstd = cache.x_hat, cache.rstd
    g = dy * cache.gamma  # dL/dx_hat  [..., N]
    dx = g - x_hat * (g * x_hat).mean(axis=-1, keepdims=True)
    dx *= rstd
    return dx, _sum_to_last(dy * x_hat)


def rmsnorm_forward(x, gamma, eps: float = 1e-6):
    """x [..., N], gamma [N] -> gamma * x / sqrt(mean(x^2) + eps) [..., N]."""
    as_float_array("x", x, min_ndim=1)
    as_float_array("gamma", gamma, shape=(x.shape[-1],), dtype=x.dtype)
    _check_eps(eps)
    return _rmsnorm_forward(x, gamma, eps)


def rmsnorm_backward(dy, cache):
    as_float_array("dy", dy, shape=cache.x_hat.shape, dtype=cache.x_hat.dtype)
    return _rmsnorm_backward(dy, cache)


# --------------------------------------------------------------------------- softmax
class SoftmaxCache(NamedTuple):
    p: np.ndarray  # the probabilities [..., n]


@implements("softmax.forward")
def _softmax_forward(x, mask=None):
    """Stable softmax over the last axis: exp(x - max) / sum.  ``mask`` (bool, broadcastable to
    x) keeps True entries; False entries get probability exactly 0."""
    if mask is not None:
        x = np.where(mask, x, -np.inf)
    z = x - x.max(axis=-1, keepdims=True)  # max is finite: each row has a kept entry
    p = np.exp(z, out=z)  # e, in place (z is this function's own array)
    p /= p.sum(axis=-1, keepdims=True)
    return p, SoftmaxCache(p)


@implements("softmax.backward")
def _softmax_backward(dp, cache):
    """Jacobian-vector product: dx = p * (dp - sum(p * dp)).  Masked entries (p = 0) get 0."""
    p = cache.p
    return (p * (dp - (p * dp).sum(axis=-1, keepdims=True)),)


def softmax_forward(x, mask=None):
    """x [..., n], ``mask`` (bool or 0/1, x's shape; every row needs one True entry) or None."""
    as_float_array("x", x, min_ndim=1)
    if mask is not None:
        mask = as_mask("mask", mask, shape=x.shape)
        if not np.all(mask.any(axis=-1)):
            raise ValueError("mask: every row needs at least one True entry, got an all-False row")
    return _softmax_forward(x, mask)


def softmax_backward(dp, cache):
    as_float_array("dp", dp, shape=cache.p.shape, dtype=cache.p.dtype)
    return _softmax_backward(dp, cache)


@implements("softmax.jacobian")
def softmax_jacobian(p):
    """The full Jacobian dp_i/dx_j = p_i (delta_ij - p_j) from softmax outputs p [..., N] ->
    [..., N, N] (Mini-BERT derivation §3.2).  For inspection and tests: the backward uses the
    O(N) Jacobian-vector product above, never this O(N^2) matrix."""
    as_float_array("p", p, min_ndim=1)
    return p[..., :, None] * (np.eye(p.shape[-1], dtype=p.dtype) - p[..., None, :])


# --------------------------------------------------------------------------- relu / tanh
class ReluCache(NamedTuple):
    positive: np.ndarray  # x > 0 (bool: a quarter of float32's memory)
    dtype: np.dtype


@implements("relu.forward")
def _relu_forward(x):
    """max(0, x)."""
    return np.maximum(x, 0), ReluCache(x > 0, x.dtype)


@implements("relu.backward")
def _relu_backward(dy, cache):
    """dx = dy * [x > 0] (the subgradient at 0 is taken as 0, as torch does)."""
    return (dy * cache.positive,)


def relu_forward(x):
    as_float_array("x", x)
    return _relu_forward(x)


def relu_backward(dy, cache):
    as_float_array("dy", dy, shape=cache.positive.shape, dtype=cache.dtype)
    return _relu_backward(dy, cache)


class TanhCache(NamedTuple):
    y: np.ndarray  # tanh(x)


@implements("tanh.forward")
def _tanh_forward(x):
    y = np.tanh(x)
    return y, TanhCache(y)


@implements("tanh.backward")
def _tanh_backward(dy, cache):
    """dx = dy * (1 - tanh(x)^2)."""
    y = cache.y
    return (dy * (1 - y * y),)


def tanh_forward(x):
    as_float_array("x", x)
    return _tanh_forward(x)


def tanh_backward(dy, cache):
    as_float_array("dy", dy, shape=cache.y.shape, dtype=cache.y.dtype)
    return _tanh_backward(dy, cache)


# --------------------------------------------------------------------------- GELU
# "gelu": the exact form x Phi(x) with the normal CDF Phi(x) = (1 + erf(x / sqrt 2)) / 2 (BERT,
# Hugging Face hidden_act="gelu"); "gelu_tanh": the tanh approximation (hidden_act="gelu_new",
# torch's approximate="tanh").
ACTIVATIONS = ("relu", "gelu", "gelu_tanh")
_SQRT_HALF = math.sqrt(0.5)
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)
_TANH_C = math.sqrt(2.0 / math.pi)
_TANH_K = 0.044715

# NumPy has no erf.  erf is tabulated with the standard library's math.erf on a grid of step
# 1/64 over [0, 6] together with its derivatives, erf^(n)(x) = (-1)^(n-1) (2 / sqrt(pi))
# H_(n-1)(x) exp(-x^2) (H the physicists' Hermite polynomials), and evaluated as the degree-8
# Taylor polynomial about the nearest grid point (|d| <= 1/128: the truncation term is < 1e-20).
# Beyond 6, erf(x) = 1 in float64 (erfc(6) = 2e-17 < half an ulp of 1).  Measured against
# math.erf over [-7, 7]: at most 2 ulps (tests/reference/test_gelu_erf.py), 7x faster than math.erf
# element by element.
_ERF_STEPS, _ERF_XMAX, _ERF_ORDER = 64, 6.0, 8
_ERF_N = int(_ERF_XMAX * _ERF_STEPS)


def _erf_taylor_table() -> np.ndarray:
    """[order + 1, grid points]: row n holds erf^(n)(x0) / n! at x0 = j / 64."""
    table = np.empty((_ERF_ORDER + 1, _ERF_N + 1))
    for j in range(_ERF_N + 1):
        x = j / _ERF_STEPS
        table[0, j] = math.erf(x)
        g = 2.0 / math.sqrt(math.pi) * math.exp(-x * x)
        h_prev, h, fact = 0.0, 1.0, 1.0  # H_(n-2), H_(n-1), n!
        for n in range(1, _ERF_ORDER + 1):
            fact *= n
            table[n, j] = (-1) ** (n - 1) * g * h / fact
            h_prev, h = h, 2 * x * h - 2 * (n - 1) * h_prev
    return table


_ERF_TABLE = _erf_taylor_table()


def erf(x) -> np.ndarray:
    """The error function element by element, float64 (within 2 ulps of math.erf)."""
    x = np.asarray(x, dtype=np.float64)
    a = np.minimum(np.abs(x), _ERF_XMAX)  # no overflow for huge |x|: erf = +-1 there
    idx = np.rint(a * _ERF_STEPS).astype(np.intp)
    d = a - idx * (1.0 / _ERF_STEPS)
    y = _ERF_TABLE[_ERF_ORDER][idx]
    for n in range(_ERF_ORDER - 1, -1, -1):  # Horner in d
        y = y * d + _ERF_TABLE[n][idx]
    return np.copysign(np.where(a >= _ERF_XMAX, 1.0, y), x)


class GeluCache(NamedTuple):
    x: np.ndarray  # the input [...]
    cdf: np.ndarray  # Phi(x) ("gelu") or its tanh form (1 + tanh(u)) / 2 ("gelu_tanh")
    approximate: str  # "none" (erf) or "tanh"


@implements("gelu.forward.erf", "gelu.forward.tanh")
def _gelu_forward(x, approximate: str = "none"):
    """"none": x Phi(x), Phi(x) = (1 + erf(x / sqrt 2)) / 2;
    "tanh": x (1 + tanh(u)) / 2 with u = sqrt(2 / pi) (x + 0.044715 x^3), evaluated as
    x s with s = (1 + tanh(u)) / 2 = 1 / (1 + exp(-2u)): 1 + tanh(u) cancels for u << 0 (in
    float32 GELU(-5) came out 30% off, GELU(-6) as 0), the logistic form does not."""
    if approximate == "none":
        x64 = x.astype(np.float64, copy=False)
        cdf = (0.5 * (1.0 + erf(x64 * _SQRT_HALF))).astype(x.dtype)  # Phi(x)
        return x * cdf, GeluCache(x, cdf, approximate)
    c, k = x.dtype.type(_TANH_C), x.dtype.type(_TANH_K)
    u = c * (x + k * x * x * x)
    with np.errstate(over="ignore"):  # exp(-2u) = inf for u << 0: s = 0, as it should
        s = 1 / (1 + np.exp(-2 * u))  # (1 + tanh(u)) / 2
    return x * s, GeluCache(x, s, approximate)


@implements("gelu.backward.erf", "gelu.backward.tanh")
def _gelu_backward(dy, cache):
    """"none": dx = dy (Phi(x) + x phi(x)), phi the standard normal density;
    "tanh": dx = dy ((1 + t) / 2 + x (1 - t^2) sqrt(2 / pi) (1 + 3 * 0.044715 x^2) / 2) with
    t = tanh(u), evaluated as dy (s + 2 x s (1 - s) du/dx): (1 + t) / 2 = s and
    1 - t^2 = 4 s (1 - s)."""
    x = cache.x
    if cache.approximate == "none":
        pdf = (_INV_SQRT_2PI * np.exp(-0.5 * x.astype(np.float64) ** 2)).astype(x.dtype)
        return (dy * (cache.cdf + x * pdf),)
    s = cache.cdf
    c, k = x.dtype.type(_TANH_C), x.dtype.type(_TANH_K)
    du = c * (1 + 3 * k * x * x)
    return (dy * (s + 2 * x * s * (1 - s) * du),)


def _check_approximate(approximate) -> None:
    if approximate not in ("none", "tanh"):
        raise ValueError(f"approximate: expected 'none' or 'tanh', got {approximate!r}")


def gelu_forward(x, approximate: str = "none"):
    """x [...] -> GELU(x); ``approximate`` "none" (erf, exact) or "tanh"."""
    as_float_array("x", x)
    _check_approximate(approximate)
    return _gelu_forward(x, approximate)


def gelu_backward(dy, cache):
    as_float_array("dy", dy, shape=cache.x.shape, dtype=cache.x.dtype)
    return _gelu_backward(dy, cache)


# --------------------------------------------------------------------------- SiLU
class SiLUCache(NamedTuple):
    x: np.ndarray  # the input [...]
    s: np.ndarray  # sigmoid(x)


@implements("silu.forward")
def _silu_forward(x):
    """x sigmoid(x) (swish, LLaMA's gate activation; torch.nn.functional.silu), sigmoid(x) =
    1 / (1 + exp(-x)): exp(-x) overflows to inf for x << 0, and then s = 0, as it should."""
    with np.errstate(over="ignore"):
        s = 1 / (1 + np.exp(-x))
    return x * s, SiLUCache(x, s)


@implements("silu.backward")
def _silu_backward(dy, cache):
    """dx = dy * s (1 + x (1 - s)), s = sigmoid(x) (s' = s (1 - s))."""
    x, s = cache.x, cache.s
    return (dy * (s * (1 + x * (1 - s))),)


def silu_forward(x):
    """x [...] -> x sigmoid(x)."""
    as_float_array("x", x)
    return _silu_forward(x)


def silu_backward(dy, cache):
    as_float_array("dy", dy, shape=cache.x.shape, dtype=cache.x.dtype)
    return _silu_backward(dy, cache)


def _activation_forward(x, activation: str):
    """The FFN / MLM-transform nonlinearity by config name: relu, gelu (erf), gelu_tanh."""
    if activation == "relu":
        return _relu_forward(x)
    return _gelu_forward(x, "tanh" if activation == "gelu_tanh" else "none")


def _activation_backward(dy, cache):
    if isinstance(cache, ReluCache):
        return _relu_backward(dy, cache)
    return _gelu_backward(dy, cache)


def _check_activation(activation) -> None:
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation: expected one of {ACTIVATIONS}, got {activation!r}")


# --------------------------------------------------------------------------- attention
@implements("attention.split_heads", "attention.per_head")
def _split_heads(x, n_heads: int):
    """[B, T, H] -> [B, A, T, d_k]: head a owns features a*d_k:(a+1)*d_k."""
    B, T, H = x.shape
    return x.reshape(B, T, n_heads, H // n_heads).transpose(0, 2, 1, 3)


@implements("attention.merge_heads")
def _merge_heads(x):
    """[B, A, T, d_k] -> [B, T, H] (the inverse of split_heads, and its adjoint)."""
    B, A, T, d_k = x.shape
    return x.transpose(0, 2, 1, 3).reshape(B, T, A * d_k)


def split_heads(x, n_heads: int):
    as_float_array("x", x, ndim=3, finite=False)
    _check_heads(n_heads, x.shape[2])
    return _split_heads(x, n_heads)


def merge_heads(x):
    as_float_array("x", x, ndim=4, finite=False)
    return _merge_heads(x)


def _check_heads(n_heads, H: int) -> None:
    if (not isinstance(n_heads, (int, np.integer)) or isinstance(n_heads, bool) or n_heads < 1
            or H % n_heads):
        raise ValueError(f"n_heads: expected a positive divisor of H={H}, got {n_heads!r}")


ATTENTION_PARAMS = ("W_q", "W_k", "W_v", "W_o", "b_q", "b_k", "b_v", "b_o")


class AttentionCache(NamedTuple):
    n_heads: int
    scale: np.floating  # 1 / sqrt(d_k), in x's dtype
    q_h: np.ndarray  # Q split into heads [B, A, T, d_k] (a view of the fused projection)
    k_h: np.ndarray  # [B, A, T, d_k]
    v_h: np.ndarray  # [B, A, T, d_k]
    p: np.ndarray  # attention probabilities P = softmax(S) [B, A, T, T]
    qkv: LinearCache  # the fused projection x [W_q | W_k | W_v] + [b_q | b_k | b_v]
    has_b: tuple  # (b_q, b_k, b_v) given or not
    o: LinearCache | None  # the output projection; None without W_o (y = C)
    rope: RoPECache | None = None  # q_h, k_h turned by RoPE (then q_h, k_h are the turned ones)


def _fused_qkv(W_q, W_k, W_v, b_q, b_k, b_v):
    """[W_q | W_k | W_v] [H, 3H] and the concatenated biases (zeros for an absent one, None when
    all three are absent): Q, K and V in one GEMM instead of three."""
    W = np.concatenate((W_q, W_k, W_v), axis=1)
    biases = (b_q, b_k, b_v)
    if all(b is None for b in biases):
        return W, None
    return W, np.concatenate([np.zeros(W_q.shape[1], W_q.dtype) if b is None else b
                              for b in biases])


def _causal_mask(T: int) -> np.ndarray:
    """[T, T] bool, True where query i may attend key j: j <= i (no position sees a later one)."""
    return np.tril(np.ones((T, T), dtype=bool))


@implements("attention.qkv", "attention.scores", "attention.context", "attention.output",
            "attention.causal", "attention.noproj", "attention.single_head")
def _attention_forward(x, W_q, W_k, W_v, W_o, b_q=None, b_k=None, b_v=None, b_o=None, *,
                       n_heads: int, mask=None, causal: bool = False, rope: str | None = None,
                       rope_base: float = 10000.0):
    """Multi-head self-attention.

    Q = x W_q + b_q (likewise K, V)                       [B, T, H]
    S = Q_h K_h^T / sqrt(d_k), P = softmax(S) over keys     [B, A, T, T]
    C = P V_h, y = merge(C) W_o + b_o                     [B, T, H]
    ``mask`` [B, T] bool marks the keys that may be attended (key padding mask); ``causal``
    also hides every later key from each query (GPT's mask: P_ij = 0 for j > i).  ``W_o =
    None`` (and ``b_o = None``): no output projection, y = merge(C).  ``rope`` (a RoPE
    convention, "half" or "interleaved"): each head's Q_h and K_h turned by their position
    before the scores (LLaMA), so S_ij reads the positions through i - j only.
    Q, K and V come from one product x [W_q | W_k | W_v] (one GEMM of width 3H).
    """
    B, T, H = x.shape
    d_k = H // n_heads
    qkv, c_qkv = _linear_forward(x, *_fused_qkv(W_q, W_k, W_v, b_q, b_k, b_v))  # [B, T, 3H]
    q, k, v = qkv[..., :H], qkv[..., H:2 * H], qkv[..., 2 * H:]  # [B, T, H] views
    q_h, k_h, v_h = (_split_heads(t, n_heads) for t in (q, k, v))  # [B, A, T, d_k]
    c_rope = None
    if rope is not None:  # one rotation per position, the same for queries and keys
        q_h, c_rope = _rope_forward(q_h, np.arange(T), rope_base, rope)
        k_h, _ = _rope_forward(k_h, np.arange(T), rope_base, rope)
    scale = x.dtype.type(1.0 / np.sqrt(d_k))
    scores = q_h @ k_h.transpose(0, 1, 3, 2)  # [B, A, T, T]
    scores *= scale  # S
    key_mask = None if mask is None else mask[:, None, None, :]  # [B, 1, 1, T]: keys only
    if causal:  # [T, T] broadcast over batch and heads, and with the key mask
        key_mask = _causal_mask(T) if key_mask is None else key_mask & _causal_mask(T)
    p, _ = _softmax_forward(scores, key_mask)  # P [B, A, T, T]
    ctx = _merge_heads(p @ v_h)  # C [B, T, H]
    if W_o is None:  # no output projection: the merged heads are the output
        y, c_o = ctx, None
    else:
        y, c_o = _linear_forward(ctx, W_o, b_o)  # [B, T, H]
    return y, AttentionCache(n_heads=n_heads, scale=scale, q_h=q_h, k_h=k_h, v_h=v_h, p=p,
                             qkv=c_qkv, has_b=tuple(b is not None for b in (b_q, b_k, b_v)),
                             o=c_o, rope=c_rope)


@implements("attention.backward.dW_o", "attention.backward.dV", "attention.backward.dP",
            "attention.backward.dS", "attention.backward.dQ", "attention.backward.dK",
            "attention.backward.dx", "attention.noproj", "attention.single_head")
def _attention_backward(dy, cache):
    """Returns (dx, dW_q, dW_k, dW_v, dW_o, db_q, db_k, db_v, db_o); None for absent biases.

    dC = dy W_o^T;  dV_h = P^T dC_h;  dP = dC_h V_h^T;  dS = softmax JVP(dP);
    dQ_h = dS K_h / sqrt(d_k);  dK_h = dS^T Q_h / sqrt(d_k);  dx sums the three projections:
    dx = [dQ | dK | dV] [W_q | W_k | W_v]^T, one GEMM.
    """
    if cache.o is None:  # no output projection: dC = dy
        dctx, dW_o, db_o = dy, None, None
    else:
        dctx, dW_o, db_o = _linear_backward(dy, cache.o)  # dC [B, T, H]
    dctx_h = _split_heads(dctx, cache.n_heads)  # [B, A, T, d_k]
    dv_h = cache.p.transpose(0, 1, 3, 2) @ dctx_h  # dV_h = P^T dC_h  [B, A, T, d_k]
    dp = dctx_h @ cache.v_h.transpose(0, 1, 3, 2)  # dP = dC_h V_h^T  [B, A, T, T]
    (dscores,) = _softmax_backward(dp, SoftmaxCache(cache.p))  # dS [B, A, T, T]
    dscores *= cache.scale  # S = Q_h K_h^T * scale: both dQ_h and dK_h carry the scale
    dq_h = dscores @ cache.k_h  # [B, A, T, d_k]
    dk_h = dscores.transpose(0, 1, 3, 2) @ cache.q_h  # [B, A, T, d_k]
    if cache.rope is not None:  # back through the rotation of Q_h and K_h: its transpose
        (dq_h,) = _rope_backward(dq_h, cache.rope)
        (dk_h,) = _rope_backward(dk_h, cache.rope)
    dqkv = np.concatenate([_merge_heads(t) for t in (dq_h, dk_h, dv_h)], axis=-1)  # [B, T, 3H]
    dx, dW_qkv, db_qkv = _linear_backward(dqkv, cache.qkv)  # x feeds all three projections
    dW_q, dW_k, dW_v = (np.ascontiguousarray(w) for w in np.split(dW_qkv, 3, axis=1))
    db_parts = np.split(db_qkv, 3) if db_qkv is not None else (None,) * 3
    db_q, db_k, db_v = (db if given else None for db, given in zip(db_parts, cache.has_b))
    return dx, dW_q, dW_k, dW_v, dW_o, db_q, db_k, db_v, db_o


def _check_attention(x, W_q, W_k, W_v, W_o, b_q, b_k, b_v, b_o, n_heads, mask,
                     causal=False, rope=None, rope_base=10000.0):
    """Checks attention_forward's arguments; returns the mask as bool [B, T] (or None)."""
    as_float_array("x", x, ndim=3)
    B, T, H = x.shape
    if rope is not None:
        if rope not in ROPE_CONVENTIONS:
            raise ValueError(f"rope: expected None or one of {ROPE_CONVENTIONS}, got {rope!r}")
        if (H // n_heads if isinstance(n_heads, int) and n_heads > 0 else 1) % 2:
            raise ValueError(f"n_heads: RoPE turns pairs of a head's features, so d_k = H / "
                             f"n_heads must be even, got H={H}, n_heads={n_heads}")
        _check_rope_base(rope_base, "rope_base")
    for name, W in (("W_q", W_q), ("W_k", W_k), ("W_v", W_v), ("W_o", W_o)):
        if W is not None or name != "W_o":
            as_float_array(name, W, shape=(H, H), dtype=x.dtype)
    if W_o is None and b_o is not None:
        raise ValueError("b_o: expected None without an output projection (W_o is None), "
                         "got an array")
    _check_heads(n_heads, H)
    for name, b in (("b_q", b_q), ("b_k", b_k), ("b_v", b_v), ("b_o", b_o)):
        if b is not None:
            as_float_array(name, b, shape=(H,), dtype=x.dtype)
    if not isinstance(causal, (bool, np.bool_)):
        raise ValueError(f"causal: expected True or False, got {causal!r}")
    if mask is not None:
        mask = as_mask("mask", mask, shape=(B, T))
        if not np.all(mask.any(axis=-1)):
            raise ValueError("mask: every sequence needs at least one unmasked key, "
                             f"rows {np.flatnonzero(~mask.any(axis=-1)).tolist()} have none")
        if causal and not np.all(mask[:, 0]):
            raise ValueError("mask: with causal=True the first position attends key 0 alone, "
                             "so key 0 must be unmasked; sequences "
                             f"{np.flatnonzero(~mask[:, 0]).tolist()} mask it")
    return mask


def attention_forward(x, W_q, W_k, W_v, W_o, b_q=None, b_k=None, b_v=None, b_o=None, *,
                      n_heads: int, mask=None, causal: bool = False, rope: str | None = None,
                      rope_base: float = 10000.0):
    """x [B, T, H], W_* [H, H] (W_o may be None: no output projection), b_* [H] or None;
    ``mask`` [B, T] (bool or 0/1) marks the keys that may be attended; ``causal``: each
    position attends itself and earlier positions only; ``rope`` "half" or "interleaved":
    queries and keys turned by RoPE (positions 0..T-1, ``rope_base``) -> [B, T, H]."""
    mask = _check_attention(x, W_q, W_k, W_v, W_o, b_q, b_k, b_v, b_o, n_heads, mask, causal,
                            rope, rope_base)
    return _attention_forward(x, W_q, W_k, W_v, W_o, b_q, b_k, b_v, b_o, n_heads=n_heads,
                              mask=mask, causal=bool(causal), rope=rope, rope_base=rope_base)


def attention_backward(dy, cache):
    x = cache.qkv.x  # [B, T, H]: the output has the input's shape
    as_float_array("dy", dy, shape=x.shape, dtype=x.dtype)
    return _attention_backward(dy, cache)


# --------------------------------------------------------------------------- feed-forward
FFN_PARAMS = ("W_1", "b_1", "W_2", "b_2")


class FFNCache(NamedTuple):
    lin_1: LinearCache  # h = x W_1 + b_1
    act: ReluCache | GeluCache  # a = act(h): ReLU (the documents) or GELU (BERT)
    lin_2: LinearCache  # y = a W_2 + b_2 (b_2 may be None: no second bias)


@implements("ffn.forward", "ffn.no_b2")
def _ffn_forward(x, W_1, b_1, W_2, b_2, activation: str = "relu"):
    """FFN(x) = act(x W_1 + b_1) W_2 + b_2, act ReLU (default) or GELU; ``b_1 = None`` or
    ``b_2 = None``: without that bias (its gradient is then None)."""
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
    ``activation`` relu, gelu or gelu_tanh."""
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


# --------------------------------------------------------------------------- blocks
# where a block's LayerNorms sit: "post" (BERT, the documents), "pre" (GPT-2: x + MHA(LN1(x)),
# the residual stream never normalised), "pre_final" (pre-LN followed by the final
# LayerNorm ln_f that a pre-LN stack needs before its head: a one-block GPT) and "inner"
# (x + LN(f(x)): each sublayer's output normalised before the residual sum)
BLOCK_NORMS = ("post", "pre", "pre_final", "inner")
# which normalisation a block's ln1 / ln2 / ln_f are: LayerNorm (gamma, beta) or RMSNorm
# (gamma only: LLaMA)
BLOCK_NORMALIZATIONS = ("layernorm", "rmsnorm")
# the block's feed-forward part: the FFN (act(x W_1 + b_1) W_2 + b_2) or LLaMA's SwiGLU
BLOCK_FFNS = ("mlp", "swiglu")
# a block's parts and the prefix of their parameters in its dict ``p`` (the op table's rows)
BLOCK_PARTS = {"attention": "attn.", "ffn": "ffn.", "swiglu": "swiglu."}


def block_param_names(attn_bias: bool = True, norm: str = "post", *, W_o: bool = True,
                      b_1: bool = True, b_2: bool = True, normalization: str = "layernorm",
                      ffn: str = "mlp", swiglu_bias: bool = False) -> tuple[str, ...]:
    """Local parameter names of one block, in a fixed order: what its parts declare -- the
    attention's biases (``attn_bias``) and output projection (``W_o``), the feed-forward part
    (``ffn``: the FFN's ``ffn.*`` with its biases ``b_1``, ``b_2``, or SwiGLU's ``swiglu.*``,
    with biases when ``swiglu_bias``), LayerNorm's beta (absent for RMSNorm) -- and ``ln_f.*``
    for "pre_final".  The one definition: the block's check, the models' parameters and the
    suite's strategies read it."""
    attn = ("W_q", "W_k", "W_v") + (("W_o",) if W_o else ())
    if attn_bias:
        attn += ("b_q", "b_k", "b_v") + (("b_o",) if W_o else ())
    if ffn == "swiglu":
        mlp = tuple(f"swiglu.{n}" for n in ("W_1", "W_2", "W_3") + (
            ("b_1", "b_2", "b_3") if swiglu_bias else ()))
    else:
        mlp = tuple(f"ffn.{n}" for n in ("W_1",) + (("b_1",) if b_1 else ()) + ("W_2",)
                    + (("b_2",) if b_2 else ()))
    affine = ("gamma",) if normalization == "rmsnorm" else ("gamma", "beta")
    lns = ("ln1", "ln2") + (("ln_f",) if norm == "pre_final" else ())
    ln = {name: tuple(f"{name}.{a}" for a in affine) for name in lns}
    return tuple(f"attn.{n}" for n in attn) + ln["ln1"] + mlp + ln["ln2"] + ln.get("ln_f", ())


def block_param_shapes(names: tuple, H: int, I: int) -> dict[str, tuple[int, ...]]:
    """Name -> shape of a block's parameters ``names`` (block_param_names): the attention's
    weights [H, H], the FFN's W_1 [H, I], b_1 [I], W_2 [I, H] (SwiGLU's W_1, W_3 [H, I], b_1,
    b_3 [I], W_2 [I, H]); every other one [H]."""
    shapes = {"ffn.W_1": (H, I), "ffn.b_1": (I,), "ffn.W_2": (I, H), "swiglu.W_1": (H, I),
              "swiglu.W_3": (H, I), "swiglu.W_2": (I, H), "swiglu.b_1": (I,),
              "swiglu.b_3": (I,)}
    return {n: shapes.get(n, (H, H) if n.startswith("attn.W") else (H,)) for n in names}


def _block_variant(p: dict) -> dict:
    """The pieces a block's ``p`` carries, as ``block_param_names``' keywords (RMSNorm has no
    beta: with ``normalization`` "rmsnorm" there is none to look for)."""
    return {"attn_bias": "attn.b_q" in p, "W_o": "attn.W_o" in p, "b_1": "ffn.b_1" in p,
            "b_2": "ffn.b_2" in p, "swiglu_bias": "swiglu.b_1" in p}


def _norm_forward(x, p: dict, name: str, eps: float, normalization: str):
    """The block's normalisation ``name`` (ln1, ln2, ln_f): LayerNorm or RMSNorm."""
    if normalization == "rmsnorm":
        return _rmsnorm_forward(x, p[f"{name}.gamma"], eps)
    return _layernorm_forward(x, p[f"{name}.gamma"], p[f"{name}.beta"], eps)


def _norm_backward(dy, cache, name: str):
    """(dx, {name.gamma: .., name.beta: ..}) of one of the block's normalisations."""
    if isinstance(cache, RMSNormCache):
        dx, dgamma = _rmsnorm_backward(dy, cache)
        return dx, {f"{name}.gamma": dgamma}
    dx, dgamma, dbeta = _layernorm_backward(dy, cache)
    return dx, {f"{name}.gamma": dgamma, f"{name}.beta": dbeta}


def _attention_of(p: dict) -> list:
    """The attention's arguments from ``p``, in the op's order (None for absent pieces)."""
    return [p.get(f"attn.{n}") for n in ATTENTION_PARAMS]


def _ffn_of(p: dict) -> list:
    """The FFN's parameters from ``p``, in the op's order (None for an absent bias)."""
    return [p.get(f"ffn.{n}") for n in FFN_PARAMS]


def _mlp_forward(x, p: dict, activation: str, ffn: str):
    """The block's feed-forward part: the FFN, or SwiGLU (``ffn`` "swiglu")."""
    if ffn == "swiglu":
        return _swiglu_forward(x, *(p.get(f"swiglu.{n}") for n in SWIGLU_PARAMS))
    return _ffn_forward(x, *_ffn_of(p), activation)


def _mlp_backward(dy, cache):
    """(dx, its gradients keyed like the block's p) of the feed-forward part."""
    if isinstance(cache, SwiGLUCache):
        dx, *grads = _swiglu_backward(dy, cache)
        return dx, _part_grads("swiglu.", SWIGLU_PARAMS, grads)
    dx, *grads = _ffn_backward(dy, cache)
    return dx, _part_grads("ffn.", FFN_PARAMS, grads)


def _part_grads(prefix: str, names: tuple, grads) -> dict:
    return {f"{prefix}{n}": g for n, g in zip(names, grads)}


class BlockCache(NamedTuple):
    attn: AttentionCache
    ln1: LayerNormCache | RMSNormCache
    ffn: FFNCache | SwiGLUCache
    ln2: LayerNormCache | RMSNormCache
    names: tuple  # the keys of p, sorted


@implements("block.postln", "residual.forward")
def _block_forward(x, p: dict, *, n_heads: int, mask=None, eps: float = 1e-12,
                   activation: str = "relu", norm: str = "post", causal: bool = False,
                   normalization: str = "layernorm", ffn: str = "mlp", rope: str | None = None,
                   rope_base: float = 10000.0):
    """Post-LN encoder block (Mini-BERT derivation §2.5, BERT):

    h = LN1(x + MHA(x));  out = LN2(h + FFN(h)).
    ``p`` maps local names (``attn.W_q``, ``ln1.gamma``, ...) to arrays; a piece its parts
    leave out (``attn.W_o``, a bias) is absent.  ``norm`` "pre" or "pre_final": the pre-LN
    block (``_preln_block_forward``); ``causal``: causal attention; ``normalization``
    "rmsnorm": every LN is an RMSNorm; ``ffn`` "swiglu": the feed-forward part is SwiGLU
    (``swiglu.*``); ``rope``: the attention's queries and keys turned by RoPE.
    """
    attend = dict(n_heads=n_heads, mask=mask, causal=causal, rope=rope, rope_base=rope_base)
    if norm == "inner":
        return _innerln_block_forward(x, p, eps=eps, activation=activation,
                                      normalization=normalization, ffn=ffn, **attend)
    if norm != "post":
        return _preln_block_forward(x, p, eps=eps, activation=activation,
                                    normalization=normalization, ffn=ffn, **attend)
    a, c_attn = _attention_forward(x, *_attention_of(p), **attend)  # [B, T, H]
    h, c_ln1 = _norm_forward(x + a, p, "ln1", eps, normalization)
    f, c_ffn = _mlp_forward(h, p, activation, ffn)
    out, c_ln2 = _norm_forward(h + f, p, "ln2", eps, normalization)
    return out, BlockCache(attn=c_attn, ln1=c_ln1, ffn=c_ffn, ln2=c_ln2, names=tuple(sorted(p)))


@implements("residual.backward", "block.backward")
def _block_backward(dout, cache):
    """Returns (dx, grads) with grads keyed like the forward's ``p``.

    A residual sum passes its gradient unchanged to both branches: dx gets dr from the skip
    connection plus the attention branch's input gradient.
    """
    if isinstance(cache, PreLNBlockCache):
        return _preln_block_backward(dout, cache)
    if isinstance(cache, InnerLNBlockCache):
        return _innerln_block_backward(dout, cache)
    dr2, g2 = _norm_backward(dout, cache.ln2, "ln2")  # d(h + FFN(h))
    dh_ffn, dffn = _mlp_backward(dr2, cache.ffn)
    dh = dr2 + dh_ffn  # skip + FFN branch
    dr1, g1 = _norm_backward(dh, cache.ln1, "ln1")  # d(x + MHA(x))
    dx_attn, *dattn = _attention_backward(dr1, cache.attn)
    dx = dr1 + dx_attn  # skip + attention branch
    grads = {**_part_grads("attn.", ATTENTION_PARAMS, dattn), **dffn, **g1, **g2}
    return dx, {n: grads[n] for n in cache.names}


class PreLNBlockCache(NamedTuple):
    ln1: LayerNormCache | RMSNormCache
    attn: AttentionCache
    ln2: LayerNormCache | RMSNormCache
    ffn: FFNCache | SwiGLUCache
    ln_f: LayerNormCache | RMSNormCache | None  # the final LayerNorm ("pre_final"), else None
    names: tuple  # the keys of p, sorted


@implements("block.preln")
def _preln_block_forward(x, p: dict, *, n_heads: int, mask=None, eps: float = 1e-12,
                         activation: str = "relu", causal: bool = False,
                         normalization: str = "layernorm", ffn: str = "mlp",
                         rope: str | None = None, rope_base: float = 10000.0):
    """Pre-LN block (GPT-2; torch's ``norm_first=True``): each sublayer reads a LayerNorm of the
    residual stream and adds to it, the stream itself is never normalised:

    h = x + MHA(LN1(x));  out = h + FFN(LN2(h));  with ``ln_f.*`` in ``p``: out = LN_f(out).
    LLaMA's block: ``normalization`` "rmsnorm", ``ffn`` "swiglu", ``rope``.
    """
    n1, c_ln1 = _norm_forward(x, p, "ln1", eps, normalization)
    a, c_attn = _attention_forward(n1, *_attention_of(p), n_heads=n_heads, mask=mask,
                                   causal=causal, rope=rope, rope_base=rope_base)
    h = x + a  # [B, T, H]
    n2, c_ln2 = _norm_forward(h, p, "ln2", eps, normalization)
    f, c_ffn = _mlp_forward(n2, p, activation, ffn)
    out = h + f
    c_lnf = None
    if "ln_f.gamma" in p:
        out, c_lnf = _norm_forward(out, p, "ln_f", eps, normalization)
    return out, PreLNBlockCache(ln1=c_ln1, attn=c_attn, ln2=c_ln2, ffn=c_ffn, ln_f=c_lnf,
                                names=tuple(sorted(p)))


@implements("block.preln_backward")
def _preln_block_backward(dout, cache):
    """Returns (dx, grads).  The residual stream carries its gradient past both sublayers:
    dh = dout + LN2^T(FFN^T(dout)), dx = dh + LN1^T(MHA^T(dh)) (after LN_f^T with ``ln_f``)."""
    grads = {}
    if cache.ln_f is not None:
        dout, g_f = _norm_backward(dout, cache.ln_f, "ln_f")
        grads.update(g_f)
    dn2, dffn = _mlp_backward(dout, cache.ffn)
    dr2, g2 = _norm_backward(dn2, cache.ln2, "ln2")
    dh = dout + dr2  # skip + FFN branch
    dn1, *dattn = _attention_backward(dh, cache.attn)
    dr1, g1 = _norm_backward(dn1, cache.ln1, "ln1")
    dx = dh + dr1  # skip + attention branch
    grads.update({**_part_grads("attn.", ATTENTION_PARAMS, dattn), **dffn, **g1, **g2})
    return dx, {n: grads[n] for n in cache.names}


class InnerLNBlockCache(NamedTuple):
    attn: AttentionCache
    ln1: LayerNormCache | RMSNormCache
    ffn: FFNCache | SwiGLUCache
    ln2: LayerNormCache | RMSNormCache
    names: tuple  # the keys of p, sorted


@implements("block.innerln")
def _innerln_block_forward(x, p: dict, *, n_heads: int, mask=None, eps: float = 1e-12,
                           activation: str = "relu", causal: bool = False,
                           normalization: str = "layernorm", ffn: str = "mlp",
                           rope: str | None = None, rope_base: float = 10000.0):
    """The block with each sublayer's output normalised inside the residual branch (the form
    many from-scratch implementations write, ``x + norm(sublayer(x))``):

    h = x + LN1(MHA(x));  out = h + LN2(FFN(h))."""
    a, c_attn = _attention_forward(x, *_attention_of(p), n_heads=n_heads, mask=mask,
                                   causal=causal, rope=rope, rope_base=rope_base)
    n1, c_ln1 = _norm_forward(a, p, "ln1", eps, normalization)
    h = x + n1  # [B, T, H]
    f, c_ffn = _mlp_forward(h, p, activation, ffn)
    n2, c_ln2 = _norm_forward(f, p, "ln2", eps, normalization)
    return h + n2, InnerLNBlockCache(attn=c_attn, ln1=c_ln1, ffn=c_ffn, ln2=c_ln2,
                                     names=tuple(sorted(p)))


@implements("block.innerln_backward")
def _innerln_block_backward(dout, cache):
    """Returns (dx, grads): each residual sum hands its gradient to the skip unchanged and to
    the branch through LN^T then the sublayer^T: dh = dout + FFN^T(LN2^T(dout)), dx = dh +
    MHA^T(LN1^T(dh))."""
    dn2, g2 = _norm_backward(dout, cache.ln2, "ln2")
    dh_ffn, dffn = _mlp_backward(dn2, cache.ffn)
    dh = dout + dh_ffn  # skip + FFN branch
    dn1, g1 = _norm_backward(dh, cache.ln1, "ln1")
    dx_attn, *dattn = _attention_backward(dn1, cache.attn)
    dx = dh + dx_attn  # skip + attention branch
    grads = {**_part_grads("attn.", ATTENTION_PARAMS, dattn), **dffn, **g1, **g2}
    return dx, {n: grads[n] for n in cache.names}


def _check_block(x, p, n_heads, mask, eps, norm="post", causal=False,
                 normalization="layernorm", ffn="mlp", rope=None, rope_base=10000.0):
    """Checks block_forward's arguments; returns the mask as bool [B, T] (or None)."""
    if not isinstance(p, dict):
        raise ValueError(f"p: expected a dict of block parameters, got {type(p).__name__}")
    for name, value, allowed in (("norm", norm, BLOCK_NORMS),
                                 ("normalization", normalization, BLOCK_NORMALIZATIONS),
                                 ("ffn", ffn, BLOCK_FFNS)):
        if value not in allowed:
            raise ValueError(f"{name}: expected one of {allowed}, got {value!r}")
    variant = _block_variant(p)
    expected = set(block_param_names(norm=norm, normalization=normalization, ffn=ffn,
                                     **variant))
    if set(p) != expected:
        keywords = ", ".join(f"{k}={v}" for k, v in variant.items())
        raise ValueError(f"p: expected the keys of block_param_names({keywords}, norm={norm!r}, "
                         f"normalization={normalization!r}, ffn={ffn!r}); missing "
                         f"{sorted(expected - set(p))}, unexpected {sorted(set(p) - expected)}")
    mask = _check_attention(x, *_attention_of(p), n_heads, mask, causal, rope, rope_base)
    H = x.shape[-1]
    for ln in ("ln1", "ln2") + (("ln_f",) if norm == "pre_final" else ()):
        if normalization == "rmsnorm":
            as_float_array(f"{ln}.gamma", p[f"{ln}.gamma"], shape=(H,), dtype=x.dtype)
            _check_eps(eps)
        else:
            _check_layernorm_params(H, x.dtype, p[f"{ln}.gamma"], p[f"{ln}.beta"], eps)
    if ffn == "swiglu":
        for name, shape in block_param_shapes(tuple(n for n in p if n.startswith("swiglu.")),
                                              H, p["swiglu.W_1"].shape[-1]).items():
            as_float_array(name, p[name], shape=shape, dtype=x.dtype)
    else:
        _check_ffn_params(H, x.dtype, *_ffn_of(p), b_1_optional=True, b_2_optional=True)
    return mask


def block_forward(x, p: dict, *, n_heads: int, mask=None, eps: float = 1e-12,
                  activation: str = "relu", norm: str = "post", causal: bool = False,
                  normalization: str = "layernorm", ffn: str = "mlp", rope: str | None = None,
                  rope_base: float = 10000.0):
    """x [B, T, H], ``p`` a dict with the keys of ``block_param_names(...)`` (the pieces its
    parts have: without ``attn.W_o``/``attn.b_o``, attention biases, ``ffn.b_1``/``ffn.b_2``
    where they are absent) -> [B, T, H]; the FFN's ``activation`` relu (default), gelu or
    gelu_tanh; ``norm`` "post" (BERT), "pre" or "pre_final" (GPT-2, the latter with its final
    LayerNorm ``ln_f``), "inner" (x + LN(f(x))); ``causal`` attention; ``normalization``
    "layernorm" or "rmsnorm" (LLaMA: gamma only); ``ffn`` "swiglu" (LLaMA: ``swiglu.W_1``,
    ``W_2``, ``W_3``, biases optional); ``rope`` "half" or "interleaved" (RoPE on queries and
    keys, ``rope_base``)."""
    mask = _check_block(x, p, n_heads, mask, eps, norm, causal, normalization, ffn, rope,
                        rope_base)
    _check_activation(activation)
    return _block_forward(x, p, n_heads=n_heads, mask=mask, eps=eps, activation=activation,
                          norm=norm, causal=bool(causal), normalization=normalization, ffn=ffn,
                          rope=rope, rope_base=rope_base)


def block_backward(dout, cache):
    x = cache.attn.qkv.x if isinstance(cache, (BlockCache, InnerLNBlockCache)) else \
        cache.ln1.x_hat
    as_float_array("dout", dout, shape=x.shape, dtype=x.dtype)
    return _block_backward(dout, cache)


# ----------------------------------------------------------------- pooler (BERT-base blog)
class PoolerCache(NamedTuple):
    h_shape: tuple  # (B, T, H)
    lin: LinearCache
    tanh: TanhCache


@implements("pooler.forward")
def _pooler_forward(h, W, b=None):
    """Classification pooler: tanh(h[:, 0] W + b) on the first ([CLS]) token (BERT-base
    forward-pass blog)."""
    z, c_lin = _linear_forward(h[:, 0], W, b)  # [B, H]
    y, c_tanh = _tanh_forward(z)
    return y, PoolerCache(h.shape, c_lin, c_tanh)


def _pooler_backward(dy, cache):
    """Returns (dh, dW, db); dh is zero except at position 0."""
    (dz,) = _tanh_backward(dy, cache.tanh)
    dh0, dW, db = _linear_backward(dz, cache.lin)  # dh0 [B, H]
    dh = np.zeros(cache.h_shape, dtype=dh0.dtype)  # [B, T, H]
    dh[:, 0] = dh0
    return dh, dW, db


def pooler_forward(h, W, b=None):
    """h [B, T, H], W [H, H], b [H] or None -> [B, H]."""
    as_float_array("h", h, ndim=3)
    _check_linear(h[:, 0], W, b)
    return _pooler_forward(h, W, b)


def pooler_backward(dy, cache):
    y = cache.tanh.y
    as_float_array("dy", dy, shape=y.shape, dtype=y.dtype)
    return _pooler_backward(dy, cache)


# ------------------------------------------------------------- BERT MLM head, classifier
class MLMHeadCache(NamedTuple):
    transform: LinearCache  # z = h W_t + b_t
    act: ReluCache | GeluCache  # a = act(z)
    ln: LayerNormCache  # n = LN(a)
    n: np.ndarray  # [..., H]
    W_word: np.ndarray  # the tied decoder weight [V, H]


@implements("mlm_head.forward")
def _mlm_head_forward(h, W_t, b_t, gamma, beta, W_word, b_dec, *, eps=1e-12,
                      activation="gelu"):
    """BERT's MLM head: logits = LN(act(h W_t + b_t)) W_word^T + b_dec, the decoder tied to the
    word embeddings W_word [V, H]."""
    z, c_t = _linear_forward(h, W_t, b_t)  # [..., H]
    a, c_act = _activation_forward(z, activation)
    n, c_ln = _layernorm_forward(a, gamma, beta, eps)
    logits = _rows(n) @ W_word.T  # [N, V]
    logits += b_dec
    logits = logits.reshape(n.shape[:-1] + (W_word.shape[0],))  # [..., V]
    return logits, MLMHeadCache(c_t, c_act, c_ln, n, W_word)


@implements("mlm_head.backward", "mlm_head.decoder")
def _mlm_head_backward(dlogits, cache):
    """Returns (dh, dW_t, db_t, dgamma, dbeta, dW_word, db_dec).  dW_word = dlogits^T n is the
    decoder's share only: the model adds the embedding lookup's share (one tied tensor)."""
    dn = (_rows(dlogits) @ cache.W_word).reshape(cache.n.shape)  # [..., H]
    dW_word = _rows(dlogits).T @ _rows(cache.n)  # [V, H]
    db_dec = _sum_to_last(dlogits)  # [V]
    da, dgamma, dbeta = _layernorm_backward(dn, cache.ln)
    (dz,) = _activation_backward(da, cache.act)
    dh, dW_t, db_t = _linear_backward(dz, cache.transform)
    return dh, dW_t, db_t, dgamma, dbeta, dW_word, db_dec


def mlm_head_forward(h, W_t, b_t, gamma, beta, W_word, b_dec, *, eps=1e-12,
                     activation="gelu"):
    """h [..., H], W_t [H, H], b_t [H], gamma, beta [H], W_word [V, H], b_dec [V] ->
    logits [..., V]."""
    as_float_array("h", h, min_ndim=1)
    H, dtype = h.shape[-1], h.dtype
    as_float_array("W_t", W_t, shape=(H, H), dtype=dtype)
    as_float_array("b_t", b_t, shape=(H,), dtype=dtype)
    _check_layernorm_params(H, dtype, gamma, beta, eps)
    as_float_array("W_word", W_word, shape=(None, H), dtype=dtype)
    as_float_array("b_dec", b_dec, shape=(W_word.shape[0],), dtype=dtype)
    _check_activation(activation)
    return _mlm_head_forward(h, W_t, b_t, gamma, beta, W_word, b_dec, eps=eps,
                             activation=activation)


def mlm_head_backward(dlogits, cache):
    n = cache.n
    as_float_array("dlogits", dlogits, shape=n.shape[:-1] + (cache.W_word.shape[0],),
                   dtype=n.dtype)
    return _mlm_head_backward(dlogits, cache)


class ClassifierCache(NamedTuple):
    pooler: PoolerCache
    lin: LinearCache  # logits = pooled W_c + b_c


@implements("classifier.forward")
def _classifier_forward(h, W_p, b_p, W_c, b_c):
    """Sequence classifier on the pooler (BERT-base blog): tanh(h[:, 0] W_p + b_p) W_c + b_c."""
    pooled, c_pool = _pooler_forward(h, W_p, b_p)  # [B, H]
    logits, c_lin = _linear_forward(pooled, W_c, b_c)  # [B, C]
    return logits, ClassifierCache(c_pool, c_lin)


@implements("classifier.backward")
def _classifier_backward(dlogits, cache):
    """Returns (dh, dW_p, db_p, dW_c, db_c)."""
    dpooled, dW_c, db_c = _linear_backward(dlogits, cache.lin)
    dh, dW_p, db_p = _pooler_backward(dpooled, cache.pooler)
    return dh, dW_p, db_p, dW_c, db_c


def classifier_forward(h, W_p, b_p, W_c, b_c):
    """h [B, T, H], W_p [H, H], b_p [H], W_c [H, C], b_c [C] -> logits [B, C]."""
    as_float_array("h", h, ndim=3)
    _check_linear(h[:, 0], W_p, b_p, names=("h", "W_p", "b_p"))
    as_float_array("W_c", W_c, shape=(h.shape[2], None), dtype=h.dtype)
    as_float_array("b_c", b_c, shape=(W_c.shape[1],), dtype=h.dtype)
    return _classifier_forward(h, W_p, b_p, W_c, b_c)


def classifier_backward(dlogits, cache):
    pooled = cache.lin.x
    as_float_array("dlogits", dlogits, shape=(pooled.shape[0], cache.lin.W.shape[1]),
                   dtype=pooled.dtype)
    return _classifier_backward(dlogits, cache)


# --------------------------------------------------------------------------- losses
class CrossEntropyCache(NamedTuple):
    e: np.ndarray  # exp(logits - max), row by row [..., V]; softmax p = e / s
    s: np.ndarray  # the row sums of e [..., 1] (>= 1: the max entry contributes exp(0))
    safe: np.ndarray  # labels with ignore_index replaced by 0 [...]
    valid: np.ndarray  # labels != ignore_index [...]
    denom: int  # N_masked ("mean") or 1 ("sum")


@implements("loss.ce.mean", "loss.ce.sum")
def _cross_entropy_forward(logits, labels, *, ignore_index: int = IGNORE_INDEX,
                           reduction: str = "mean"):
    """Masked cross-entropy.  ``ignore_index`` marks positions not predicted.

    "mean": -sum_{masked} log p[label] / N_masked  (Mini-BERT derivation §4.1)
    "sum":  -sum_{masked} log p[label]             (BERT masked-LM slides)
    with log p[label] = z[label] - log(sum(exp(z))), z = logits - max (the max shift keeps
    exp from overflowing).  Four passes over [..., V]: max, shift, exp (in place), sum -- the
    log-softmax itself is never materialised, only its [..., 1] normaliser.
    """
    valid = labels != ignore_index  # [...]
    n = int(valid.sum())
    safe = np.where(valid, labels, 0)
    z_max = logits.max(axis=-1, keepdims=True)  # [..., 1]
    e = np.subtract(logits, z_max)  # z  [..., V]
    z_label = np.take_along_axis(e, safe[..., None], axis=-1)[..., 0]  # [...]
    np.exp(e, out=e)  # e = exp(z), in [0, 1]
    s = e.sum(axis=-1, keepdims=True)  # [..., 1]
    picked = z_label - np.log(s[..., 0])  # log p[label]  [...]
    # where, not picked * valid: an ignored row's log-probability may be -inf (extreme logits),
    # and -inf * 0 is NaN
    total = -np.where(valid, picked, 0).sum(dtype=logits.dtype)
    denom = n if reduction == "mean" else 1
    loss = logits.dtype.type(total / denom)
    return loss, CrossEntropyCache(e, s, safe, valid, denom)


@implements("loss.ce.backward.mean", "loss.ce.backward.sum")
def _cross_entropy_backward(dloss, cache):
    """dlogits = dloss * (softmax(logits) - onehot(label)) * valid / N (N = 1 for "sum"),
    computed as e * (w / s) with w = dloss * valid / N per row, then w subtracted at the label:
    one pass over [..., V].  ``dloss`` is a scalar of the logits' dtype."""
    dtype = cache.e.dtype
    w = (cache.valid * (dloss / cache.denom)).astype(dtype)[..., None]  # [..., 1]
    dlogits = cache.e * (w / cache.s)  # w p  [..., V]
    safe = cache.safe[..., None]
    np.put_along_axis(dlogits, safe, np.take_along_axis(dlogits, safe, axis=-1) - w, axis=-1)
    return (dlogits,)


def _check_ce_labels(labels, shape, V: int, ignore_index, reduction) -> None:
    """labels [...] (logits' leading shape) in [0, V) or ``ignore_index``; a mean needs one."""
    if reduction not in ("mean", "sum"):
        raise ValueError(f"reduction: expected 'mean' or 'sum', got {reduction!r}")
    as_index_array("labels", labels, shape=shape, low=0, high=V, allow=(ignore_index,))
    if reduction == "mean" and not np.any(labels != ignore_index):
        raise ValueError(f"labels: the mean needs at least one position != ignore_index "
                         f"({ignore_index}), got none among {labels.size}")


# what cross_entropy_forward's first argument is, and what its backward differentiates:
# "logits" (the protocol's), "probabilities" (softmax output p; the backward returns dL/dp)
# and "probabilities_dlogits" (p in, the backward returns the logit gradient of softmax + CE
# composed, p - onehot: the shape of many hand-written losses)
CE_INPUTS = ("logits", "probabilities", "probabilities_dlogits")


class ProbsCrossEntropyCache(NamedTuple):
    p: np.ndarray  # the probabilities [..., V]
    p_label: np.ndarray  # p at each label (1 where ignored) [...]
    safe: np.ndarray  # labels with ignore_index replaced by 0 [...]
    valid: np.ndarray  # labels != ignore_index [...]
    denom: int  # N_masked ("mean") or 1 ("sum")
    dlogits: bool  # the backward returns the logit gradient (p - onehot), not dL/dp


@implements("loss.ce.probs")
def _cross_entropy_probs_forward(p, labels, *, ignore_index: int = IGNORE_INDEX,
                                 reduction: str = "mean", dlogits: bool = False):
    """The cross-entropy of probabilities: -sum_{masked} log p[label] / N_masked (or the sum),
    p the softmax output (the loss of ``_cross_entropy_forward`` at p = softmax(logits))."""
    valid = labels != ignore_index  # [...]
    safe = np.where(valid, labels, 0)
    p_label = np.where(valid, np.take_along_axis(p, safe[..., None], axis=-1)[..., 0], 1)
    total = -np.log(p_label).sum(dtype=p.dtype)  # ignored rows: log 1 = 0
    denom = int(valid.sum()) if reduction == "mean" else 1
    loss = p.dtype.type(total / denom)
    return loss, ProbsCrossEntropyCache(p, p_label.astype(p.dtype), safe, valid, denom, dlogits)


@implements("loss.ce.probs_dp", "loss.ce.probs_dlogits")
def _cross_entropy_probs_backward(dloss, cache):
    """dL/dp = -w / p[label] at the label, 0 elsewhere (w = dloss * valid / N per row); or, for
    the composed form, the logit gradient w (p - onehot(label)) that softmax's backward turns
    dL/dp into (spec/equations/loss.py proves the two agree)."""
    w = (cache.valid * (dloss / cache.denom)).astype(cache.p.dtype)  # [...]
    safe = cache.safe[..., None]
    if cache.dlogits:
        d = cache.p * w[..., None]  # w p  [..., V]
        np.put_along_axis(d, safe, np.take_along_axis(d, safe, axis=-1) - w[..., None], axis=-1)
        return (d,)
    dp = np.zeros_like(cache.p)
    np.put_along_axis(dp, safe, (-w / cache.p_label)[..., None], axis=-1)
    return (dp,)


def cross_entropy_forward(logits, labels, *, ignore_index: int = IGNORE_INDEX,
                          reduction: str = "mean", input: str = "logits"):
    """logits [..., V], labels [...] int -> scalar.  ``input``: what the first argument is
    (CE_INPUTS): logits, or probabilities (softmax output, every entry > 0) whose backward returns
    dL/dp ("probabilities") or the composed logit gradient ("probabilities_dlogits")."""
    if input not in CE_INPUTS:
        raise ValueError(f"input: expected one of {CE_INPUTS}, got {input!r}")
    as_float_array("logits", logits, min_ndim=1)
    _check_ce_labels(labels, logits.shape[:-1], logits.shape[-1], ignore_index, reduction)
    if input != "logits":
        _check_probabilities("logits", logits)
        return _cross_entropy_probs_forward(logits, labels, ignore_index=ignore_index,
                                            reduction=reduction,
                                            dlogits=input == "probabilities_dlogits")
    return _cross_entropy_forward(logits, labels, ignore_index=ignore_index, reduction=reduction)


def _check_probabilities(name: str, p) -> None:
    """Probabilities: every entry > 0 (log p must be finite).  Rows are not required to sum to
    1: the loss -log p[label] is defined off the simplex (finite differences step off it)."""
    if not np.all(p > 0):
        raise ValueError(f"{name}: expected probabilities > 0 (input='probabilities'), got "
                         f"min {float(np.min(p)):.3g}")


def cross_entropy_backward(dloss, cache):
    if isinstance(cache, ProbsCrossEntropyCache):
        return _cross_entropy_probs_backward(_scalar("dloss", dloss, cache.p.dtype), cache)
    return _cross_entropy_backward(_scalar("dloss", dloss, cache.e.dtype), cache)


# ------------------------------------------------------- next-token (shifted) cross-entropy
class NextTokenCache(NamedTuple):
    ce: CrossEntropyCache  # the cross-entropy of logits[..., :-1, :] against ids[..., 1:]
    shape: tuple  # the logits' [..., T, V]


@implements("next_token.forward")
def _next_token_cross_entropy_forward(logits, ids, *, ignore_index: int = IGNORE_INDEX,
                                      reduction: str = "mean"):
    """A causal language model's loss: position t predicts token t + 1, so the cross-entropy of
    logits[..., :-1, :] against ids[..., 1:] (GPT-2, LLaMA); the last position predicts
    nothing, and the first token is never a target.  "mean" over the predicted positions."""
    loss, ce = _cross_entropy_forward(logits[..., :-1, :], ids[..., 1:],
                                      ignore_index=ignore_index, reduction=reduction)
    return loss, NextTokenCache(ce, logits.shape)


@implements("next_token.backward")
def _next_token_cross_entropy_backward(dloss, cache):
    """dlogits[..., :-1, :] is the cross-entropy's gradient; the last position's is exactly 0
    (its logits enter no term of the loss)."""
    dlogits = np.zeros(cache.shape, dtype=cache.ce.e.dtype)  # [..., T, V]
    (dlogits[..., :-1, :],) = _cross_entropy_backward(dloss, cache.ce)
    return (dlogits,)


def next_token_cross_entropy_forward(logits, ids, *, ignore_index: int = IGNORE_INDEX,
                                     reduction: str = "mean"):
    """logits [..., T, V], ids [..., T] int (the sequence itself; ignore_index where a position
    is no target: padding) -> the cross-entropy of each position's logits against the next
    token, a scalar ("mean" divides by the predicted positions 1..T-1 whose id is not
    ignore_index)."""
    if reduction not in ("mean", "sum"):
        raise ValueError(f"reduction: expected 'mean' or 'sum', got {reduction!r}")
    as_float_array("logits", logits, min_ndim=2)
    as_index_array("ids", ids, shape=logits.shape[:-1], low=0, high=logits.shape[-1],
                   allow=(ignore_index,))
    if reduction == "mean" and not np.any(ids[..., 1:] != ignore_index):
        raise ValueError(f"ids: the mean needs a next token != ignore_index ({ignore_index}) at "
                         f"some position 1..T-1, got none (ids shape {ids.shape})")
    return _next_token_cross_entropy_forward(logits, ids, ignore_index=ignore_index,
                                             reduction=reduction)


def next_token_cross_entropy_backward(dloss, cache):
    return _next_token_cross_entropy_backward(_scalar("dloss", dloss, cache.ce.e.dtype), cache)


# ------------------------------------------------------- linear + cross-entropy, fused
class LinearCrossEntropyCache(NamedTuple):
    dlogits: np.ndarray | None  # dL/dlogits for dloss = 1 [N, V], in the logits' own buffer
    lin: LinearCache  # x as rows [N, n_in], W [n_in, V]
    x_shape: tuple  # x's shape [..., n_in]


# Logits rows per cross-entropy block by default: ~1 MiB (32 rows of V = 8192 float32), which
# stays in a core's L2 through the block's passes (measured: the unblocked cross-entropy over
# [512, 8192] reads and writes 16 MiB per pass from L3/DRAM).
CE_BLOCK_BYTES = 1 << 20


@implements("linear_ce.forward")
def _linear_cross_entropy_forward(x, W, b, labels, *, ignore_index: int = IGNORE_INDEX,
                                  reduction: str = "mean", block_rows: int | None = None,
                                  grad: bool = True):
    """L = cross_entropy(x W + b, labels): the linear and cross-entropy op pairs composed (their
    kernels), scheduled for speed.  The cross-entropy runs ``block_rows`` rows at a time
    (default: ~CE_BLOCK_BYTES of logits), so a block of logits stays in cache through its
    passes; with ``grad`` each block's dL/dlogits for an upstream gradient of 1 overwrites its
    logits (no second [N, V] array), ready for the backward.  ``grad`` False: the loss alone
    (what finite differences and evaluation need), the cache's dlogits None."""
    rows_x = _rows(x)  # [N, n_in]
    flat = labels.reshape(-1)  # [N]
    logits, c_lin = _linear_forward(rows_x, W, b)  # [N, V]
    N, V = logits.shape
    n = int(np.count_nonzero(flat != ignore_index))
    denom = n if reduction == "mean" else 1
    rows = block_rows or max(1, CE_BLOCK_BYTES // (V * logits.itemsize))
    unit = logits.dtype.type(1.0 / denom)  # dL/dloss_sum for dloss = 1
    total = 0.0
    for lo in range(0, N, rows):
        blk = slice(lo, lo + rows)
        value, c_ce = _cross_entropy_forward(logits[blk], flat[blk], ignore_index=ignore_index,
                                             reduction="sum")
        total += float(value)
        if grad:
            (logits[blk],) = _cross_entropy_backward(unit, c_ce)  # the block's dlogits
    loss = logits.dtype.type(total / denom)
    return loss, LinearCrossEntropyCache(logits if grad else None, c_lin, x.shape)


@implements("linear_ce.backward")
def _linear_cross_entropy_backward(dloss, cache):
    """Returns (dx, dW, db) = the linear backward of G = dloss * dL/dlogits: dx = G W^T,
    dW = x^T G, db = sum of G's rows.  By linearity dloss scales the [N, n_in] x, dx and the [V]
    db, never the [N, V] cached gradient (no extra pass over the logits)."""
    c_lin = cache.lin
    dx, dW, db = _linear_backward(cache.dlogits, c_lin._replace(x=c_lin.x * dloss))
    dx *= dloss
    if db is not None:
        db *= dloss
    return dx.reshape(cache.x_shape), dW, db


def linear_cross_entropy_forward(x, W, b, labels, *, ignore_index: int = IGNORE_INDEX,
                                 reduction: str = "mean", block_rows: int | None = None):
    """x [..., n_in], W [n_in, V], b [V] or None, labels [...] int -> the cross-entropy of the
    logits x W + b against ``labels`` (a scalar, ``reduction`` and ``ignore_index`` as
    ``cross_entropy_forward``), without a second [..., V] array.  ``block_rows`` (reference
    only): the rows of logits per cross-entropy block, default ~1 MiB of them."""
    _check_linear(x, W, b)
    _check_ce_labels(labels, x.shape[:-1], W.shape[1], ignore_index, reduction)
    if block_rows is not None and (not isinstance(block_rows, (int, np.integer))
                                   or isinstance(block_rows, bool) or block_rows < 1):
        raise ValueError(f"block_rows: expected None or a positive integer, got {block_rows!r}")
    return _linear_cross_entropy_forward(x, W, b, labels, ignore_index=ignore_index,
                                         reduction=reduction, block_rows=block_rows)


def linear_cross_entropy_backward(dloss, cache):
    return _linear_cross_entropy_backward(_scalar("dloss", dloss, cache.dlogits.dtype), cache)


class MSECache(NamedTuple):
    diff: np.ndarray  # y_hat - y


@implements("loss.mse")
def _mse_forward(y_hat, y):
    """L = ||y_hat - y||^2 / N with N = y.size (NumPy-Transformer document, B*T*d_model)."""
    diff = y_hat - y
    return y_hat.dtype.type((diff * diff).sum() / diff.size), MSECache(diff)


@implements("loss.mse.backward")
def _mse_backward(dloss, cache):
    """d y_hat = 2 (y_hat - y) / N * dloss;  d y = -d y_hat."""
    diff = cache.diff
    dy_hat = diff * (2 * dloss / diff.size)
    return dy_hat, -dy_hat


def mse_forward(y_hat, y):
    as_float_array("y_hat", y_hat)
    as_float_array("y", y, shape=y_hat.shape, dtype=y_hat.dtype)
    return _mse_forward(y_hat, y)


def mse_backward(dloss, cache):
    return _mse_backward(_scalar("dloss", dloss, cache.diff.dtype), cache)


def _scalar(name, value, dtype):
    """A finite real scalar in ``dtype`` (a complex one would lose its imaginary part)."""
    a = np.asarray(value)
    real = np.issubdtype(a.dtype, np.integer) or np.issubdtype(a.dtype, np.floating)
    if a.shape != () or not real or not np.isfinite(a):
        raise ValueError(f"{name}: expected a finite real scalar, got {value!r}")
    return dtype.type(a)
