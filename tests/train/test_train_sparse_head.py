"""The sparse MLM head the trainer uses (logits only where a label is predicted) gives the same
loss and gradients as the model's full-head loss_and_grads, and agrees with finite differences."""

import numpy as np
import pytest

from minibert_reference.config import mini_bert
from minibert_spec.numerics.finite_differences import (
    assert_all_passed,
    check_gradients,
    random_batch,
    random_params,
)
from minibert_spec.tolerances import ORACLE_RTOL_F64

CFG = mini_bert(n_layers=2, hidden=8, n_heads=2, intermediate=16, max_len=8, vocab_size=29)


@pytest.mark.equation("loss.ce.mean", "loss.ce.sum")
@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_sparse_head_equals_full_head(impl, reduction):
    params = random_params(impl, CFG, seed=4)
    b = random_batch(CFG, B=3, T=8, seed=4)
    kw = dict(labels=b["labels"], attention_mask=b["attention_mask"], reduction=reduction)
    full, g_full, d_full = impl.loss_and_grads(params, CFG, b["input_ids"], **kw)
    sparse, g_sparse, d_sparse = impl.masked_lm_loss_and_grads(params, CFG, b["input_ids"], **kw)
    assert float(sparse) == pytest.approx(float(full), rel=ORACLE_RTOL_F64)
    assert list(g_sparse) == list(g_full)
    np.testing.assert_allclose(d_sparse, d_full, rtol=ORACLE_RTOL_F64, atol=0)
    for k in g_full:
        assert g_sparse[k].dtype == g_full[k].dtype
        np.testing.assert_allclose(g_sparse[k], g_full[k], rtol=ORACLE_RTOL_F64,
                                   atol=0, err_msg=k)


def test_sparse_head_matches_finite_differences(impl):
    params = random_params(impl, CFG, seed=5)
    b = random_batch(CFG, B=2, T=8, seed=5)
    _, grads, _ = impl.masked_lm_loss_and_grads(params, CFG, b["input_ids"], labels=b["labels"],
                                             attention_mask=b["attention_mask"])

    def loss(**p):
        return impl.loss(p, CFG, b["input_ids"], labels=b["labels"],
                         attention_mask=b["attention_mask"])

    assert_all_passed(check_gradients(loss, params, grads, rng=np.random.default_rng(5),
                                      op="masked_lm_loss_and_grads"))


def test_sparse_head_validates(impl):
    params = random_params(impl, CFG, seed=0)
    b = random_batch(CFG, B=2, T=8, seed=0)
    with pytest.raises(ValueError, match="labels"):
        impl.masked_lm_loss_and_grads(params, CFG, b["input_ids"], labels=b["labels"][:, :3])
    with pytest.raises(ValueError, match="labels"):
        impl.masked_lm_loss_and_grads(params, CFG, b["input_ids"],
                                      labels=np.full_like(b["labels"], -100))
