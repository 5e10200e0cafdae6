"""A small optimizer written to the protocol's optimizer interface (AdamW, warmup + linear decay,
global-norm clipping), independent of ``minibert_reference.optim``: the machinery tests use it to
show that the optimizer checks and mutants work on any implementation of the protocol, not only on
the reference.  Its token-weighted accumulation takes a ``grad_fn`` instead of a model (it has
none),
so the ``accumulation`` conformance row is n/a for it; the mutant still applies."""

from __future__ import annotations

import numpy as np


def adam_init(params):
    return {"m": {k: np.zeros_like(v) for k, v in params.items()},
            "v": {k: np.zeros_like(v) for k, v in params.items()}, "step": 0}


def adam_step(params, grads, state, *, lr, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.0,
              no_decay=()):
    t = state["step"] + 1
    m = {k: beta1 * state["m"][k] + (1 - beta1) * g for k, g in grads.items()}
    v = {k: beta2 * state["v"][k] + (1 - beta2) * g * g for k, g in grads.items()}
    new = {}
    for k, p in params.items():
        update = (m[k] / (1 - beta1 ** t)) / (np.sqrt(v[k] / (1 - beta2 ** t)) + eps)
        decay = 0.0 if any(nd in k for nd in no_decay) else weight_decay
        new[k] = p - lr * update - lr * decay * p
    return new, {"m": m, "v": v, "step": t}


def warmup_linear_lr(step, *, peak_lr, warmup_steps, total_steps):
    if step < warmup_steps:
        return peak_lr * (step + 1) / warmup_steps  # step 0 already learns
    return peak_lr * max(0.0, (total_steps - step) / (total_steps - warmup_steps))


def global_grad_norm(grads):
    return float(np.sqrt(sum(float((g * g).sum()) for g in grads.values())))


def clip_by_global_norm(grads, max_norm):
    norm = global_grad_norm(grads)
    scale = min(1.0, max_norm / norm) if norm > 0 else 1.0
    return {k: g * scale for k, g in grads.items()}, norm


def accumulate_gradients(grad_fn, micro_batches):
    """grad_fn(batch) -> (mean loss, mean grads, number of predicted tokens); returns the
    full-batch mean loss and grads, each micro-batch weighted by its token count."""
    total, loss, grads = 0, 0.0, None
    for batch in micro_batches:
        l, g, n = grad_fn(batch)
        total += n
        loss += l * n
        grads = {k: v * n for k, v in g.items()} if grads is None else {
            k: grads[k] + v * n for k, v in g.items()}
    return loss / total, {k: v / total for k, v in grads.items()}
