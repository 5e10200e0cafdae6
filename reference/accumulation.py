"""Gradient accumulation (Mini-BERT derivation §8.2): the loss and gradient of a logical batch
from its micro-batches, through any implementation's ``loss_and_grads``.

§8.2 averages the micro-batch means, which is wrong when micro-batches hold different numbers of
predicted tokens: here every micro-batch contributes its *sum* and the total is divided once by
the logical batch's count of predicted tokens (MLM) or target elements (MSE).
"""

from __future__ import annotations

import numpy as np

from minibert_reference.ops import IGNORE_INDEX
from minibert_reference.registry import implements

__all__ = ["accumulate_gradients"]


def _n_predicted(config, batch, ignore_index) -> int:
    """What the loss averages over: masked tokens (head "mlm") or target elements ("none")."""
    if config.head == "mlm":
        labels = batch.get("labels")
        if not isinstance(labels, np.ndarray):
            raise ValueError(f"micro_batches: each needs an ndarray 'labels', got "
                             f"{type(labels).__name__}")
        return int(np.count_nonzero(labels != ignore_index))
    targets = batch.get("targets")
    if not isinstance(targets, np.ndarray):
        raise ValueError(f"micro_batches: each needs an ndarray 'targets', got "
                         f"{type(targets).__name__}")
    return int(targets.size)


@implements("accum.grad_mean")
def accumulate_gradients(impl_or_loss_fn, params, config, micro_batches, *,
                         ignore_index: int = IGNORE_INDEX):
    """Loss and gradient of the logical batch formed by ``micro_batches`` (dicts with
    ``input_ids`` and ``labels`` or ``targets``, optional ``attention_mask``).

    The result is the full-batch mean over every masked token (MLM) or target element (MSE):
    each micro-batch contributes its *sum* (``reduction="sum"``; MSE: mean times element count)
    and the total is divided once by the logical batch's count, so micro-batches with different
    numbers of masked tokens -- or none -- are weighted correctly.  A micro-batch with nothing
    to predict contributes exactly zero and is skipped.

    ``impl_or_loss_fn``: an implementation (anything with ``loss_and_grads``) or such a
    function itself.  Returns ``(loss, grads)``.
    """
    loss_and_grads = getattr(impl_or_loss_fn, "loss_and_grads", impl_or_loss_fn)
    if not callable(loss_and_grads):
        raise ValueError(f"impl_or_loss_fn: expected an implementation or a loss_and_grads "
                         f"function, got {impl_or_loss_fn!r:.60}")
    micro_batches = list(micro_batches)
    if not micro_batches:
        raise ValueError("micro_batches: expected at least one micro-batch, got none")
    counts = [_n_predicted(config, mb, ignore_index) for mb in micro_batches]
    total = sum(counts)
    if total == 0:
        raise ValueError(f"micro_batches: the logical batch needs at least one position != "
                         f"ignore_index ({ignore_index}), got none")
    contributing = [mb for mb, n in zip(micro_batches, counts) if n]
    if len(contributing) == 1:  # the logical batch's mean is this micro-batch's own mean
        kw = {"attention_mask": contributing[0].get("attention_mask")}
        if config.head == "mlm":
            kw.update(labels=contributing[0]["labels"], ignore_index=ignore_index)
        else:
            kw.update(targets=contributing[0]["targets"])
        value, g, _ = loss_and_grads(params, config, contributing[0]["input_ids"], **kw)
        return float(value), g
    loss_sum = 0.0
    grads = None
    for mb, n in zip(micro_batches, counts):
        if n == 0:
            continue
        kw = {"attention_mask": mb.get("attention_mask")}
        if config.head == "mlm":
            kw.update(labels=mb["labels"], reduction="sum", ignore_index=ignore_index)
            weight = 1.0
        else:  # the MSE op only averages: undo it to get the sum
            kw.update(targets=mb["targets"])
            weight = float(n)
        value, g, _ = loss_and_grads(params, config, mb["input_ids"], **kw)
        loss_sum += float(value) * weight
        if grads is None:
            grads = {k: a * a.dtype.type(weight) if weight != 1.0 else a.copy()
                     for k, a in g.items()}
        else:
            for k, a in g.items():
                if weight != 1.0:
                    a = a * a.dtype.type(weight)
                grads[k] += a
    inv = 1.0 / total
    for a in grads.values():  # arrays made here (copies or products): scaled in place
        a *= a.dtype.type(inv)
    return loss_sum * inv, grads
