"""The guard table (spec/protocol/guards.py) is generic per row: every row of the op table with a
log, a division or a square root has its guards or its reason for none; a guard declared once is
judged on every row it names against the same guarded formula (the oracle's shift and
allowance, the SymPy <-> code checks, the invariants, the optimizer oracle), and the same code
with the guard undeclared is red, on exactly the rows the guard changes."""

from __future__ import annotations

import re

import numpy as np
import pytest

from minibert_spec.protocol import OPS
from minibert_spec.protocol.guards import GUARDS, UNGUARDED, adjustment, softmax_adjustment
from minibert_spec.protocol.table import NOTHING_TO_GUARD as NOTHING
from minibert_spec.suite import check_implementation
from tests.examples import guarded_rows

# the rows that take no log, divide by nothing computed and take no root (each row says so, so
# that a new row must be put somewhere)
NOTHING_TO_GUARD = {name for name, op in OPS.items() if op.unguarded == NOTHING}
ROWS = ["softmax", "cross_entropy", "next_token_cross_entropy", "linear_cross_entropy",
        "adam"]


def test_every_row_has_its_guards_or_a_reason_for_none():
    guarded = {row for g in GUARDS.values() for row in g.rows}
    assert guarded <= set(OPS) and set(UNGUARDED) <= set(OPS)
    assert not guarded & set(UNGUARDED) and not NOTHING_TO_GUARD & (guarded | set(UNGUARDED))
    assert guarded | set(UNGUARDED) | NOTHING_TO_GUARD == set(OPS), (
        sorted(set(OPS) - guarded - set(UNGUARDED) - NOTHING_TO_GUARD))
    # the rows that need none are the rows without a log, a division or a root of their own
    # (their forward's names: nothing guarded can hide in one of these)
    assert {"linear", "relu", "embedding", "rope", "ffn"} <= NOTHING_TO_GUARD
    assert all(g.at in ("log", "division", "square root") for g in GUARDS.values())


@pytest.mark.slow  # the slow tier: >= 4.5 s of the default run (issue 40)
def test_a_declared_guard_is_judged_against_its_guarded_formula_on_every_row():
    report = check_implementation(guarded_rows, ops=ROWS, kinds=["oracle", "invariant"],
                                  quick=True)
    assert {op: v for op, v in report.verdicts().items() if op in ROWS} == dict.fromkeys(
        ROWS, "ok"), report.summary()
    report = check_implementation(guarded_rows, ops=ROWS[:4], kinds=["sympy"])
    assert not report.failures(), report.summary()


def test_the_same_code_undeclared_is_red_on_exactly_the_rows_its_guards_change(monkeypatch):
    monkeypatch.setattr(guarded_rows, "CAPABILITIES", {})
    report = check_implementation(guarded_rows, ops=ROWS, kinds=["oracle", "invariant"],
                                  quick=True)
    assert {op: v for op, v in report.verdicts().items() if op in ROWS} == dict.fromkeys(
        ROWS, "FAIL"), report.summary()
    # one guard undeclared at a time: only its rows go red
    for name in ("softmax_eps", "adam_sqrt_eps"):
        monkeypatch.setattr(guarded_rows, "CAPABILITIES", {"guards": {
            k: v for k, v in _declared().items() if k != name}})
        report = check_implementation(guarded_rows, ops=ROWS, kinds=["oracle", "invariant"],
                                      quick=True)
        red = {op for op, v in report.verdicts().items() if v == "FAIL"}
        assert red == set(GUARDS[name].rows), (name, red)


def _declared():
    return {"softmax_eps": guarded_rows.SOFTMAX_EPS, "mean_eps": guarded_rows.MEAN_EPS,
            "log_eps": guarded_rows.LOG_EPS, "adam_sqrt_eps": guarded_rows.ADAM_SQRT_EPS}


def test_guards_that_guard_the_same_log_are_refused_together():
    from minibert_spec.protocol import capabilities

    class Both:
        CAPABILITIES = {"guards": {"log_eps": 1e-12, "prob_clip": 1e-12}}

    from minibert_spec.protocol.guards import CROSS_ENTROPY_GUARDS

    with pytest.raises(ValueError, match=re.escape(str(list(CROSS_ENTROPY_GUARDS))) + ".*together"):
        capabilities(Both())


def test_the_softmax_guard_allowance_covers_both_forms_and_the_shift_is_exact():
    """The guarded softmax's shift is e / (s + eps) - e / s exactly; its allowance covers the
    held-maximum derivative and the exact one (which moves the maximum's entry), and not a
    gradient off by more."""
    rng = np.random.default_rng(0)
    x, dy, eps = rng.standard_normal((3, 5)), rng.standard_normal((3, 5)), 1e-3
    e = np.exp(x - x.max(-1, keepdims=True))
    s = e.sum(-1, keepdims=True)
    shift, allow, _ = softmax_adjustment({"softmax_eps": eps}, x, None, dy)
    np.testing.assert_allclose(shift, e / (s + eps) - e / s, rtol=1e-12, atol=0)
    p, p_g = e / s, e / (s + eps)
    plain = p * (dy - (dy * p).sum(-1, keepdims=True))
    held = p_g * (dy - (dy * p_g).sum(-1, keepdims=True))
    assert np.all(np.abs(held - plain) <= allow) and np.all(allow < 1e-2)

    def f(v):
        ee = np.exp(v - v.max(-1, keepdims=True))
        return np.sum(dy * ee / (ee.sum(-1, keepdims=True) + eps))

    exact = np.zeros_like(x)  # central differences of the guarded forward itself
    for i in np.ndindex(x.shape):
        step = np.zeros_like(x)
        step[i] = 1e-6
        exact[i] = (f(x + step) - f(x - step)) / 2e-6
    assert np.all(np.abs(exact - plain) <= allow + 1e-8)
    assert np.max(allow) < 3 * np.max(np.abs(held - plain)) + 3 * eps  # no wider than the forms


def test_no_adjustment_without_a_guard_of_the_row():
    x = np.ones((2, 3))
    assert adjustment("softmax", {}, {"x": x}, {}, x) is None
    assert adjustment("softmax", {"log_eps": 1e-12}, {"x": x}, {}, x) is None
    assert adjustment("rope", {"softmax_eps": 1e-12}, {"x": x}, {}, x) is None


def test_an_undeclared_guard_is_red_naming_the_guard_and_the_value_it_implies(monkeypatch):
    monkeypatch.setattr(guarded_rows, "CAPABILITIES", {})
    report = check_implementation(guarded_rows, ops=["softmax", "cross_entropy", "adam"],
                                  kinds=["invariant"], quick=True)
    text = {r.id: r.message for r in report.failures()}
    for check_id, name, value in [("invariant[softmax.rows_sum_to_one]", "softmax_eps",
                                   guarded_rows.SOFTMAX_EPS),
                                  ("invariant[cross_entropy.sum_is_n_times_mean]", "mean_eps",
                                   guarded_rows.MEAN_EPS),
                                  ("invariant[adam.first_step]", "adam_sqrt_eps",
                                   guarded_rows.ADAM_SQRT_EPS)]:
        assert f"CAPABILITIES['guards'] = {{{name!r}: {value:.2g}}}" in text[check_id], (
            check_id, text.get(check_id))
