"""Issue 39, a class-style transformer block under a mask converter: GPT-2's pre-LN ``Block``
with its own additive ``[B, 1, T, T]`` mask (tests/examples/realstyle_block_mask.py), adapted
with ``layer("block", ..., mask=additive_mask)``: green in the block rows it declares, each
planted backward bug red naming the tensor, the index and both values, and a converter that
returns the wrong format red -- never a green."""

from __future__ import annotations

import types

import numpy as np
import pytest

from minibert_reference import ops as R
from minibert_spec.suite.adapters import layer
from tests.suite.test_adapters import NAMED
from tests.unshrunk import check_implementation

# the block rows GPT-2's block declares (pre-LN, bidirectional or causal, with or without keys
# masked): every other block family is another form, n/a
DECLARED = ("block_preln", "block_preln_mask", "block_causal", "block_causal_mask")


def _example(bugs, monkeypatch):
    from tests.examples import realstyle_block_mask as ex

    monkeypatch.setattr(ex, "BUGS", set(bugs))
    return ex


def _converted(converter) -> types.ModuleType:
    """The example's block under another converter."""
    from tests.examples import realstyle_block_mask as ex

    m = types.ModuleType("converted_block")
    m.CAPABILITIES = ex.CAPABILITIES
    m.block_forward, m.block_backward = layer(
        "block", lambda p, n_heads: ex.Block(len(p["ln1.gamma"]), n_heads,
                                             np.random.default_rng(0)),
        params={**ex.NAMES, "eps": "eps"}, grads={k: f"d{v}" for k, v in ex.NAMES.items()},
        fixed={"norm": "pre", "activation": "gelu_tanh"}, mask=converter)
    return m


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("mask", [None, np.array([[1, 1, 0], [1, 0, 1]])])
def test_the_converted_block_computes_the_reference_pre_ln_block(mask, causal, monkeypatch):
    """The class gets the suite's mask and causal flag in its own format: its output and every
    gradient are the reference's pre-LN GELU-tanh block's (float64, random upstream)."""
    ex = _example((), monkeypatch)
    rng = np.random.default_rng(3)
    p = {k: rng.standard_normal(s)
         for k, s in R.block_param_shapes(R.block_param_names(True, "pre"), 4, 6).items()}
    x, dout = rng.standard_normal((2, 3, 4)), rng.standard_normal((2, 3, 4))
    y, cache = ex.block_forward(x, p, n_heads=2, mask=mask, causal=causal, eps=1e-5)
    want, want_cache = R.block_forward(x, p, n_heads=2, mask=mask, causal=causal, eps=1e-5,
                                       norm="pre", activation="gelu_tanh")
    np.testing.assert_allclose(y, want, rtol=1e-10, atol=1e-12)
    dx, grads = ex.block_backward(dout, cache)
    want_dx, want_grads = R.block_backward(dout, want_cache)
    np.testing.assert_allclose(dx, want_dx, rtol=1e-10, atol=1e-12)
    assert set(grads) == set(want_grads)
    for k in want_grads:
        np.testing.assert_allclose(grads[k], want_grads[k], rtol=1e-10, atol=1e-12, err_msg=k)


@pytest.mark.parametrize("bugs, red", [((), set()),
                                       (("residual",), {"block_preln", "block_preln_mask"}),
                                       (("mask",), {"block_preln_mask"})])
def test_the_class_block_is_judged_through_its_converter(bugs, red, monkeypatch):
    """Fast: two of its FD families.  Correct: both pass (the masked one only runs through the
    converter).  "residual" is red everywhere; "mask" (the backward's softmax unmasked) only
    where a key is masked -- the unmasked family passes."""
    ex = _example(bugs, monkeypatch)
    ids = ["fd[block_preln]", "fd[block_preln_mask]"]
    report = check_implementation(ex, ids=ids)
    by_id = {r.id: r for r in report.results}
    want_red = {f"fd[{f}]" for f in red}
    assert {i for i in ids if by_id[i].outcome == "failed"} == want_red, report.summary()
    assert all(by_id[i].outcome == "passed" for i in ids if i not in want_red), report.summary()
    for i in want_red:
        first = by_id[i].message.splitlines()[0]
        assert NAMED.search(first) and " d/d" in first, first  # tensor, index, both values


def _transposed(mask, causal, T):
    return np.ones((T, 2)) if mask is None else np.asarray(mask, float).T


def _boolean(mask, causal, T):
    """Another class's format (True where attended) given to a class that adds its mask."""
    keep = np.tril(np.ones((T, T), bool)) if causal else np.ones((T, T), bool)
    return keep if mask is None else keep & (np.asarray(mask) != 0)[:, None, None, :]


