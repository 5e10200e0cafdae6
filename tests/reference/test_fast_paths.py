"""The reference's fast paths against the readable op pairs they schedule differently (issue
"Faster than PyTorch eager"): the loss against forward's logits, the optimizer over tensor
groups and into given arrays, the dot-product finiteness check, the accumulation shortcut for
one micro-batch, and the trainer's double-buffered update.  Every comparison is float64 against
the unfused / sequential computation, at the identity tolerance (they differ only in summation
order), and the parallel paths are bit-identical run to run.  The fused head's block schedule
is tests/reference/test_linear_cross_entropy.py; the batch shards,
tests/reference/test_data_parallel.py."""

from __future__ import annotations

import copy

import numpy as np
import pytest

import minibert_reference
from minibert_reference import ops, optim, parallel
from minibert_reference.config import BertConfig, mini_bert
from minibert_reference.train import loop
from minibert_reference.validate import DOT_FROM, all_finite, check_all_finite, non_finite
from minibert_spec.numerics.finite_differences import random_batch, random_params
from minibert_spec.protocol import IGNORE_INDEX
from minibert_spec.tolerances import F64_IDENTITY_RTOL

TINY = mini_bert(n_layers=2, hidden=8, n_heads=2, intermediate=16, max_len=8, vocab_size=29)
CONFIGS = {
    "mini_bert": TINY,  # the fused MLM-linear head
    "bert_mlm": BertConfig(n_layers=1, hidden=8, n_heads=2, intermediate=16, max_len=8,
                           vocab_size=23, activation="gelu", type_vocab_size=2,
                           embedding_layernorm=True, mlm_style="bert", attn_bias=True,
                           final_layernorm=False, pad_token_id=0),
}


def _close(got, want, what=""):
    """float64 identity: equal up to summation order, relative to the tensor's magnitude."""
    got, want = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
    scale = max(float(np.max(np.abs(want))), 1e-300)
    assert got.shape == want.shape, (what, got.shape, want.shape)
    assert float(np.max(np.abs(got - want))) <= F64_IDENTITY_RTOL * scale, what


def _kwargs(config, batch):
    kw = dict(attention_mask=batch["attention_mask"], labels=batch["labels"])
    if "token_type_ids" in batch:
        kw["token_type_ids"] = batch["token_type_ids"]
    return kw


# --------------------------------------------------------------- loss
@pytest.mark.parametrize("name", ["mini_bert", "bert_mlm"])
@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize("workers", [1, 2])
def test_loss_equals_forward_then_cross_entropy(name, reduction, workers):
    """loss() (the blocked cross-entropy for the fused head) against the public ops: forward's
    logits, then cross_entropy_forward."""
    config = CONFIGS[name]
    params = random_params(minibert_reference, config, seed=5)
    batch = random_batch(config, B=3, T=8, seed=5)
    kw = {**_kwargs(config, batch), "reduction": reduction}
    with parallel.workers(1):
        logits, _ = minibert_reference.forward(params, config, batch["input_ids"],
                                      kw["attention_mask"], token_type_ids=kw.get(
                                          "token_type_ids"))
        want, _ = ops.cross_entropy_forward(logits, kw["labels"], reduction=reduction)
    with parallel.workers(workers):
        got = minibert_reference.loss(params, config, batch["input_ids"], **kw)
    assert got.dtype == want.dtype
    _close(got, want, "loss")


def test_all_ones_mask_is_no_mask():
    """An attention mask that attends everywhere is dropped at the boundary (no masking pass);
    the result is the same bits as passing no mask."""
    params = random_params(minibert_reference, TINY, seed=8)
    ids = random_batch(TINY, B=2, T=8, seed=8)["input_ids"]
    with_mask, _ = minibert_reference.forward(params, TINY, ids, np.ones_like(ids))
    without, _ = minibert_reference.forward(params, TINY, ids)
    np.testing.assert_array_equal(with_mask, without)


# --------------------------------------------------------------- optimizer
def _adam_problem(seed=0):
    params = random_params(minibert_reference, TINY, seed=seed)
    rng = np.random.default_rng(seed)
    grads = [{k: rng.standard_normal(p.shape) for k, p in params.items()} for _ in range(3)]
    return params, grads


KW = dict(lr=3e-3, beta1=0.9, beta2=0.99, eps=1e-8, weight_decay=0.05)


@pytest.mark.equation("optim.adam", "optim.adamw")
def test_adam_workers_and_out_buffers_are_bit_identical_to_one_worker_new_arrays():
    params, grads = _adam_problem()
    state = minibert_reference.adam_init(params)
    p_ref, s_ref = params, state
    p_pp, s_pp = copy.deepcopy(params), minibert_reference.adam_init(params)
    spare = (copy.deepcopy(params), minibert_reference.adam_init(params))
    for g in grads:
        with parallel.workers(1):
            p_ref, s_ref = optim.adam_step(p_ref, g, s_ref, **KW)
        with parallel.workers(2):
            before = copy.deepcopy((p_pp, s_pp))
            new_p, new_s = optim.adam_step(p_pp, g, s_pp, out=spare, **KW)
            assert new_p is spare[0] and new_s["m"] is spare[1]["m"]
            for k in p_pp:  # the inputs are untouched: the caller may still roll back
                np.testing.assert_array_equal(p_pp[k], before[0][k])
                np.testing.assert_array_equal(s_pp["m"][k], before[1]["m"][k])
            spare, (p_pp, s_pp) = (p_pp, s_pp), (new_p, new_s)
        for k in params:
            np.testing.assert_array_equal(p_pp[k], p_ref[k], err_msg=k)
            np.testing.assert_array_equal(s_pp["v"][k], s_ref["v"][k], err_msg=k)


