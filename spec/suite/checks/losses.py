"""Numerical edges where outside bugs hid: cross-entropy at logits of magnitude 1e4 (a
log-softmax without its max shift overflows) and with an ``ignore_index`` other than -100 (a
loss that masks with the default silently scores the ignored rows); softmax at logits of 1e4;
LayerNorm on float32 rows whose mean is large against their spread (a one-pass variance cancels)
and with eps across 1e-12 .. 1e-3 (an eps outside the square root shows).  References are
computed here in float64 (``np.logaddexp``, two-pass moments), independent of the
implementation."""

from __future__ import annotations

import numpy as np

from minibert_reference.config import mini_bert
from minibert_spec.numerics.asserts import assert_close, assert_finite, assert_rel
from minibert_spec.numerics.finite_differences import random_params
from minibert_spec.protocol import IGNORE_INDEX
from minibert_spec.protocol.capabilities import capabilities, declared_guards
from minibert_spec.protocol.guards import (
    cross_entropy_adjustment,
    declared_on,
    guarded_nll,
    mean_divisor,
)
from minibert_spec.protocol.variants import call_eps
from minibert_spec.suite.registry import check, grid
from minibert_spec.tolerances import F64_IDENTITY_RTOL, ORACLE_RTOL_F32

TINY = mini_bert(n_layers=1, hidden=8, n_heads=2, intermediate=16, max_len=6, vocab_size=11)
CE_IDS = ("loss.ce.mean", "loss.ce.sum", "loss.ce.backward.mean", "loss.ce.backward.sum")


def _log_softmax(logits: np.ndarray) -> np.ndarray:
    x = logits.astype(np.float64)
    return x - np.logaddexp.reduce(x, axis=-1, keepdims=True)


def expected_cross_entropy(logits, labels, ignore_index, reduction, guards=None):
    """(loss, dlogits, dlogits allowance) in float64: -sum log p[label] over the predicted rows
    (/ N for the mean) -- under the implementation's declared loss guards (spec/protocol/
    guards.py: the log's, the mean's divisor), if any; softmax - onehot on predicted rows, 0
    on ignored ones, and how far a guarded gradient may be from it (0 without a guard)."""
    logp = _log_softmax(logits)
    valid = labels != ignore_index
    safe = np.where(valid, labels, 0)
    picked = np.take_along_axis(logp, safe[..., None], axis=-1)[..., 0]
    n = valid.sum() if reduction == "mean" else 1
    grad = np.exp(logp)
    np.put_along_axis(grad, safe[..., None],
                      np.take_along_axis(grad, safe[..., None], axis=-1) - 1, axis=-1)
    guards = declared_on("cross_entropy", guards or {})
    nll = guarded_nll(picked, guards)
    _, allow, _ = cross_entropy_adjustment(guards, logits, labels, ignore_index, reduction)
    return (nll[valid].sum() / mean_divisor(int(valid.sum()), reduction, guards),
            grad * valid[..., None] / n, allow)


def _large_logits(dtype, seed=0):
    """[2, 5, 7] logits of magnitude ~1e4 with both signs, labels with ignored rows, and a row
    whose label is the smallest logit (log p ~ -2e4)."""
    rng = np.random.default_rng(seed)
    logits = 1e4 * rng.choice([-1.0, 1.0], size=(2, 5, 7)) + rng.standard_normal((2, 5, 7))
    labels = rng.integers(0, 7, size=(2, 5))
    labels[0, 1] = labels[1, 3] = labels[1, 4] = IGNORE_INDEX  # ignored rows
    labels[0, 0] = int(np.argmin(logits[0, 0]))
    return logits.astype(dtype), labels


# a loss on probabilities cannot take logits of 1e4 (softmax underflows to exact 0, log 0):
# incomparable there, so not applicable, saying why
@check("invariant", "cross_entropy.large_logits", equations=CE_IDS,
       cases=grid(dtype=[np.float64, np.float32], reduction=["mean", "sum"]),
       needs={"cross_entropy.ignore_index": True, "cross_entropy.input": "logits"})
