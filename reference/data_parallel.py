"""Data parallelism over batch shards, applied from outside to the model's entry points.

``forward``, ``backward``, ``loss``, ``loss_and_grads`` and ``masked_lm_loss_and_grads`` here take
the arguments of ``minibert_reference.model``'s and return the same results (the package exports
these): each checks its arguments once, cuts the batch into one contiguous shard of sequences per
worker (``minibert_reference.parallel``), runs the model's unchecked body on every shard
concurrently and joins the pieces in shard order.  It uses the model's seam only: ``check_inputs``,
``check_loss_inputs``, ``check_backward`` and the unchecked bodies ``run_forward``,
``run_backward``, ``run_loss``, ``run_loss_backward`` (the batch's head kind says how
its loss is weighted).  With one worker (the default) or one sequence there is one shard:
the model's own computation, in the calling thread.

How the shards' losses make the batch's: the loss is a sum over sequences divided by a
denominator of the whole batch (the predicted positions for a cross-entropy mean, 1 for a sum,
every target element for the MSE), so each shard runs its summed loss (MSE: its mean, times its
elements) and is weighted by ``1 / denominator``: that weight is the shard's upstream gradient
``dloss``, so the shards' gradients add up to the batch's with no pass over them to rescale.

Shards are cut from the worker count alone and summed in shard order, never in completion
order: for a fixed worker count a run is bit-identical to any other run.  Different worker
counts differ by summation order only (tests/reference/test_data_parallel.py).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from minibert_reference import model, parallel
from minibert_reference.config import BertConfig
from minibert_reference.ops import IGNORE_INDEX

__all__ = ["forward", "backward", "loss", "loss_and_grads", "masked_lm_loss_and_grads",
           "ShardedCache"]


class ShardedCache(NamedTuple):
    """``forward``'s cache when it ran as batch shards: one ModelCache per shard; ``backward``
    runs the shards' backwards the same way."""

    shards: tuple  # slices of the batch axis
    caches: tuple  # ModelCache of each shard
    dtype: np.dtype
    out_shape: tuple
    pooled: np.ndarray | None  # [B, H], the shards' pooled outputs concatenated


def forward(params, config: BertConfig, input_ids=None, attention_mask=None, *,
            token_type_ids=None, inputs_embeds=None):
    """``minibert_reference.model.forward`` on batch shards: the outputs concatenated; the cache a
    ModelCache (one shard) or a ShardedCache."""
    batch = model.check_inputs(params, config, input_ids, attention_mask,
                               token_type_ids=token_type_ids, inputs_embeds=inputs_embeds)
    shards = parallel.row_shards(batch.size)
    if len(shards) == 1:
        return model.run_forward(params, config, batch)
    pieces = parallel.pmap(lambda rows: model.run_forward(params, config, batch.rows(rows)),
                           shards)
    out = np.concatenate([o for o, _ in pieces])
    caches = tuple(c for _, c in pieces)
    pooled = None if caches[0].pooled is None else np.concatenate([c.pooled for c in caches])
    return out, ShardedCache(tuple(shards), caches, batch.dtype, out.shape, pooled)


def backward(dout, cache, d_pooled=None):
    """``minibert_reference.model.backward`` of either cache: a ShardedCache's shards run their
    backwards concurrently, their gradients summed in shard order and their d_embeddings
    concatenated."""
    model.check_backward(dout, cache, d_pooled)
    if not isinstance(cache, ShardedCache):
        return model.run_backward(dout, cache, d_pooled)

    def shard(i):
        rows = cache.shards[i]
        return model.run_backward(dout[rows], cache.caches[i],
                                  None if d_pooled is None else d_pooled[rows])

    pieces = parallel.pmap(shard, range(len(cache.shards)))
    return _sum_grads([g for g, _ in pieces]), np.concatenate([d for _, d in pieces])


def loss(params, config: BertConfig, input_ids=None, *, labels=None, targets=None,
         attention_mask=None, token_type_ids=None, inputs_embeds=None, reduction: str = "mean",
         ignore_index: int = IGNORE_INDEX):
    """``minibert_reference.model.loss`` on batch shards."""
    batch = model.check_loss_inputs(params, config, input_ids, labels=labels, targets=targets,
                                    attention_mask=attention_mask, token_type_ids=token_type_ids,
                                    inputs_embeds=inputs_embeds, reduction=reduction,
                                    ignore_index=ignore_index)
    return _sharded_loss(params, config, batch, reduction, ignore_index, grads=False)


