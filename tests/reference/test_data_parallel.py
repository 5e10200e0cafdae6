"""The data-parallel wrapper (minibert_reference.data_parallel): for every entry point it wraps --
forward, backward, loss, loss_and_grads, masked_lm_loss_and_grads -- the sharded result equals
the unsharded one (float64, summation order only), and for a fixed worker count two runs are
bit-identical.  Batches that do not divide evenly by the worker count and batches smaller than
it are included (shard cuts: at most one shard per sequence, the larger shards first), for each
head: the Mini-BERT head (fused with its loss), BERT's tied MLM head, the classifier, MSE
reconstruction and the pooled hidden states.
"""

from __future__ import annotations

import numpy as np
import pytest

import minibert_reference
from minibert_reference import data_parallel, model, parallel
from minibert_reference.config import BertConfig, bert_tiny, mini_bert
from minibert_spec.numerics.finite_differences import loss_kwargs, random_batch, random_params
from minibert_spec.numerics.identities import close, require
from minibert_spec.protocol import IGNORE_INDEX
from minibert_spec.tolerances import F64_IDENTITY_RTOL

CONFIGS = {
    "mini_bert": mini_bert(n_layers=2, hidden=8, n_heads=2, intermediate=16, max_len=8,
                           vocab_size=29),  # the fused MLM-linear head
    "bert_mlm": BertConfig(n_layers=1, hidden=8, n_heads=2, intermediate=16, max_len=8,
                           vocab_size=23, activation="gelu", type_vocab_size=2,
                           embedding_layernorm=True, mlm_style="bert", attn_bias=True,
                           final_layernorm=False, pad_token_id=0),
    "classifier": BertConfig(n_layers=1, hidden=8, n_heads=2, intermediate=16, max_len=8,
                             vocab_size=23, head="classifier", num_labels=3, attn_bias=True),
    "mse": BertConfig(n_layers=1, hidden=8, n_heads=2, intermediate=16, max_len=8,
                      vocab_size=23, position="sinusoidal", head="none", attn_bias=True,
                      final_layernorm=False),
    "pooled": bert_tiny(n_layers=1, hidden=8, n_heads=2, intermediate=16, max_len=8,
                        vocab_size=23, head="none", pooler=True),
}
# (B, workers): uneven shards (5 = 3 + 2, 5 = 2 + 2 + 1), even, fewer sequences than workers
SHARDINGS = [(5, 2), (5, 3), (4, 2), (2, 3), (1, 2)]


def _close(got, want, what):
    """float64 identity: equal up to summation order, relative to the tensor's magnitude."""
    require([close("data_parallel", what, got, want)])


def _grads_close(got, want, what):
    """Every tensor at the identity tolerance; the key bias, whose true gradient is exactly 0
    (softmax is shift-invariant per row: both sides are rounding noise), in absolute terms
    against the largest gradient."""
    assert list(got) == list(want), what
    largest = max(float(np.max(np.abs(w))) for w in want.values())
    for k in want:
        assert got[k].dtype == want[k].dtype, (what, k)
        if k.endswith("attn.b_k"):
            assert max(float(np.max(np.abs(got[k]))),
                       float(np.max(np.abs(want[k])))) <= F64_IDENTITY_RTOL * largest, k
        else:
            _close(got[k], want[k], f"{what} d{k}")


def _same_bits(a, b, what):
    """Two results of the same worker count: identical, array by array."""
    if isinstance(a, dict):
        assert list(a) == list(b), what
        for k in a:
            _same_bits(a[k], b[k], f"{what}[{k}]")
    elif isinstance(a, tuple):
        for i, (x, y) in enumerate(zip(a, b)):
            _same_bits(x, y, f"{what}[{i}]")
    else:
        x, y = np.asarray(a), np.asarray(b)
        assert x.dtype == y.dtype and x.shape == y.shape and x.tobytes() == y.tobytes(), what


def _loss_kwargs(config, batch):
    kw = loss_kwargs(config, batch)
    if "token_type_ids" in batch:
        kw["token_type_ids"] = batch["token_type_ids"]
    return kw


def _entries(name, config, params, batch, reduction):
    """Every wrapped entry point on one batch: {entry: result}."""
    ids = batch["input_ids"]
    kw = _loss_kwargs(config, batch)
    if config.head != "none":
        kw["reduction"] = reduction
    fwd_kw = {k: v for k, v in kw.items() if k == "token_type_ids"}
    out, cache = minibert_reference.forward(params, config, ids, kw["attention_mask"], **fwd_kw)
    rng = np.random.default_rng(11)
    dout = rng.standard_normal(out.shape)
    d_pooled = None if cache.pooled is None else rng.standard_normal(cache.pooled.shape)
    res = {"forward": (out,) if cache.pooled is None else (out, cache.pooled),
           "backward": minibert_reference.backward(dout, cache, d_pooled),
           "loss": minibert_reference.loss(params, config, ids, **kw),
           "loss_and_grads": minibert_reference.loss_and_grads(params, config, ids, **kw)}
    if name == "mini_bert":
        res["masked_lm_loss_and_grads"] = minibert_reference.masked_lm_loss_and_grads(
            params, config, ids, **kw)
    return res, cache


