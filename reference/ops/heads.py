"""The heads on top of the encoder: BERT's pooler, its MLM head and the sequence classifier."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from minibert_reference.ops._common import _rows, _sum_to_last
from minibert_reference.ops.activations import (
    GeluCache,
    ReluCache,
    TanhCache,
    _activation_backward,
    _activation_forward,
    _check_activation,
    _tanh_backward,
    _tanh_forward,
)
from minibert_reference.ops.linear import (
    LinearCache,
    _check_linear,
    _linear_backward,
    _linear_forward,
)
from minibert_reference.ops.norms import (
    LayerNormCache,
    _check_layernorm_params,
    _layernorm_backward,
    _layernorm_forward,
)
from minibert_reference.registry import implements
from minibert_reference.validate import as_float_array

# the public ops of this section: the package gathers them into minibert_reference.ops.__all__
__all__ = [
    "mlm_head_forward", "mlm_head_backward", "classifier_forward", "classifier_backward",
    "pooler_forward", "pooler_backward",
]


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