def test_a_block_converter_of_the_wrong_shape_is_red_naming_it():
    report = check_implementation(_converted(_transposed), ops=["block"], kinds=["fd"],
                                  quick=True)
    assert report.verdicts()["block"] == "FAIL", report.summary()
    failed = report.failures()
    assert {r.id for r in failed} == {f"fd[{f}]" for f in DECLARED}, report.summary()
    says = "layer('block'): the mask converter _transposed (test_block_mask.py:"
    assert all(says in r.message.splitlines()[0] for r in failed), [r.message for r in failed]


@pytest.mark.slow  # the slow tier: the torch oracle, ~8 s
def test_a_block_converter_of_the_wrong_values_is_red_by_the_oracle():
    """A boolean mask added to the scores (True = 1 added) has a shape a mask can have: the
    class's gradients stay consistent with its forward, the forward is not the masked block's.
    The oracle is what turns it red (finite differences alone cannot)."""
    report = check_implementation(_converted(_boolean), ids=[
        "fd[block_preln_mask]", "oracle.forward[block_preln_mask-f64]",
        "oracle.forward[block_causal-f64]"])
    by_id = {r.id: r for r in report.results}
    assert by_id["fd[block_preln_mask]"].outcome == "passed"
    for i in ("oracle.forward[block_preln_mask-f64]", "oracle.forward[block_causal-f64]"):
        assert by_id[i].outcome == "failed", report.summary()
        assert NAMED.search(by_id[i].message.splitlines()[0]), by_id[i].message


def test_the_block_adapter_is_a_few_lines():
    from tests import ROOT
    from tests.suite.test_adapters import _adapter_lines

    assert _adapter_lines(ROOT / "tests" / "examples" / "realstyle_block_mask.py") <= 15


@pytest.mark.slow  # the slow tier: the block's FD, oracle and invariant families, ~10 s each
@pytest.mark.parametrize("bugs", [(), ("residual",), ("mask",)])
def test_the_class_block_is_judged_in_every_row_it_declares(bugs, monkeypatch):
    """Correct: every declared FD, oracle (float64 and float32) and invariant family passes,
    everything else is n/a saying it is another form.  A bug: FAIL, each red naming the
    tensor, the index and both values."""
    ex = _example(bugs, monkeypatch)
    report = check_implementation(ex, ops=["block"], kinds=["fd", "oracle", "invariant"])
    outcome = {r.id: r.outcome for r in report.results}
    judged = [f"fd[{f}]" for f in DECLARED] + [
        f"oracle.{w}[{f}-{d}]" for w in ("forward", "backward") for f in DECLARED
        for d in ("f64", "f32")]
    if not bugs:
        assert report.verdicts()["block"] == "ok", report.summary()
        assert all(outcome[i] == "passed" for i in judged), {i: outcome[i] for i in judged}
        na = [r for r in report.results if r.outcome == "n/a"]
        assert na and all("does not claim" in r.message for r in na), [
            r.message for r in na if "does not claim" not in r.message]
        return
    assert report.verdicts()["block"] == "FAIL", report.summary()
    assert outcome["fd[block_causal_mask]"] == "failed"
    assert outcome["oracle.backward[block_causal_mask-f64]"] == "failed"
    assert outcome["oracle.forward[block_causal_mask-f64]"] == "passed"  # a backward bug
    assert all(NAMED.search(r.message) for r in report.failures() if r.id.startswith(
        ("fd[", "oracle."))), [r.message[:300] for r in report.failures()]


@pytest.mark.parametrize("converter, verdict", [
    # the slow tier: its own converter is also judged in every row by the test above
    pytest.param(None, "ok", id="own-converter", marks=pytest.mark.slow),
    pytest.param(_boolean, "FAIL", id="boolean-converter")])
def test_without_the_oracle_a_block_that_ignores_its_masks_is_red(converter, verdict,
                                                                  monkeypatch):
    """The boolean mask added to the scores (+1 where attended, +0 where masked) leaves the
    block neither causal nor blind to padded keys, consistently in its forward and backward:
    finite differences pass.  Without the oracle (--oracle off) the block's padding and
    causality invariants of every declared form are what turn it red -- it was "ok" before
    they ran on forms other than the post-LN one."""
    ex = _example((), monkeypatch) if converter is None else _converted(converter)
    ids = {"invariant[block_preln_mask.padding_ignored]",
           "invariant[block_causal_mask.padding_ignored]",
           "invariant[block_causal.causal]", "invariant[block_causal_mask.causal]"}
    fd = {"fd[block_preln_mask]", "fd[block_causal]"}
    report = check_implementation(ex, ids=sorted(ids | fd), quick=True)
    assert report.verdicts()["block"] == verdict, report.summary()
    outcome = {r.id: r.outcome for r in report.results}
    assert {outcome[i] for i in fd} == {"passed"}, outcome
    assert {outcome[i] for i in ids} == {"passed" if converter is None else "failed"}, outcome