def _compare(got, want):
    for entry, w in want.items():
        g = got[entry]
        if entry in ("forward", "loss"):
            for i, (a, b) in enumerate(zip(g if entry == "forward" else (g,),
                                           w if entry == "forward" else (w,))):
                _close(a, b, f"{entry}[{i}]")
            continue
        if entry != "backward":  # (loss, grads, d_embeddings)
            _close(g[0], w[0], f"{entry} loss")
            g, w = g[1:], w[1:]
        _grads_close(g[0], w[0], entry)
        _close(g[1], w[1], f"{entry} d_embeddings")


@pytest.mark.parametrize("B,workers", SHARDINGS)
@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_sharded_equals_unsharded_and_repeats_bit_for_bit(name, B, workers):
    config = CONFIGS[name]
    params = random_params(minibert_reference, config, seed=3)
    batch = random_batch(config, B=B, T=8, seed=3)
    reductions = ["mean"] if config.head == "none" else ["mean", "sum"]
    for reduction in reductions:
        with parallel.workers(1):
            want, cache1 = _entries(name, config, params, batch, reduction)
        assert isinstance(cache1, model.ModelCache)
        with parallel.workers(workers):
            got, cache = _entries(name, config, params, batch, reduction)
            again, _ = _entries(name, config, params, batch, reduction)
        shards = min(B, workers)
        if shards == 1:
            assert isinstance(cache, model.ModelCache)
        else:
            assert isinstance(cache, data_parallel.ShardedCache)
            assert [s.stop - s.start for s in cache.shards] == [
                B // shards + (i < B % shards) for i in range(shards)]
        _compare(got, want)
        _same_bits(got, again, f"{name} B={B} workers={workers}")


@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize("workers", [2, 3])
def test_masked_head_with_a_shard_that_predicts_nothing(reduction, workers):
    """The trainer's path where one shard has no label: it adds zero loss and only zero head
    gradients, and the batch's mean still divides by the whole batch's count."""
    config = CONFIGS["mini_bert"]
    params = random_params(minibert_reference, config, seed=6)
    batch = random_batch(config, B=4, T=8, seed=6)
    labels = batch["labels"].copy()
    labels[2:] = IGNORE_INDEX  # the last shard(s) predict nothing
    kw = dict(labels=labels, attention_mask=batch["attention_mask"], reduction=reduction)
    with parallel.workers(1):
        want = minibert_reference.loss_and_grads(params, config, batch["input_ids"], **kw)
    with parallel.workers(workers):
        got = minibert_reference.masked_lm_loss_and_grads(params, config, batch["input_ids"], **kw)
    _close(got[0], want[0], "loss")
    _grads_close(got[1], want[1], "grads")
    _close(got[2], want[2], "d_embeddings")


@pytest.mark.parametrize("name", ["mini_bert", "mse"])
def test_inputs_embeds_sharded_equals_unsharded(name):
    config = CONFIGS[name]
    params = random_params(minibert_reference, config, seed=8)
    batch = random_batch(config, B=5, T=8, seed=8)
    emb = np.random.default_rng(8).standard_normal((5, 8, config.hidden))
    kw = ({"targets": batch["targets"]} if config.head == "none"
          else {"labels": batch["labels"]})
    with parallel.workers(1):
        want = minibert_reference.loss_and_grads(params, config, inputs_embeds=emb, **kw)
        want_out = minibert_reference.forward(params, config, inputs_embeds=emb)[0]
    with parallel.workers(2):
        got = minibert_reference.loss_and_grads(params, config, inputs_embeds=emb, **kw)
        got_out = minibert_reference.forward(params, config, inputs_embeds=emb)[0]
    _close(got_out, want_out, "forward")
    _close(got[0], want[0], "loss")
    _grads_close(got[1], want[1], "grads")
    _close(got[2], want[2], "d_embeddings")


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_one_worker_is_the_model_itself(name):
    """With one worker the wrapper runs the model's own computation: the same bits as
    minibert_reference.model's entry points."""
    config = CONFIGS[name]
    params = random_params(minibert_reference, config, seed=9)
    batch = random_batch(config, B=3, T=8, seed=9)
    kw = _loss_kwargs(config, batch)
    with parallel.workers(1):
        _same_bits(minibert_reference.loss_and_grads(params, config, batch["input_ids"], **kw),
                   model.loss_and_grads(params, config, batch["input_ids"], **kw), name)
        _same_bits(minibert_reference.loss(params, config, batch["input_ids"], **kw),
                   model.loss(params, config, batch["input_ids"], **kw), name)


def test_arguments_are_checked_before_any_shard_runs():
    """A bad argument is the model's ValueError, whatever the worker count."""
    config = CONFIGS["mini_bert"]
    params = random_params(minibert_reference, config, seed=1)
    batch = random_batch(config, B=4, T=8, seed=1)
    bad = batch["labels"].copy()
    bad[3, 0] = config.vocab_size  # out of range in the last shard only
    with parallel.workers(2):
        for entry in (minibert_reference.loss, minibert_reference.loss_and_grads,
                      minibert_reference.masked_lm_loss_and_grads):
            with pytest.raises(ValueError, match="labels"):
                entry(params, config, batch["input_ids"], labels=bad)
        _, cache = minibert_reference.forward(params, config, batch["input_ids"])
        with pytest.raises(ValueError, match="dout"):
            minibert_reference.backward(np.zeros((4, 8, 3)), cache)
