"""RMSNorm in the forms real code has (issue 39): without a gain and with its eps fixed in the
code (microgpt's ``x / sqrt(mean(x^2) + 1e-5)``, tests/examples/realstyle_microgpt_norm.py),
declared ``CAPABILITIES = {"rmsnorm": {"gain": False, "eps": 1e-5}}``.  Correct, it is green in
every column that can take it: FD, invariants and both oracle columns (torch's ``rms_norm``
without a weight) judge the form; the SymPy rows, on the protocol's form, are not applicable
naming the declaration.  A planted backward bug is red naming tensor, index and both values."""

from __future__ import annotations

import re

import numpy as np
import pytest

from minibert_spec.protocol import ImplProxy, NotApplicable, capabilities
from minibert_spec.protocol.capabilities import DeclarationError
from tests.examples import realstyle_microgpt_norm as microgpt
from tests.unshrunk import check_implementation

FAST = ["fd", "invariant"]  # no torch, no SymPy: the default run
SLOW = ["sympy", "oracle.forward", "oracle.backward"]


def test_the_gainless_fixed_eps_pair_is_green_and_judged_in_its_form():
    report = check_implementation(microgpt.correct, ops=["rmsnorm"], kinds=FAST)
    outcome = {r.id: r.outcome for r in report.results}
    assert report.verdict(report.grid()["rmsnorm"]) == "ok", report.summary()
    assert outcome["fd[rmsnorm_nogain]"] == "passed", outcome
    assert outcome["invariant[rmsnorm.nogain_scale_invariant]"] == "passed", outcome


def test_a_planted_backward_bug_is_red_naming_tensor_index_and_both_values():
    report = check_implementation(microgpt.buggy, ops=["rmsnorm"], kinds=FAST)
    by_id = {r.id: r for r in report.results}
    assert report.verdict(report.grid()["rmsnorm"]) == "FAIL"
    fd = by_id["fd[rmsnorm_nogain]"]
    assert fd.outcome == "failed", fd.message
    assert re.search(r"d/dx .* at index \(\d+(, \d+)*\): analytic -?\d.*finite difference -?\d",
                     fd.message), fd.message


@pytest.mark.slow  # torch's import and twins, SymPy's proofs: >= 5 s (issue 40)
def test_torch_judges_the_form_green_when_right_red_with_the_bug():
    ok = check_implementation(microgpt.correct, ops=["rmsnorm"], kinds=SLOW)
    outcome = {r.id: r.outcome for r in ok.results}
    assert ok.verdict(ok.grid()["rmsnorm"]) == "ok", ok.summary()
    for r in ok.results:
        if r.id.startswith("sympy["):  # the protocol's form: gamma passed
            assert r.outcome == "n/a" and "rmsnorm with a gain gamma" in r.message, r.message
    for i in ("oracle.forward[rmsnorm_nogain-f64]", "oracle.backward[rmsnorm_nogain-f64]",
              "oracle.forward[rmsnorm_nogain-f32]", "oracle.backward[rmsnorm_nogain-f32]"):
        assert outcome[i] == "passed", outcome
    bad = check_implementation(microgpt.buggy, ops=["rmsnorm"], kinds=["oracle.backward"])
    oracle = {r.id: r for r in bad.results}["oracle.backward[rmsnorm_nogain-f64]"]
    assert oracle.outcome == "failed", oracle.message
    assert re.search(r"dx .*index \(\d+(, \d+)*\): ours -?\d.*torch -?\d", oracle.message)


def test_a_call_at_another_eps_or_with_a_gain_is_not_applicable():
    proxy = ImplProxy(microgpt.correct, "microgpt")
    x = np.random.default_rng(0).standard_normal((2, 4))
    with pytest.raises(NotApplicable, match="eps fixed at 1e-05 by the declaration"):
        proxy.rmsnorm_forward(x, None, 1e-6)
    with pytest.raises(NotApplicable, match="rmsnorm with a gain gamma"):
        proxy.rmsnorm_forward(x, np.ones(4), 1e-5)
    y, _ = proxy.rmsnorm_forward(x, None, 1e-5)
    np.testing.assert_allclose(y, x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-5))


@pytest.mark.parametrize("eps", [0, 1, -1e-5, float("nan")])
def test_a_declared_eps_that_is_no_positive_float_is_refused_in_one_line(eps):
    bad = type("M", (), {"CAPABILITIES": {"rmsnorm": {"gain": False, "eps": eps}}})
    with pytest.raises(DeclarationError) as e:
        capabilities(bad)
    said = str(e.value)
    assert said.startswith("CAPABILITIES['rmsnorm']['eps']: expected") and "\n" not in said, said
    assert "positive finite float" in said and said.endswith(f"got {eps}"), said


def test_the_reference_without_a_gain_is_its_rmsnorm_with_gamma_one():
    from minibert_reference import ops

    rng = np.random.default_rng(1)
    x, dy = rng.standard_normal((2, 3, 5)), rng.standard_normal((2, 3, 5))
    y, cache = ops.rmsnorm_forward(x, None, 1e-5)
    y1, cache1 = ops.rmsnorm_forward(x, np.ones(5), 1e-5)
    np.testing.assert_array_equal(y, y1)
    dx, dgamma = ops.rmsnorm_backward(dy, cache)
    np.testing.assert_array_equal(dx, ops.rmsnorm_backward(dy, cache1)[0])
    assert dgamma is None


def test_a_wrong_eps_declaration_is_red_in_the_scale_identities():
    misdeclared = microgpt.build()
    misdeclared.CAPABILITIES = {"rmsnorm": {"gain": False, "eps": 1e-6}}  # the code: 1e-5
    report = check_implementation(misdeclared, ops=["rmsnorm"], kinds=["invariant"])
    red = {r.id: r for r in report.results}["invariant[rmsnorm.nogain_scale_invariant]"]
    assert red.outcome == "failed" and "invariant to c x per row" in red.message, red.message
