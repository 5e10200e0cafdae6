"""A declared loss guard allows two gradients (spec/protocol/guards.py): the guarded log's -- the
exact derivative of the guarded forward -- and the plain log's, which code that guards only its
forward returns.  Every kind of check takes both, in each input form of the loss (logits;
probabilities with dL/dlogits; probabilities with dL/dp), at a guard large enough for finite
differences to see the difference (log_eps = 1e-3: the factor p/(p + eps) is 1e-3/p from 1);
a gradient the guard does not allow -- its difference applied the wrong way -- stays red.

Found on a public repository (issue 28): -mean log(p_y + 1e-9) with (p - y)/N returned was red in
``fd[cross_entropy_rows_mean]`` (1.15e-6 over rtol 1e-6) and in the probabilities rows' oracle
forward (the guard's shift was not added for a loss of probabilities)."""

from __future__ import annotations

import types

import numpy as np
import pytest

from minibert_spec.suite import check_implementation

EPS = 1e-3


def _softmax(z):
    e = np.exp(z - z.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def _implementation(form: str, gradient: str) -> types.ModuleType:
    """A cross-entropy over ``form`` ("logits", "probabilities_dlogits", "probabilities") that
    computes -mean log(p_y + EPS) and returns the ``gradient`` "guarded" (of that formula),
    "plain" (of -mean log p_y) or "wrong" (guarded - (plain - guarded): the guard's
    difference applied the wrong way)."""
    m = types.ModuleType(f"ce_{form}_{gradient}")
    m.CAPABILITIES = {"cross_entropy": {"ignore_index": False, "input": form,
                                        "reduction": "mean"},
                      "guards": {"log_eps": EPS}}

    def cross_entropy_forward(x, labels):
        p = x if form != "logits" else _softmax(x)
        p_y = np.take_along_axis(p, labels[..., None], -1)[..., 0]
        return -np.mean(np.log(p_y + EPS)), (p, labels, p_y)

    def cross_entropy_backward(dloss, cache):
        p, labels, p_y = cache
        n = labels.size
        onehot = np.zeros_like(p)
        np.put_along_axis(onehot, labels[..., None], 1.0, -1)
        factor = {"guarded": p_y / (p_y + EPS), "plain": np.ones_like(p_y),
                  "wrong": 2 * p_y / (p_y + EPS) - 1}[gradient][..., None]
        if form == "probabilities":  # dL/dp: only each label's entry
            grad = -factor * onehot / np.where(onehot > 0, p, 1.0) / n
        else:  # dL/dlogits
            grad = factor * (p - onehot) / n
        return ((dloss * grad).astype(p.dtype),)

    m.cross_entropy_forward = cross_entropy_forward
    m.cross_entropy_backward = cross_entropy_backward
    return m


FORMS = ["logits", "probabilities_dlogits", "probabilities"]


@pytest.mark.slow  # the slow tier: >= 5 s of the default run (issue 40)
@pytest.mark.parametrize("gradient", ["guarded", "plain"])
@pytest.mark.parametrize("form", FORMS)
def test_either_gradient_of_a_guarded_loss_is_green_in_every_kind(form, gradient):
    report = check_implementation(_implementation(form, gradient), ops=["cross_entropy"],
                                  oracle="require")
    assert report.verdicts()["cross_entropy"] == "ok", report.summary()
    assert not report.failures(), [(r.id, r.message[:300]) for r in report.failures()]


@pytest.mark.slow  # the slow tier: >= 5 s of the default run (issue 40)
@pytest.mark.parametrize("form", FORMS)
def test_a_gradient_the_guard_does_not_allow_is_red(form):
    report = check_implementation(_implementation(form, "wrong"), ops=["cross_entropy"],
                                  oracle="require")
    assert report.verdicts()["cross_entropy"] == "FAIL", report.summary()
    kinds = {r.kind for r in report.failures()}
    assert "fd" in kinds and "oracle.backward" in kinds, kinds
