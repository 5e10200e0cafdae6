"""Cross-entropy where the outside bugs hid: logits of magnitude 1e4 (a log-softmax without its
max shift overflows), an ``ignore_index`` other than -100 (a loss that masks with the default
silently scores the ignored rows), and the held-out evaluation, which must be the loss over every
held-out token at once (not the mean of per-batch means).  References are computed here in
float64 with ``np.logaddexp``, independent of the implementation."""

from __future__ import annotations

import numpy as np
import pytest

from reference.config import mini_bert
from spec.gradcheck import random_params
from spec.tolerances import F64_IDENTITY_RTOL, ORACLE_RTOL_F32

TINY = mini_bert(n_layers=1, hidden=8, n_heads=2, intermediate=16, max_len=6, vocab_size=11)
CE_IDS = ("loss.ce.mean", "loss.ce.sum", "loss.ce.backward.mean", "loss.ce.backward.sum")


def _log_softmax(logits: np.ndarray) -> np.ndarray:
    x = logits.astype(np.float64)
    return x - np.logaddexp.reduce(x, axis=-1, keepdims=True)


def _expected(logits, labels, ignore_index, reduction):
    """(loss, dlogits) in float64: -sum log p[label] over the predicted rows (/ N for the
    mean); softmax - onehot on predicted rows, 0 on ignored ones."""
    logp = _log_softmax(logits)
    valid = labels != ignore_index
    safe = np.where(valid, labels, 0)
    picked = np.take_along_axis(logp, safe[..., None], axis=-1)[..., 0]
    n = valid.sum() if reduction == "mean" else 1
    grad = np.exp(logp)
    np.put_along_axis(grad, safe[..., None],
                      np.take_along_axis(grad, safe[..., None], axis=-1) - 1, axis=-1)
    return -picked[valid].sum() / n, grad * valid[..., None] / n


def _large_logits(dtype, seed=0):
    """[2, 5, 7] logits of magnitude ~1e4 with both signs, labels with ignored rows, and a row
    whose label is the smallest logit (log p ~ -2e4)."""
    rng = np.random.default_rng(seed)
    logits = 1e4 * rng.choice([-1.0, 1.0], size=(2, 5, 7)) + rng.standard_normal((2, 5, 7))
    labels = rng.integers(0, 7, size=(2, 5))
    labels[0, 1] = labels[1, 3] = labels[1, 4] = -100  # ignored rows
    labels[0, 0] = int(np.argmin(logits[0, 0]))
    return logits.astype(dtype), labels


@pytest.mark.equation(*CE_IDS)
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_cross_entropy_is_stable_at_large_logits(impl, dtype, reduction):
    logits, labels = _large_logits(dtype)
    loss, cache = impl.cross_entropy_forward(logits, labels, reduction=reduction)
    (dlogits,) = impl.cross_entropy_backward(1.0, cache)
    want_loss, want_grad = _expected(logits, labels, -100, reduction)
    rtol = F64_IDENTITY_RTOL if dtype == np.float64 else ORACLE_RTOL_F32
    assert np.isfinite(loss) and np.all(np.isfinite(dlogits)), (loss, dlogits)
    assert float(loss) == pytest.approx(want_loss, rel=rtol)
    np.testing.assert_allclose(dlogits, want_grad, rtol=rtol, atol=rtol * np.abs(want_grad).max())
    assert not np.any(dlogits[labels == -100]), "ignored rows got a gradient"


