"""Gradient accumulation: the logical batch's loss is the mean over all its masked tokens, so the
accumulated gradient equals the full-batch gradient -- whatever the micro-batches' masked counts,
including a micro-batch with none -- and agrees with finite differences of the full-batch loss.
"""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from reference.config import mini_bert, seed001
from spec import invariants as I
from spec.gradcheck import (
    assert_all_passed,
    check_gradients,
    random_params,
    split_batch,
    uneven_mlm_batch,
)
from spec.invariants import require
from spec.tolerances import F64_IDENTITY_RTOL

TINY = mini_bert(n_layers=1, hidden=8, n_heads=2, intermediate=16, max_len=8, vocab_size=13)
TINY_MSE = seed001(n_layers=1, hidden=8, n_heads=2, intermediate=16, max_len=8, vocab_size=13)


def _batch(seed=0):
    b = uneven_mlm_batch(TINY, seed=seed)
    return b["input_ids"], b["attention_mask"], b["labels"]


def _split(ids, mask, labels, bounds):
    return split_batch({"input_ids": ids, "attention_mask": mask, "labels": labels}, bounds)


@pytest.mark.equation("accum.grad_mean")
def test_accumulation_equals_full_batch_with_uneven_and_empty_micro_batches(impl):
    params = random_params(impl, TINY, seed=0)
    ids, mask, labels = _batch()
    # micro-batches with 1, 6+0 (row 2 empty), 3+2 masked tokens; and row 2 alone (0 tokens)
    for bounds in ([0, 1, 3, 5], [0, 2, 3, 5], [0, 1, 2, 3, 4, 5]):
        require(I.accumulation_matches_full_batch(impl, params, TINY,
                                                  _split(ids, mask, labels, bounds)))


@pytest.mark.equation("accum.grad_mean")
def test_mean_of_micro_batch_means_would_be_wrong(impl):
    """The derivation's §8.2 recipe (average the micro-batch means) weights tokens unevenly:
    the test data must be able to tell it apart from the correct mean."""
    params = random_params(impl, TINY, seed=1)
    ids, mask, labels = _batch(seed=1)
    micro = [m for m in _split(ids, mask, labels, [0, 1, 4, 5])]
    naive = np.mean([float(impl.loss(params, TINY, m["input_ids"], labels=m["labels"],
                                     attention_mask=m["attention_mask"])) for m in micro])
    loss, _ = impl.accumulate_gradients(impl, params, TINY, micro)
    assert abs(naive - loss) > 1e3 * F64_IDENTITY_RTOL * abs(loss)


@pytest.mark.equation("accum.grad_mean")
def test_accumulated_gradient_matches_finite_differences(impl):
    params = random_params(impl, TINY, seed=2)
    ids, mask, labels = _batch(seed=2)
    micro = _split(ids, mask, labels, [0, 2, 3, 5])
    _, grads = impl.accumulate_gradients(impl, params, TINY, micro)

    def full_loss(**p):
        return impl.loss(p, TINY, ids, labels=labels, attention_mask=mask)

    results = check_gradients(full_loss, params, grads, rng=np.random.default_rng(0),
                              op="accumulate_gradients")
    assert_all_passed(results)


@pytest.mark.equation("accum.grad_mean")
@given(data=st.data())
def test_accumulation_any_partition(impl, data):
    B = data.draw(st.integers(2, 5), label="B")
    cuts = sorted(data.draw(st.sets(st.integers(1, B - 1), max_size=B - 1), label="cuts"))
    seed = data.draw(st.integers(0, 2**16), label="seed")
    rng = np.random.default_rng(seed)
    T = 5
    ids = rng.integers(0, 4, size=(B, T))
    mask = (np.arange(T)[None, :] < rng.integers(1, T + 1, size=B)[:, None]).astype(np.int64)
    picked = (rng.random((B, T)) < rng.random(B)[:, None]) & (mask == 1)
    picked[0, 0] = True  # the logical batch predicts something
    labels = np.where(picked, rng.integers(0, TINY.vocab_size, size=(B, T)), -100)
    params = random_params(impl, TINY, seed=seed % 7)
    require(I.accumulation_matches_full_batch(impl, params, TINY,
                                              _split(ids, mask, labels, [0, *cuts, B])))


@pytest.mark.equation("accum.grad_mean")
def test_accumulation_mse_head_weights_by_element_count(impl):
    params = random_params(impl, TINY_MSE, seed=3)
    rng = np.random.default_rng(3)
    ids = rng.integers(0, 6, size=(5, 6))
    targets = rng.standard_normal((5, 6, TINY_MSE.hidden))
    micro = [{"input_ids": ids[a:b], "targets": targets[a:b]} for a, b in ((0, 1), (1, 5))]
    require(I.accumulation_matches_full_batch(impl, params, TINY_MSE, micro))


def test_accumulation_rejects_a_batch_without_masked_tokens(impl):
    params = random_params(impl, TINY, seed=0)
    ids, mask, labels = _batch()
    with pytest.raises(ValueError, match="micro_batches.*ignore_index"):
        impl.accumulate_gradients(impl, params, TINY, _split(ids, mask, labels, [2, 3]))
    with pytest.raises(ValueError, match="micro_batches"):
        impl.accumulate_gradients(impl, params, TINY, [])