def test_adam_out_rejects_overlapping_and_strided_buffers():
    params, grads = _adam_problem()
    state = minibert_reference.adam_init(params)
    overlap = ({**params, "mlm.W": state["m"]["mlm.W"]}, minibert_reference.adam_init(params))
    with pytest.raises(ValueError, match="overlapping"):
        optim.adam_step(params, grads[0], state, out=overlap, **KW)
    strided = ({**params, "mlm.W": np.asfortranarray(params["mlm.W"].copy())},
               minibert_reference.adam_init(params))
    with pytest.raises(ValueError, match="contiguous"):
        optim.adam_step(params, grads[0], state, out=strided, **KW)
    with pytest.raises(ValueError, match="out"):
        optim.adam_step(params, grads[0], state, out=params, **KW)


def test_norm_and_clip_are_the_same_for_any_worker_count():
    _, grads = _adam_problem()
    with parallel.workers(1):
        n1 = optim.global_grad_norm(grads[0])
        c1, _ = optim.clip_by_global_norm(grads[0], 0.5)
    with parallel.workers(2):
        n2 = optim.global_grad_norm(grads[0])
        c2, _ = optim.clip_by_global_norm(grads[0], 0.5)
    want = float(np.sqrt(sum(float(np.sum(g.astype(np.float64) ** 2))
                             for g in grads[0].values())))
    assert n1 == n2 and abs(n1 - want) <= F64_IDENTITY_RTOL * want
    assert list(c1) == list(c2) == list(grads[0])
    for k in c1:
        np.testing.assert_array_equal(c1[k], c2[k])


# --------------------------------------------------------------- finiteness checks
@pytest.mark.parametrize("n", [1, DOT_FROM], ids=["isfinite", "dot"])  # both paths
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_all_finite_fast_path(dtype, n):
    big = np.finfo(dtype).max / 4  # squares overflow: the fast path must not report it
    x = np.tile(np.array([1.0, -big, big, 0.0], dtype=dtype), n)
    assert all_finite(x)
    for bad in (np.nan, np.inf, -np.inf):
        for at in (1, x.size - 2):
            y = x.copy()
            y[at] = bad
            assert not all_finite(y)
    assert all_finite(np.zeros((0, 3), dtype=dtype))


def test_first_non_finite_array_in_order_whatever_the_workers():
    named = {f"t{i}": np.ones((50, 10)) for i in range(7)}
    named["t5"][3, 4] = np.nan
    named["t2"][0, 1] = -np.inf
    for n in (1, 2, 3):
        with parallel.workers(n):
            assert non_finite(named) == ["t2", "t5"]
            with pytest.raises(ValueError, match=r"t2: expected finite values, got -inf at "
                                                 r"index \(0, 1\)"):
                check_all_finite(named)


# --------------------------------------------------------------- accumulation, trainer
@pytest.mark.equation("accum.grad_mean")
def test_one_contributing_micro_batch_is_the_plain_mean():
    params = random_params(minibert_reference, TINY, seed=9)
    batch = random_batch(TINY, B=3, T=8, seed=9)
    empty = {**batch, "labels": np.full_like(batch["labels"], IGNORE_INDEX)}
    loss, grads = minibert_reference.accumulate_gradients(minibert_reference, params, TINY,
                                                          [empty, batch, empty])
    want, want_g, _ = minibert_reference.loss_and_grads(params, TINY, batch["input_ids"],
                                               labels=batch["labels"],
                                               attention_mask=batch["attention_mask"])
    assert loss == float(want)
    for k in want_g:
        np.testing.assert_array_equal(grads[k], want_g[k])


class _PureAdam:
    """The reference with an adam_step that cannot write into given arrays (a user's)."""

    def __getattr__(self, name):
        return getattr(minibert_reference, name)

    @staticmethod
    def adam_step(params, grads, state, **kw):
        return minibert_reference.adam_step(params, grads, state, **kw)


def test_double_buffered_training_equals_new_arrays_every_step():
    from tests.train import interrupt_worker as W

    config, tcfg, data = W.tiny_setup()
    runs = []
    for impl in (minibert_reference, _PureAdam()):
        state = loop.init_state(impl, config, tcfg)
        ids = []
        for _ in range(5):
            loop.train_step(impl, state, config, tcfg, *data)
            ids.append({id(a) for a in state.params.values()})
        runs.append((state, ids))
    (buffered, buf_ids), (pure, _) = runs
    assert buffered.spare is not None and pure.spare is None
    assert buf_ids[1] == buf_ids[3] and buf_ids[1].isdisjoint(buf_ids[2])  # two sets, swapped
    for k in pure.params:
        np.testing.assert_array_equal(buffered.params[k], pure.params[k], err_msg=k)
        np.testing.assert_array_equal(buffered.opt_state["m"][k], pure.opt_state["m"][k])
