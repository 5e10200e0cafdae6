"""Embeddings: token lookup, the tied output embedding, learned and sinusoidal positions, and BERT's
embedding layer (token types, the sum and its LayerNorm)."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from minibert_reference.ops.linear import LinearCache, _linear_backward, _linear_forward
from minibert_reference.ops.norms import (
    LayerNormCache,
    _check_layernorm_params,
    _layernorm_backward,
    _layernorm_forward,
)
from minibert_reference.registry import implements
from minibert_reference.validate import FLOAT_DTYPES, as_float_array, as_index_array

# the public ops of this section: the package gathers them into minibert_reference.ops.__all__
__all__ = [
    "embedding_forward", "embedding_backward", "tied_embedding_forward", "tied_embedding_backward",
    "position_embedding_forward", "position_embedding_backward", "sinusoidal_encoding",
    "sinusoidal_position_forward", "sinusoidal_position_backward", "token_type_embedding_forward",
    "token_type_embedding_backward", "embedding_ln_forward", "embedding_ln_backward",
]


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
