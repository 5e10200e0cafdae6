"""``minibert adapter infer``'s loss rows: ``linear_cross_entropy`` (the LM head fused with its
loss; its labels after the parameters in the protocol, before or after them in the user's code;
a backward from dloss = 1 adapted with ``upstream=False`` so that the suite's dloss applies) and
the forms both cross-entropies declare (``ignore_index`` False where an ignored label makes the
code raise, never where it gives a wrong loss; ``reduction`` "mean" where the adapter passes
none, unless the code's mean over no predicted position is not 0: the sum derived from it
would not be either)."""

from __future__ import annotations

import re

import numpy as np
import pytest

import minibert_reference as R
from minibert_spec.suite.infer import infer_source
from minibert_spec.suite.infer.losses import SUM_OF_NOTHING_CHECKED
from tests.examples import infer_functions, infer_layers
from tests.examples import realstyle_lm_head_loss as lm_head
from tests.suite.infer_support import exec_source as _exec
from tests.suite.infer_support import load_source as _load
from tests.unshrunk import check_implementation

# an upstream gradient other than 1: a backward that ignores it (or the adapter's scaling) shows
DLOSS = -0.7


def _lce_values(seed=0, shape=(2, 4), n=3, V=6, bias=True):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((*shape, n)), rng.standard_normal((n, V)),
            rng.standard_normal(V) if bias else None, rng.integers(0, V, shape))


def _assert_lce_like_reference(adapter, bias=True):
    """The adapter's linear_cross_entropy pair against the reference's, at dloss != 1."""
    x, W, b, labels = _lce_values(bias=bias)
    loss, cache = adapter.linear_cross_entropy_forward(x, W, b, labels)
    want, ref_cache = R.linear_cross_entropy_forward(x, W, b, labels)
    np.testing.assert_allclose(loss, want, rtol=1e-12)
    got = adapter.linear_cross_entropy_backward(np.float64(DLOSS), cache)
    for g, w in zip(got, R.linear_cross_entropy_backward(np.float64(DLOSS), ref_cache)):
        assert (g is None) == (w is None), (g, w)
        if w is not None:
            np.testing.assert_allclose(g, w, rtol=1e-10, atol=1e-12)


def test_the_lm_head_loss_is_mapped_with_its_labels_after_its_parameters():
    """realstyle_lm_head_loss: lm_loss(x, W, b, targets) and lm_loss_backward(cache) for dloss =
    1 -- the hand adapter's row: the labels by keyword, the suite's dloss applied
    (upstream=False), no ignore_index and the mean declared."""
    src = infer_source(lm_head.__name__)
    assert "inputs=('x', 'W', 'b', 'labels')" in src, src
    assert "upstream=False" in src and "again=('forward[1]',)" in src, src
    assert ("CAPABILITIES = {'linear_cross_entropy': {'ignore_index': False, "
            "'reduction': 'mean'}}") in src, src
    assert "lm_loss(x, W=W, b=b, targets=labels) equals" in src, src
    _assert_lce_like_reference(_exec(src))
    _assert_lce_like_reference(_exec(src), bias=False)


def test_labels_before_the_parameters_are_passed_there(tmp_path, monkeypatch):
    """A loss function taking its labels right after x (``head_loss(h, y, W, b=None)``)."""
    _load(tmp_path, monkeypatch, """
        from minibert_reference import ops

        def head_loss(h, y, W, b=None):
            return ops._linear_cross_entropy_forward(h, W, b, y)

        def head_loss_backward(dloss, cache):
            return ops._linear_cross_entropy_backward(dloss, cache)
        """, "lce_labels_first")
    src = infer_source("lce_labels_first")
    assert "inputs=('x', 'labels', 'W', 'b')" in src, src
    assert "upstream=False" not in src, src
    _assert_lce_like_reference(_exec(src))


def test_a_loss_class_whose_backward_takes_no_upstream_gradient_gets_the_suites_dloss():
    """infer_layers.LMHeadLoss(W, b=None): ``backward()`` from dloss = 1, its W and b attributes
    (with and without a bias)."""
    src = infer_source(infer_layers.__name__)
    row = src[src.index("'linear_cross_entropy', lambda W, b: impl.LMHeadLoss(W=W, b=b)"):]
    row = row[:row.index("\n\n")]
    assert "params={'W': 'W', 'b': 'b'}" in row and "grads={'W': 'dW', 'b': 'db'}" in row, row
    assert "inputs=('x', 'labels')" in row and "upstream=False" in row, row
    _assert_lce_like_reference(_exec(src))
    _assert_lce_like_reference(_exec(src), bias=False)


def test_a_cross_entropy_with_an_undefined_mean_of_nothing_declares_no_reduction():
    """The reference's kernels take ignore_index = -100, and their mean over no predicted
    position is 0/0: for cross_entropy, whose sum over nothing the suite checks, a sum derived
    from that mean could not be 0, so no reduction is declared; linear_cross_entropy's is."""
    src = infer_source(infer_functions.__name__)
    assert "CAPABILITIES = {'linear_cross_entropy': {'reduction': 'mean'}}" in src, src
    assert "ignore_index" not in src, src
    assert src.count("with every label ignored its loss is nan, not 0") == 1, src
    assert src.count("reduction left undeclared") == 1, src


