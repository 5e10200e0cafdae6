"""A NumPy GPT's LM head fused with its loss as tutorials write it: ``logits = x @ W + b``,
a softmax cross-entropy averaged over every position (a mean only, no ``reduction=``) and no
ignore_index (every position is a target), its backward written by hand from the cache
(``dlogits = (p - onehot) / N``).  Two protocol lines name the pair; ``CAPABILITIES`` declares
the form: ``linear_cross_entropy.ignore_index`` False, ``linear_cross_entropy.reduction``
"mean".

``build(bug)``: None is the correct pair (``correct``); ``"rows"`` plants a backward bug of
ports: the backward divides by the first axis (``x.shape[0]``, the batch) where the forward
divided by every position: right on [N, n] rows, wrong on [1, N, n] (``buggy``).
tests/suite/test_linear_ce_forms.py checks both."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np


def lm_loss(x, W, b, targets):
    n = x.shape[-1]
    h = x.reshape(-1, n)
    logits = h @ W + (0.0 if b is None else b)
    logits = logits - logits.max(axis=-1, keepdims=True)
    p = np.exp(logits)
    p /= p.sum(axis=-1, keepdims=True)
    y = targets.reshape(-1)
    loss = -np.log(p[np.arange(len(y)), y]).sum() / len(y)
    return loss, (h, W, b, p, y, x.shape)


def lm_loss_backward(cache, bug=None):
    h, W, b, p, y, shape = cache
    dlogits = p.copy()
    dlogits[np.arange(len(y)), y] -= 1.0
    dlogits /= shape[0] if bug == "rows" else len(y)
    dx = (dlogits @ W.T).reshape(shape)
    return dx, h.T @ dlogits, None if b is None else dlogits.sum(axis=0)


# ----------------------------------------------------------------------------- the adapter
def build(bug: str | None = None) -> SimpleNamespace:
    return SimpleNamespace(
        CAPABILITIES={"linear_cross_entropy": {"ignore_index": False, "reduction": "mean"}},
        linear_cross_entropy_forward=lambda x, W, b, labels: lm_loss(x, W, b, labels),
        linear_cross_entropy_backward=lambda dloss, cache: tuple(
            None if g is None else dloss * g for g in lm_loss_backward(cache, bug)),
    )


# ---------------------------------------- the correct and the buggy build (for the tests)
correct = build()
buggy = build("rows")
