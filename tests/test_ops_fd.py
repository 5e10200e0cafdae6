"""Every op's backward against central finite differences in float64, on Hypothesis inputs.

The scalar checked is sum(out * dout) with a random upstream gradient dout (never all ones), so
the gradient of each differentiable input is exactly what the backward returns for dout.  Every
output of every backward is compared (``tests/fdcheck.py``): element by element on tiny tensors,
along random directions otherwise, with the tolerances of ``spec.tolerances``.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from spec import invariants as I
from spec.gradcheck import elementwise_check
from spec.invariants import require
from spec.tolerances import FD_FLOOR, FD_RTOL
from tests import strategies as S
from tests.fdcheck import OP_SPECS, fd_check, objective, op_params, ops_without_cases


@pytest.mark.parametrize("op", op_params())
@given(data=st.data())
def test_backward_matches_finite_differences(impl, op, data):
    case = data.draw(op.cases(), label="case")
    if op.smooth is not None:
        assume(op.smooth(impl, case))
    fd_check(impl, op, case)


def test_every_op_pair_has_case_families():
    """An op pair of spec.protocol.OPS without a ``@cases`` strategy in tests/strategies.py
    would have no FD or invariant test at all: forgetting the strategies fails here."""
    assert ops_without_cases() == [], "register case families with @cases in tests/strategies.py"


def _attention_op(name):
    return next(op for op in OP_SPECS if op.name == name)


@pytest.mark.equation("attention.backward.dK", "attention.qkv")
@pytest.mark.parametrize("masked", [False, True], ids=["nomask", "mask"])
@given(data=st.data())
def test_key_bias_gradient_is_exactly_zero(impl, masked, data):
    """Softmax is invariant to adding a constant to a row of scores, and b_k adds q_i . b_k to
    every score of row i: dL/db_k = 0 exactly (spec.invariants, relative to the other gradients
    of the call), on cases where the key path does carry gradient (dW_k is not ~0).  The FD
    check alone judges db_k in absolute terms (FD_RTOL * FD_FLOOR): it is shown to reject a
    key-bias gradient just above that bound."""
    op = _attention_op("attention_bias" + ("_mask" if masked else ""))
    case = data.draw(op.cases(), label="case")
    grads = fd_check(impl, op, case)
    # meaningful: some query attends >= 2 keys and the key projection gets a real gradient
    assume(np.abs(grads["W_k"]).max() > FD_FLOOR)
    require(I.attention_ignores_key_bias(impl, case.inputs, case.fixed["n_heads"],
                                         case.fixed["mask"], case.inputs["b_k"], case.dout))
    bound = FD_RTOL * FD_FLOOR
    forward, _ = op.bind(impl)

    def f(v):
        return objective(forward, {**case.inputs, "b_k": v}, case.fixed, case.dout)

    wrong = grads["b_k"] + 2 * bound * np.sign(np.random.default_rng(case.seed)
                                               .standard_normal(grads["b_k"].shape))
    assert not elementwise_check(f, case.inputs["b_k"], wrong).passed, (
        "the absolute check cannot tell a zero key-bias gradient from a wrong one")


@pytest.mark.equation("position.learned.backward")
@given(case=S.position_embedding_cases())
def test_position_embedding_unused_rows_get_zero(impl, case):
    """Positions >= T never enter the forward: their rows of dW_pos are exactly 0."""
    require(I.position_embedding_identities(impl, case.inputs["x"], case.inputs["W_pos"],
                                            case.dout))


@pytest.mark.equation("pooler.forward")
@given(case=S.pooler_cases())
def test_pooler_gradient_only_reaches_cls(impl, case):
    """Only h[:, 0] enters the pooler: dh is exactly 0 at every other position."""
    require(I.pooler_gradient_only_at_cls(impl, *case.inputs.values(), case.dout))
