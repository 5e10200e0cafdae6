"""A loss and an optimizer written the way hand-made training code often is: a cross-entropy
that takes ``-log(p + 1e-12)`` of the softmax (declared: ``CAPABILITIES["guards"]``), an AdamW
whose ``adam_step`` has no ``no_decay`` keyword (the suite applies the protocol's default rule),
and global-norm clipping without an ``eps`` keyword or any guard (torch's 1e-6 is not there).
Written to the protocol directly: no adapter code at all.

``BUGS`` (or MINIBERT_EXAMPLE_BUGS) switches on one bug per op: ``cross_entropy`` forgets the
mask of ignored positions in the backward; ``adam`` bias-corrects m but not v; ``clip`` clips
each tensor by its own norm.
"""

from __future__ import annotations

import os

import numpy as np

BUGS: set = set(filter(None, os.environ.get("MINIBERT_EXAMPLE_BUGS", "").split(",")))
LOG_EPS = 1e-12
CAPABILITIES = {"guards": {"log_eps": LOG_EPS}}


def label_probabilities(logits, labels, ignore_index):
    """(p, keep, safe, p_label): the softmax, the predicted positions, the labels with the
    ignored ones at 0, the probability of each label (tests/examples/guarded_rows.py too)."""
    z = logits - logits.max(-1, keepdims=True)
    e = np.exp(z)
    p = e / e.sum(-1, keepdims=True)
    keep = labels != ignore_index
    safe = np.where(keep, labels, 0)
    return p, keep, safe, np.take_along_axis(p, safe[..., None], -1)[..., 0]


def cross_entropy_forward(logits, labels, *, ignore_index=-100, reduction="mean"):
    p, keep, safe, p_label = label_probabilities(logits, labels, ignore_index)
    n = max(int(keep.sum()), 1) if reduction == "mean" else 1
    loss = -(np.log(p_label + LOG_EPS) * keep).sum() / n  # the guard: log(p + 1e-12)
    return loss.astype(logits.dtype), (p, safe, keep, n)


def cross_entropy_backward(dloss, cache):
    p, safe, keep, n = cache
    d = p.copy()
    np.put_along_axis(d, safe[..., None], np.take_along_axis(d, safe[..., None], -1) - 1, -1)
    if "cross_entropy" not in BUGS:  # the bug: ignored positions keep p - onehot
        d = d * keep[..., None]
    return (d * d.dtype.type(dloss / n),)


def adam_init(params):
    return {"step": 0, "m": {k: np.zeros_like(v) for k, v in params.items()},
            "v": {k: np.zeros_like(v) for k, v in params.items()}}


def adam_step(params, grads, state, *, lr, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.0):
    """AdamW decaying every tensor (no no_decay keyword)."""
    t = state["step"] + 1
    m = {k: beta1 * state["m"][k] + (1 - beta1) * g for k, g in grads.items()}
    v = {k: beta2 * state["v"][k] + (1 - beta2) * g * g for k, g in grads.items()}
    new = {}
    for k, p in params.items():
        v_hat = v[k] if "adam" in BUGS else v[k] / (1 - beta2 ** t)
        update = (m[k] / (1 - beta1 ** t)) / (np.sqrt(v_hat) + eps)
        new[k] = (p - lr * (update + weight_decay * p)).astype(p.dtype)
    return new, {"step": t, "m": m, "v": v}


def global_grad_norm(grads):
    return float(np.sqrt(sum(float((g.astype(np.float64) ** 2).sum()) for g in grads.values())))


def clip_by_global_norm(grads, max_norm):
    """No eps keyword and no guard: scale by max_norm / norm when norm > max_norm."""
    norm = global_grad_norm(grads)
    if "clip" in BUGS:
        return {k: g * min(1.0, max_norm / float(np.linalg.norm(g))) for k, g in grads.items()
                }, norm
    scale = min(1.0, max_norm / norm) if norm > 0 else 1.0
    return {k: g * g.dtype.type(scale) for k, g in grads.items()}, norm