def cross_entropy_is_stable_at_large_logits(impl, dtype, reduction):
    """Logits ~1e4 of both signs: finite loss and gradient equal to the float64 log-sum-exp
    reference; ignored rows get exactly zero gradient."""
    logits, labels = _large_logits(dtype)
    loss, cache = impl.cross_entropy_forward(logits, labels, reduction=reduction)
    (dlogits,) = impl.cross_entropy_backward(1.0, cache)
    want_loss, want_grad, allow = expected_cross_entropy(logits, labels, IGNORE_INDEX,
                                                         reduction, declared_guards(impl))
    rtol = F64_IDENTITY_RTOL if dtype == np.float64 else ORACLE_RTOL_F32
    assert_finite(loss, want_loss, "loss at logits of magnitude 1e4")
    assert_finite(dlogits, want_grad, "dlogits at logits of magnitude 1e4")
    assert_rel(loss, want_loss, rtol, "loss")
    assert_close(dlogits, want_grad, rtol=rtol, atol=rtol * np.abs(want_grad).max() + allow,
                 what="dlogits")
    assert not np.any(dlogits[labels == IGNORE_INDEX]), "ignored rows got a gradient"


@check("invariant", "cross_entropy.ignore_index", equations=CE_IDS,
       cases=grid(ignore_index=[("neg1", -1), 3, 1000], reduction=["mean", "sum"]),
       needs={"cross_entropy.ignore_index": True})
def cross_entropy_honours_ignore_index(impl, ignore_index, reduction):
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
    want_loss, want_grad, allow = expected_cross_entropy(
        logits, np.where(ignored, IGNORE_INDEX, labels), IGNORE_INDEX, reduction,
        declared_guards(impl))
    assert_rel(loss, want_loss, F64_IDENTITY_RTOL, "loss")
    assert_close(dlogits, want_grad, rtol=F64_IDENTITY_RTOL, atol=1e-15 + allow, what="dlogits")


@check("invariant", "model.ignore_index", equations=("loss.ce.mean", "loss.ce.sum"),
       ops=("model", "cross_entropy"), cases=grid(reduction=["mean", "sum"]))
def model_loss_honours_ignore_index(impl, reduction):
    """The model's loss, loss_and_grads and masked_lm_loss_and_grads with ignore_index=-1 equal
    the same calls with those positions marked -100 (the default)."""
    params = random_params(impl, TINY, seed=0)
    rng = np.random.default_rng(2)
    ids = rng.integers(0, TINY.vocab_size, size=(3, 6))
    labels = np.full((3, 6), IGNORE_INDEX)
    labels[0, [1, 4]] = [3, 5]
    labels[2, [0, 2, 5]] = [1, 1, 9]
    minus_one = np.where(labels == IGNORE_INDEX, -1, labels)
    want = float(impl.loss(params, TINY, ids, labels=labels, reduction=reduction))
    got = float(impl.loss(params, TINY, ids, labels=minus_one, reduction=reduction,
                          ignore_index=-1))
    assert_rel(got, want, F64_IDENTITY_RTOL, "loss(ignore_index=-1)")
    value, grads, _ = impl.loss_and_grads(params, TINY, ids, labels=minus_one,
                                          reduction=reduction, ignore_index=-1)
    _, want_grads, _ = impl.loss_and_grads(params, TINY, ids, labels=labels, reduction=reduction)
    assert_rel(value, want, F64_IDENTITY_RTOL, "loss_and_grads(ignore_index=-1)")
    for name, g in want_grads.items():
        assert_close(grads[name], g, rtol=1e-9, atol=1e-12, what=name)
    sparse, _, _ = impl.masked_lm_loss_and_grads(params, TINY, ids, labels=minus_one,
                                                 reduction=reduction, ignore_index=-1)
    assert_rel(sparse, want, 1e-9, "masked_lm_loss_and_grads(ignore_index=-1)")


# --------------------------------------------------------------------------- softmax
@check("invariant", "softmax.large_logits", equations=("softmax.forward",),
       cases=grid(dtype=[np.float64, np.float32], masked=[False, True]))
