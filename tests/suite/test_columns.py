"""Every column of the verdict runs what it says (issue 24): an implementation broken only in one
column's sense gets a red cell in that column and a non-zero exit, and the column that was not
asked for says why it is n/a.  The implementations are the reference's linear op with one thing
changed."""

from __future__ import annotations

import numpy as np
import pytest

import minibert_reference
from minibert_spec.cli import main as minibert
from tests.unshrunk import check_implementation


def _linear(forward=None, backward=None):
    """The reference's linear pair with ``forward``/``backward`` replaced."""
    return type("Impl", (), {"linear_forward":
                             staticmethod(forward or minibert_reference.linear_forward),
                             "linear_backward": staticmethod(backward or
                                                             minibert_reference.linear_backward)})()


def _unvalidated_forward(x, W, b=None):
    """Right values, no validation at all (a NaN, a wrong shape or a float32 W go through)."""
    x, W = np.asarray(x), np.asarray(W)
    y = x @ W + (0 if b is None else b)
    return y, (x, W, b is not None)


def _unvalidated_backward(dy, cache):
    x, W, has_b = cache
    n = x.shape[-1]
    dW = x.reshape(-1, n).T @ dy.reshape(-1, W.shape[1])
    return dy @ W.T, dW, (dy.reshape(-1, W.shape[1]).sum(0) if has_b else None)


def _scaled_forward(x, W, b=None):
    """A forward 1 + 1e-6 too large, its backward consistent with it: finite differences agree
    with the backward, torch and SymPy do not."""
    y, cache = minibert_reference.linear_forward(x, W, b)
    return y * (1 + 1e-6), cache


def _scaled_backward(dy, cache):
    return tuple(None if g is None else g * (1 + 1e-6)
                 for g in minibert_reference.linear_backward(dy, cache))


def _db_wrong_backward(dy, cache):
    """dW and dx right, db summed over the wrong axis: FD, torch and SymPy all see it."""
    dx, dW, db = minibert_reference.linear_backward(dy, cache)
    return dx, dW, None if db is None else db * 0.5


def _mutating_forward(x, W, b=None):
    """Right values, but the caller's x is rounded in place: only the invariants see it."""
    out, cache = minibert_reference.linear_forward(x, W, b)
    x[...] = np.round(x, 3)
    return out, cache


CASES = {
    # column: (implementation, kinds to run)
    "bad_input": (_linear(_unvalidated_forward, _unvalidated_backward), ["bad_input"]),
    "forward": (_linear(_scaled_forward, _scaled_backward), ["oracle"]),
    "oracle_backward": (_linear(backward=_db_wrong_backward), ["oracle"]),
    "fd": (_linear(backward=_db_wrong_backward), ["fd"]),
    "sympy": (_linear(_scaled_forward, _scaled_backward), ["sympy"]),
    "invariants": (_linear(_mutating_forward), ["invariant"]),
}


@pytest.mark.parametrize("column", list(CASES))
def test_a_bug_in_one_columns_sense_turns_that_column_red(column):
    if column in ("forward", "oracle_backward"):
        pytest.importorskip("torch")
    impl, kinds = CASES[column]
    report = check_implementation(impl, ops=["linear"], kinds=kinds, bad_input=True)
    cells = report.grid()["linear"]
    assert cells[column].status == "FAIL", (column, cells[column])
    assert report.exit_code() == 1


def test_the_unbroken_columns_stay_green():
    """The scaled forward is consistent with its backward: FD is green, only the oracle and
    SymPy see it (so a red FD cell there would be a false verdict)."""
    report = check_implementation(_linear(_scaled_forward, _scaled_backward), ops=["linear"],
                                  kinds=["fd"])
    assert report.grid()["linear"]["fd"].status == "ok"
    report = check_implementation(_linear(_unvalidated_forward, _unvalidated_backward),
                                  ops=["linear"], kinds=["fd", "sympy"])
    cells = report.grid()["linear"]
    assert cells["fd"].status == cells["sympy"].status == "ok"


@pytest.mark.slow  # the slow tier: >= 5 s of the default run (issue 40)
def test_bad_input_column_runs_with_the_flag_and_says_so_without(capsys):
    """`minibert check --bad-input` used to run no bad-input test at all (n/a for every op):
    a linear without validation read "1 op(s) conform", exit 0."""
    args = ["check", "tests.suite.test_columns:UNVALIDATED", "--ops", "linear", "--oracle", "off",
            "-k", r"^(bad_input|fd)\["]
    assert minibert([*args, "--bad-input"]) == 1
    out = " ".join(capsys.readouterr().out.split())
    assert "FAIL bad_input[linear.x_nan] (linear)" in out and "1 op(s) fail: linear" in out
    assert minibert(args) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "bad input: not run (--bad-input)" in out


UNVALIDATED = CASES["bad_input"][0]


def test_a_bad_input_case_of_an_undeclared_form_is_na_not_red():
    """A bad input of a form the implementation does not declare (a bias to a bias-free class,
    a probability input to a loss on logits) is n/a with the reason: the proxy's NotApplicable
    inside the case was a red ("expected ValueError, got NotApplicable") before (issue 41)."""
    from tests.examples import backprop_numpy, realstyle_tutorial

    for impl, ids in ((realstyle_tutorial, ["bad_input[attention.b_q_shape]",
                                            "bad_input[attention.b_o_without_W_o]"]),
                      (backprop_numpy, ["bad_input[cross_entropy.probabilities_zero]"])):
        report = check_implementation(impl, ids=ids, bad_input=True)
        assert {r.id: r.outcome for r in report.results} == dict.fromkeys(ids, "n/a"), [
            (r.id, r.outcome, r.message[:200]) for r in report.results]
        assert all("not applicable" in r.message for r in report.results)
