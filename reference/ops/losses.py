"""Losses: cross-entropy (from logits or probabilities), next-token cross-entropy, linear +
cross-entropy fused, and the mean squared error."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from minibert_reference.ops._common import IGNORE_INDEX, _rows
from minibert_reference.ops.linear import (
    LinearCache,
    _check_linear,
    _linear_backward,
    _linear_forward,
)
from minibert_reference.registry import implements
from minibert_reference.validate import as_float_array, as_index_array

# the public ops of this section: the package gathers them into minibert_reference.ops.__all__
__all__ = [
    "cross_entropy_forward", "cross_entropy_backward", "next_token_cross_entropy_forward",
    "next_token_cross_entropy_backward", "linear_cross_entropy_forward",
    "linear_cross_entropy_backward", "mse_forward", "mse_backward",
]


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