def softmax_is_stable_at_large_logits(impl, dtype, masked):
    """Logits ~1e4 of both signs (and masked keys): exp overflows far below that, so only a
    max-shifted softmax is finite; compared with the float64 log-sum-exp reference."""
    rng = np.random.default_rng(0)
    x = (1e4 * rng.choice([-1.0, 1.0], size=(2, 3, 6)) + rng.standard_normal((2, 3, 6)))
    mask = None
    if masked:
        mask = rng.random((2, 3, 6)) < 0.7
        mask[..., 0] = True  # every row keeps a key
    x = x.astype(dtype)
    p = impl.softmax_forward(x, mask)[0] if masked else impl.softmax_forward(x)[0]
    z = np.where(mask, x.astype(np.float64), -np.inf) if masked else x.astype(np.float64)
    want = np.exp(z - np.logaddexp.reduce(z, axis=-1, keepdims=True))
    rtol = F64_IDENTITY_RTOL if dtype == np.float64 else ORACLE_RTOL_F32
    assert_finite(p, want, "softmax at logits of magnitude 1e4")
    assert_close(p, want, rtol=rtol, atol=rtol, what="softmax")


# --------------------------------------------------------------------------- layernorm
F32 = np.finfo(np.float32).eps


def _layernorm64(x, gamma, beta, eps):
    x = x.astype(np.float64)
    mu = x.mean(axis=-1, keepdims=True)
    var = ((x - mu) ** 2).mean(axis=-1, keepdims=True)
    return gamma.astype(np.float64) * (x - mu) / np.sqrt(var + eps) + beta.astype(np.float64)


@check("invariant", "layernorm.large_mean_float32", equations=("layernorm.forward",),
       cases=grid(ratio=[1e2, 1e3]), needs={"layernorm.affine": True})
def float32_rows_with_large_mean_relative_to_spread(impl, ratio):
    """Rows mean +-ratio, spread 1, float32.  The float32 mean itself is off by ~eps32 * |mu|,
    so x_hat can be off by that over sigma: allowed 4 * eps32 * ratio (a data condition).  A
    one-pass variance loses ~eps32 * mu^2 / sigma^2 of the variance instead: 40x to 2500x more.
    eps 1e-5, or the implementation's own (none, or the one its code fixes): it does not
    matter here, the rows' variance is ~1."""
    rng = np.random.default_rng(0)
    x = (ratio * rng.choice([-1.0, 1.0], size=(32, 1))
         + rng.standard_normal((32, 48))).astype(np.float32)
    gamma = (1.0 + 0.5 * rng.standard_normal(48)).astype(np.float32)
    beta = (0.5 * rng.standard_normal(48)).astype(np.float32)
    eps = call_eps(capabilities(impl), 1e-5)
    y, _ = impl.layernorm_forward(x, gamma, beta, eps)
    want = _layernorm64(x, gamma, beta, eps)
    assert y.dtype == np.float32, f"float32 inputs gave {y.dtype}"
    atol = 4 * F32 * ratio * np.abs(gamma).max()
    assert_close(y, want, rtol=0, atol=atol, what="layernorm output")


@check("invariant", "layernorm.eps_inside_sqrt", equations=("layernorm.forward",),
       cases=grid(eps=[1e-12, 1e-8, 1e-5, 1e-3]),
       needs={"layernorm.affine": True, "layernorm.eps": True})
def layernorm_eps_inside_the_square_root(impl, eps):
    """y = gamma (x - mu) / sqrt(var + eps) + beta in float64 for eps across 1e-12 .. 1e-3, on
    rows with small variance (~1e-2), where eps matters."""
    rng = np.random.default_rng(1)
    x = 0.1 * rng.standard_normal((4, 3, 6))
    gamma, beta = 1.0 + 0.5 * rng.standard_normal(6), 0.1 * rng.standard_normal(6)
    y, _ = impl.layernorm_forward(x, gamma, beta, eps)
    assert_close(y, _layernorm64(x, gamma, beta, eps), rtol=1e-12, atol=1e-13,
                 what=f"layernorm output at eps {eps:g}")
