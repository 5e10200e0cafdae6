"""Multi-head self-attention: head split/merge, the fused Q/K/V projection, masks, RoPE."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from minibert_reference.ops.activations import SoftmaxCache, _softmax_backward, _softmax_forward
from minibert_reference.ops.linear import LinearCache, _linear_backward, _linear_forward
from minibert_reference.ops.rope import (
    ROPE_CONVENTIONS,
    RoPECache,
    _check_rope_base,
    _rope_backward,
    _rope_forward,
)
from minibert_reference.registry import implements
from minibert_reference.validate import as_float_array, as_mask

# the public ops of this section: the package gathers them into minibert_reference.ops.__all__
__all__ = [
    "split_heads", "merge_heads", "attention_forward", "attention_backward", "ATTENTION_PARAMS",
]


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
    # (its backward, its cache) of a softmax the forward was given; None: the reference's own,
    # whose cache is p (SoftmaxCache(p), rebuilt by the backward)
    softmax: tuple | None = None


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
                       rope_base: float = 10000.0, softmax: tuple | None = None):
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
    ``softmax``: the (forward, backward) pair P is computed with -- forward(S, mask) -> (P,
    cache), mask None or bool broadcastable to S; backward(dP, cache) -> (dS,), an array of
    its own (scaled in place) -- or None, the reference's own (a composed model runs an
    implementation's softmax row inside this attention: minibert_spec.protocol.composed).
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
    softmax_forward, softmax_backward = softmax or (_softmax_forward, None)
    p, c_softmax = softmax_forward(scores, key_mask)  # P [B, A, T, T]
    ctx = _merge_heads(p @ v_h)  # C [B, T, H]
    if W_o is None:  # no output projection: the merged heads are the output
        y, c_o = ctx, None
    else:
        y, c_o = _linear_forward(ctx, W_o, b_o)  # [B, T, H]
    return y, AttentionCache(n_heads=n_heads, scale=scale, q_h=q_h, k_h=k_h, v_h=v_h, p=p,
                             qkv=c_qkv, has_b=tuple(b is not None for b in (b_q, b_k, b_v)),
                             o=c_o, rope=c_rope,
                             softmax=None if softmax is None else (softmax_backward, c_softmax))


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
    softmax_backward, c_softmax = cache.softmax or (_softmax_backward, SoftmaxCache(cache.p))
    (dscores,) = softmax_backward(dp, c_softmax)  # dS [B, A, T, T]
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
