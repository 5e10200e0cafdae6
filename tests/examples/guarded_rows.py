"""Hand-written decoder training code with the guards such code adds, each declared
(``CAPABILITIES["guards"]``, spec/protocol/guards.py): a softmax dividing by ``sum + 1e-8``, a
masked-mean cross-entropy taking ``-log(p + 1e-6)`` and dividing by ``mask.sum() + 1e-6``,
the next-token loss and the fused linear head + loss built on it, and an Adam with
``sqrt(v_hat + 1e-10)`` under the root.  Every guard is large enough to move results past the
oracle's float64 tolerance, so an undeclared one is a red.  Written to the protocol directly,
NumPy only; each backward is the derivative of its guarded forward (the softmax's with the row
maximum held constant, as code writes it).
"""

from __future__ import annotations

import numpy as np

from tests.examples.guarded_optim import adam_init, label_probabilities  # noqa: F401

SOFTMAX_EPS, MEAN_EPS, LOG_EPS, ADAM_SQRT_EPS = 1e-8, 1e-6, 1e-6, 1e-10
CAPABILITIES = {"guards": {"softmax_eps": SOFTMAX_EPS, "mean_eps": MEAN_EPS, "log_eps": LOG_EPS,
                           "adam_sqrt_eps": ADAM_SQRT_EPS}}


def _check(name, a):
    if not (isinstance(a, np.ndarray) and a.dtype.kind == "f" and np.all(np.isfinite(a))):
        raise ValueError(f"{name}: expected a finite float array")


def softmax_forward(x, mask=None):
    _check("x", x)
    keep = np.ones(x.shape, bool) if mask is None else np.asarray(mask, bool)
    top = np.where(keep, x, -np.inf).max(-1, keepdims=True)
    e = np.where(keep, np.exp(np.where(keep, x, top) - top), 0).astype(x.dtype)
    p = e / (e.sum(-1, keepdims=True) + SOFTMAX_EPS)  # the guard
    return p, p


def softmax_backward(dp, p):
    _check("dp", dp)
    if dp.shape != p.shape or dp.dtype != p.dtype:
        raise ValueError(f"dp: expected shape {p.shape} and dtype {p.dtype}")
    return (p * (dp - (dp * p).sum(-1, keepdims=True)),)


def _nll(logits, labels, ignore_index, reduction):
    """The masked loss and its cache: -log(p + LOG_EPS) of the label, summed, over
    mask.sum() + MEAN_EPS for the mean."""
    _check("logits", logits)
    p, keep, safe, p_label = label_probabilities(logits, labels, ignore_index)
    n = keep.sum() + MEAN_EPS if reduction == "mean" else 1.0  # the guard
    loss = -(np.log(p_label + LOG_EPS) * keep).sum() / n  # the guard
    factor = p_label / (p_label + LOG_EPS) * keep / n  # d(-log(p + eps)) = p / (p + eps) d(-log p)
    return logits.dtype.type(loss), (p, safe, factor)


def _nll_backward(dloss, cache):
    p, safe, factor = cache
    d = p.copy()
    np.put_along_axis(d, safe[..., None], np.take_along_axis(d, safe[..., None], -1) - 1, -1)
    return d * (factor[..., None] * dloss).astype(p.dtype)


def cross_entropy_forward(logits, labels, *, ignore_index=-100, reduction="mean"):
    return _nll(logits, labels, ignore_index, reduction)


def cross_entropy_backward(dloss, cache):
    return (_nll_backward(dloss, cache),)


def next_token_cross_entropy_forward(logits, ids, *, ignore_index=-100, reduction="mean"):
    loss, cache = _nll(logits[..., :-1, :], ids[..., 1:], ignore_index, reduction)
    return loss, (cache, logits.shape)


def next_token_cross_entropy_backward(dloss, cache):
    cache, shape = cache
    d = np.zeros(shape, dtype=cache[0].dtype)
    d[..., :-1, :] = _nll_backward(dloss, cache)
    return (d,)


def linear_cross_entropy_forward(x, W, b, labels, *, ignore_index=-100, reduction="mean"):
    _check("x", x)
    logits = x @ W + (0 if b is None else b)  # [..., V]
    loss, cache = _nll(logits, labels, ignore_index, reduction)
    return loss, (cache, x, W, b is None)


def linear_cross_entropy_backward(dloss, cache):
    cache, x, W, no_bias = cache
    dlogits = _nll_backward(dloss, cache)  # [..., V]
    rows = dlogits.reshape(-1, W.shape[1])
    return (dlogits @ W.T, x.reshape(-1, W.shape[0]).T @ rows,
            None if no_bias else rows.sum(axis=0))


def adam_step(params, grads, state, *, lr, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.0):
    """AdamW decaying every tensor (no no_decay keyword: the suite applies the protocol's
    rule)."""
    t = state["step"] + 1
    m = {k: beta1 * state["m"][k] + (1 - beta1) * g for k, g in grads.items()}
    v = {k: beta2 * state["v"][k] + (1 - beta2) * g * g for k, g in grads.items()}
    new = {}
    for k, p in params.items():
        m_hat, v_hat = m[k] / (1 - beta1 ** t), v[k] / (1 - beta2 ** t)
        update = m_hat / (np.sqrt(v_hat + ADAM_SQRT_EPS) + eps)  # the guard under the root
        new[k] = (p - lr * (update + weight_decay * p)).astype(p.dtype)
    return new, {"step": t, "m": m, "v": v}
