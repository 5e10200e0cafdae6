"""A single-head attention class adapted with ``layer()`` and declared
``attention.heads = "single"`` (issue 28, found on a public repository): the suite calls it
without ``n_heads`` (the variant drops the keyword), so the adapter must not require it.  Before:
``TypeError: missing a required argument: 'n_heads'`` from inspect.py in every attention check
(a false red), or, with ``n_heads`` in the class's factory, every check n/a (a whole row
silently out).  Now the correct class is green on the attention row and a buggy one red on it.
"""

from __future__ import annotations

import types

import numpy as np
import pytest

from minibert_reference import ops as R
from minibert_spec.suite import check_implementation
from minibert_spec.suite.adapters import layer

NAMES = ("W_q", "W_k", "W_v", "W_o", "b_q", "b_k", "b_v", "b_o")  # the protocol's order


class SingleHeadAttention:
    """One head over the whole width H (d_k = H), weights as attributes, gradients stored on
    the layer by backward(dy) -> dx: the shape of the slides' class.  ``bug`` scales dx."""

    def __init__(self, H: int, bug: float = 1.0):
        self.H, self.bug = H, bug
        for n in NAMES:
            setattr(self, n, None)

    def forward(self, x):
        y, self.cache = R.attention_forward(x, *(getattr(self, n) for n in NAMES), n_heads=1)
        return y

    def backward(self, dy):
        dx, *grads = R.attention_backward(dy, self.cache)
        self.grads = dict(zip(NAMES, grads))
        return dx * self.bug


def _module(bug: float) -> types.ModuleType:
    m = types.ModuleType(f"single_head_{bug}")
    m.CAPABILITIES = {"attention": {"heads": "single"}}
    m.attention_forward, m.attention_backward = layer(
        "attention", lambda W_q: SingleHeadAttention(W_q.shape[0], bug),
        params={n: n for n in NAMES}, grads={n: f"grads.{n}" for n in NAMES})
    return m


@pytest.mark.slow  # the slow tier: >= 4.5 s of the default run (issue 40)
@pytest.mark.parametrize("bug, verdict", [(1.0, "ok"), (1.001, "FAIL")])
def test_a_single_head_class_is_judged_on_the_attention_row(bug, verdict):
    report = check_implementation(_module(bug), ops=["attention"], kinds=["fd", "oracle"])
    assert report.verdicts()["attention"] == verdict, report.summary()
    checked = [r for r in report.results if r.outcome in ("passed", "failed")]
    assert len(checked) >= 4, [(r.id, r.outcome, r.message[:200]) for r in report.results]
    if verdict == "ok":
        assert not report.failures()
    else:
        assert all("dx" in r.message or "d/dx" in r.message for r in report.failures()), [
            r.message[:300] for r in report.failures()]


def test_the_single_head_layer_takes_a_call_without_n_heads():
    forward, backward = _module(1.0).attention_forward, _module(1.0).attention_backward
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 3, 4))
    p = {n: rng.standard_normal((4, 4) if n[0] == "W" else (4,)) for n in NAMES}
    y, cache = forward(x, **p)  # no n_heads: the variant's call
    want, _ = R.attention_forward(x, *(p[n] for n in NAMES), n_heads=1)
    np.testing.assert_array_equal(y, want)
    assert len(backward(np.ones_like(y), cache)) == 9