def loss_and_grads(params, config: BertConfig, input_ids=None, *, labels=None, targets=None,
                   attention_mask=None, token_type_ids=None, inputs_embeds=None,
                   reduction: str = "mean", ignore_index: int = IGNORE_INDEX):
    """``minibert_reference.model.loss_and_grads`` on batch shards: (loss, grads, d_embeddings)."""
    batch = model.check_loss_inputs(params, config, input_ids, labels=labels, targets=targets,
                                    attention_mask=attention_mask, token_type_ids=token_type_ids,
                                    inputs_embeds=inputs_embeds, reduction=reduction,
                                    ignore_index=ignore_index)
    return _sharded_loss(params, config, batch, reduction, ignore_index, grads=True)


def masked_lm_loss_and_grads(params, config: BertConfig, input_ids, *, labels,
                             attention_mask=None, token_type_ids=None, reduction: str = "mean",
                             ignore_index: int = IGNORE_INDEX):
    """``minibert_reference.model.masked_lm_loss_and_grads`` on batch shards (a shard may have
    nothing
    to predict: it contributes zero loss and only zero head gradients)."""
    batch = model.check_loss_inputs(params, config, input_ids, labels=labels,
                                    attention_mask=attention_mask, token_type_ids=token_type_ids,
                                    reduction=reduction, ignore_index=ignore_index,
                                    labelled_rows_only=True)
    return _sharded_loss(params, config, batch, reduction, ignore_index, grads=True,
                         predicted_only=True)


# --------------------------------------------------------------------------- the shards
def _sharded_loss(params, config: BertConfig, batch: model.Batch, reduction: str,
                  ignore_index: int, *, grads: bool, predicted_only: bool = False):
    """The batch's loss (and with ``grads`` its gradients and d_embeddings) from its shards:
    shard s runs the loss ``shard_reduction`` with the weight k_s / denominator (see the module
    docstring); one shard runs the model's loss as it is, weight 1."""
    shards = parallel.row_shards(batch.size)
    if len(shards) == 1:
        shard_reduction, k, denom = reduction, [1.0], 1.0
    else:
        shard_reduction, k, denom = _shard_weights(batch, shards, reduction, ignore_index)
    dtype = batch.dtype

    def shard(i):
        value, cache = model.run_loss(params, config, batch.rows(shards[i]), shard_reduction,
                                      ignore_index, grad=grads, predicted_only=predicted_only)
        if not grads:
            return value, None, None
        return (value, *model.run_loss_backward(dtype.type(k[i] / denom), cache))

    pieces = parallel.pmap(shard, range(len(shards)))
    if len(pieces) == 1:
        value = pieces[0][0]
    else:
        value = dtype.type(sum(float(p[0]) * k_s for p, k_s in zip(pieces, k)) / denom)
    if not grads:
        return value
    d_embeddings = (pieces[0][2] if len(pieces) == 1
                    else np.concatenate([p[2] for p in pieces]))  # [B, T, H], shard by shard
    return value, _sum_grads([p[1] for p in pieces]), d_embeddings


def _shard_weights(batch: model.Batch, shards, reduction: str, ignore_index: int):
    """(the shards' reduction, k_s per shard, the denominator): the batch's loss is
    sum_s k_s loss_s / denominator.  Cross-entropy: each shard's sum, over the batch's predicted
    positions ("mean") or 1 ("sum"); MSE (always a mean): each shard's mean times its
    elements, over every target element."""
    if batch.head.target == "targets":  # the MSE
        return "mean", [float(batch.targets[rows].size) for rows in shards], batch.targets.size
    denom = (int(np.count_nonzero(batch.labels != ignore_index)) if reduction == "mean"
             else 1)
    return "sum", [1.0] * len(shards), denom


def _sum_grads(pieces: list[dict]) -> dict:
    """Adds every gradient dict of ``pieces`` into the first, tensor by tensor in piece order
    (the tensors split among the workers); returns the first."""
    acc = pieces[0]
    if len(pieces) == 1:
        return acc

    def add(k):
        for other in pieces[1:]:
            np.add(acc[k], other[k], out=acc[k])

    parallel.map_keys(add, acc)
    return acc