def test_the_ops_whose_sum_over_nothing_infer_minds_are_those_the_suite_checks():
    from minibert_spec.suite.registry import all_checks

    checked = {m.group(1) for c in all_checks()
               if (m := re.fullmatch(r"invariant\[(\w+)\.sum_of_nothing_is_zero\]", c.id))}
    assert checked == set(SUM_OF_NOTHING_CHECKED), checked


_GUARDED_MEAN = """
    from minibert_reference import ops

    def cross_entropy(logits, labels):  # the mean over the kept positions, 0 over none
        loss, cache = ops._cross_entropy_forward(logits, labels, reduction="sum")
        n = max(int((labels != -100).sum()), 1)
        return loss / n, (cache, n)

    def cross_entropy_backward(dloss, cache):
        return ops._cross_entropy_backward(dloss / cache[1], cache[0])[0]
    """


def test_a_mean_taking_ignored_positions_and_zero_over_none_declares_the_mean(
        tmp_path, monkeypatch):
    _load(tmp_path, monkeypatch, _GUARDED_MEAN, "ce_guarded_mean")
    src = infer_source("ce_guarded_mean")
    assert "CAPABILITIES = {'cross_entropy': {'reduction': 'mean'}}" in src, src
    assert "declared reduction='mean'" in src, src


_RAISING_CE = """
    import numpy as np

    class SoftmaxCrossEntropy:
        def forward(self, logits, y):
            z = logits - logits.max(axis=-1, keepdims=True)
            self.p = np.exp(z) / np.exp(z).sum(axis=-1, keepdims=True)
            self.y = y
            return -np.log(np.take_along_axis(self.p, y[..., None], axis=-1)).mean()

        def backward(self, dloss):
            d = self.p.copy()
            np.put_along_axis(d, self.y[..., None],
                              np.take_along_axis(d, self.y[..., None], axis=-1) - 1, axis=-1)
            return dloss * d / self.y.size
    """


def test_a_cross_entropy_raising_on_an_ignored_label_declares_ignore_index_false(
        tmp_path, monkeypatch):
    _load(tmp_path, monkeypatch, _RAISING_CE, "ce_raising")
    src = infer_source("ce_raising")
    assert ("CAPABILITIES = {'cross_entropy': {'ignore_index': False, 'reduction': 'mean'}}"
            in src), src
    assert "it raises IndexError" in src, src


def test_a_wrong_loss_on_an_ignored_label_is_never_declared_away(tmp_path, monkeypatch):
    """Masked, but the mean over every position (ignored ones included): declaring
    ignore_index=False would hide the bug from the suite -- left undeclared, said why."""
    _load(tmp_path, monkeypatch, """
        from minibert_reference import ops

        def cross_entropy(logits, labels):
            loss, cache = ops._cross_entropy_forward(logits, labels, reduction="sum")
            return loss / labels.size, (cache, labels.size)

        def cross_entropy_backward(dloss, cache):
            return ops._cross_entropy_backward(dloss / cache[1], cache[0])[0]
        """, "ce_mean_over_all")
    src = infer_source("ce_mean_over_all")
    assert "cross_entropy_forward, cross_entropy_backward = layer(" in src, src
    assert "'ignore_index'" not in src, src
    assert "ignore_index left undeclared (the protocol's)" in src, src


def test_a_reduction_keyword_the_adapter_passes_is_not_declared(tmp_path, monkeypatch):
    """A class forward taking ``ignore_index`` and ``reduction``: the adapter passes them, the
    suite calls both reductions, nothing is declared."""
    _load(tmp_path, monkeypatch, """
        from minibert_reference import ops

        class CrossEntropy:
            def forward(self, logits, labels, ignore_index=-100, reduction="mean"):
                loss, self.cache = ops._cross_entropy_forward(
                    logits, labels, ignore_index=ignore_index, reduction=reduction)
                return loss

            def backward(self, dloss):
                return ops._cross_entropy_backward(dloss, self.cache)[0]
        """, "ce_keywords")
    src = infer_source("ce_keywords")
    assert "inputs=('logits', 'labels', 'ignore_index', 'reduction')" in src, src
    assert "CAPABILITIES" not in src, src


@pytest.mark.slow  # the slow tier: >= 5 s of the default run (issue 40)
def test_the_inferred_lm_head_adapter_is_green_on_correct_and_red_on_buggy(tmp_path,
                                                                           monkeypatch):
    """minibert check on what infer writes: the correct pair green, and the pair whose backward
    divides by the batch instead of every position (the example's bug "rows", planted as the
    backward's default) red -- the same row written for both: no gradient was looked at."""
    _load(tmp_path, monkeypatch, """
        from tests.examples.realstyle_lm_head_loss import lm_loss as _forward
        from tests.examples.realstyle_lm_head_loss import lm_loss_backward as _backward

        def lm_loss(x, W, b, targets):  # defined here: infer reads this module's own functions
            return _forward(x, W, b, targets)

        def lm_loss_backward(cache, bug="rows"):
            return _backward(cache, bug)
        """, "lm_head_rows")
    correct, buggy = infer_source(lm_head.__name__), infer_source("lm_head_rows")
    assert correct.replace(lm_head.__name__, "lm_head_rows") == buggy
    for source, verdict in ((correct, "ok"), (buggy, "FAIL")):
        adapter = _load(tmp_path, monkeypatch, source, f"inferred_lm_head_{verdict.lower()}")
        report = check_implementation(adapter, ops=["linear_cross_entropy"],
                                      first_red=verdict == "FAIL")
        assert report.verdicts()["linear_cross_entropy"] == verdict, report.summary()