@pytest.mark.equation(*CE_IDS)
@pytest.mark.parametrize("ignore_index", [-1, 3, 1000])
@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_cross_entropy_honours_ignore_index(impl, ignore_index, reduction):
    """With ignore_index=-1 (or a class id, or a large one) the ignored rows contribute nothing:
    the same loss and gradient as with those rows marked -100."""
    rng = np.random.default_rng(1)
    logits = rng.standard_normal((3, 4, 5)) * 2.0
    labels = rng.integers(0, 5, size=(3, 4))
    labels[labels == ignore_index] = (ignore_index + 1) % 5  # no accidental ignores
    ignored = rng.random((3, 4)) < 0.4
    ignored[0, 0], ignored[0, 1] = True, False
    marked = np.where(ignored, ignore_index, labels)
    loss, cache = impl.cross_entropy_forward(logits, marked, ignore_index=ignore_index,
                                             reduction=reduction)
    (dlogits,) = impl.cross_entropy_backward(1.0, cache)
    want_loss, want_grad = _expected(logits, np.where(ignored, -100, labels), -100, reduction)
    assert float(loss) == pytest.approx(want_loss, rel=F64_IDENTITY_RTOL)
    np.testing.assert_allclose(dlogits, want_grad, rtol=F64_IDENTITY_RTOL, atol=1e-15)


@pytest.mark.equation("loss.ce.mean", "loss.ce.sum")
@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_model_loss_honours_ignore_index(impl, reduction):
    """The model's loss, loss_and_grads and masked_lm_loss_and_grads with ignore_index=-1 equal
    the same calls with those positions marked -100 (the default)."""
    params = random_params(impl, TINY, seed=0)
    rng = np.random.default_rng(2)
    ids = rng.integers(0, TINY.vocab_size, size=(3, 6))
    labels = np.full((3, 6), -100)
    labels[0, [1, 4]] = [3, 5]
    labels[2, [0, 2, 5]] = [1, 1, 9]
    minus_one = np.where(labels == -100, -1, labels)
    want = float(impl.loss(params, TINY, ids, labels=labels, reduction=reduction))
    got = float(impl.loss(params, TINY, ids, labels=minus_one, reduction=reduction,
                          ignore_index=-1))
    assert got == pytest.approx(want, rel=F64_IDENTITY_RTOL)
    value, grads, _ = impl.loss_and_grads(params, TINY, ids, labels=minus_one,
                                          reduction=reduction, ignore_index=-1)
    _, want_grads, _ = impl.loss_and_grads(params, TINY, ids, labels=labels, reduction=reduction)
    assert float(value) == pytest.approx(want, rel=F64_IDENTITY_RTOL)
    for name, g in want_grads.items():
        np.testing.assert_allclose(grads[name], g, rtol=1e-9, atol=1e-12, err_msg=name)
    sparse, _, _ = impl.masked_lm_loss_and_grads(params, TINY, ids, labels=minus_one,
                                                 reduction=reduction, ignore_index=-1)
    assert float(sparse) == pytest.approx(want, rel=1e-9)


@pytest.mark.equation("loss.ce.mean")
@pytest.mark.parametrize("batch_size", [1, 2, 4])
def test_evaluate_is_the_loss_over_every_held_out_token(impl, batch_size):
    """Held-out rows predicting 1, 5, 0, 0, 2, 3 tokens (a batch with none when batch_size is
    1 or 2): evaluate() equals the mean cross-entropy over all of them at once, not the mean of
    per-batch means."""
    from reference.train.loop import evaluate

    params = random_params(impl, TINY, seed=3)
    rng = np.random.default_rng(3)
    ids = rng.integers(0, TINY.vocab_size, size=(6, 6))
    mask = np.ones((6, 6), dtype=np.int64)
    mask[4, 5:] = 0
    labels = np.full((6, 6), -100)
    for row, n in enumerate([1, 5, 0, 0, 2, 3]):
        pos = rng.choice(int(mask[row].sum()), size=n, replace=False)
        labels[row, pos] = rng.integers(0, TINY.vocab_size, size=n)
    whole = float(impl.loss(params, TINY, ids, labels=labels, attention_mask=mask))
    got = evaluate(impl, params, TINY, ids, mask, labels, batch_size=batch_size)
    assert got == pytest.approx(whole, rel=1e-12)
