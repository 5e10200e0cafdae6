"""Every op's backward against central finite differences in float64, on Hypothesis inputs.

The scalar checked is sum(out * dout) with a random upstream gradient dout (never all ones), so
the gradient of each differentiable input is exactly what the backward returns for dout.  Every
output of every backward is compared (``spec.numerics.fdcheck``): element by element on tiny
tensors, along random directions otherwise, with the tolerances of ``spec.tolerances``.
"""

from __future__ import annotations

import numpy as np
from hypothesis import assume
from hypothesis import strategies as st

from spec.numerics import identities as inv
from spec.numerics.fdcheck import check_op, objective
from spec.numerics.finite_differences import elementwise_check
from spec.numerics.identities import require
from spec.protocol import capabilities
from spec.suite import strategies as S
from spec.suite.registry import check
from spec.tolerances import FD_FLOOR, FD_RTOL

FAMILIES = {f.name: f for f in S.families()}


def family_cases(fd_only: bool = False):
    """One case per registered case family: (name, {"family": family}); ``fd_only``: the
    families whose backward is the gradient of their forward."""
    return [(name, {"family": f}) for name, f in FAMILIES.items() if f.fd or not fd_only]


def family_needs(kw) -> dict:
    """What a family's check needs the implementation to declare (decided before drawing)."""
    return dict(kw["family"].needs)


def draw_case(impl, family, data):
    """One case of the family, with the variant parameters the implementation declares."""
    case = data.draw(family.strategy_for(capabilities(impl)), label="case")
    if family.smooth is not None:
        assume(family.smooth(impl, case))
    return case


@check("fd", "", cases=family_cases(fd_only=True), equations=lambda kw: kw["family"].equations,
       ops=lambda kw: (kw["family"].op,), given={"data": st.data()}, needs=family_needs)
def backward_matches_finite_differences(impl, family, data):
    """Every gradient the backward returns equals central differences of sum(out * dout)."""
    check_op(impl, family, draw_case(impl, family, data))


@check("fd", "attention.key_bias_exactly_zero", cases=[("nomask", {"masked": False}),
                                                        ("mask", {"masked": True})],
       equations=("attention.backward.dK", "attention.qkv"), given={"data": st.data()},
       needs=lambda kw: dict(FAMILIES["attention_bias" + ("_mask" if kw["masked"] else "")]
                             .needs))
def key_bias_gradient_is_exactly_zero(impl, masked, data):
    """Softmax is invariant to adding a constant to a row of scores, and b_k adds q_i . b_k to
    every score of row i: dL/db_k = 0 exactly (spec.numerics.identities, relative to the other
    gradients of the call), on cases where the key path does carry gradient (dW_k is not ~0).
    The FD check alone judges db_k in absolute terms (FD_RTOL * FD_FLOOR): it is shown to reject a
    key-bias gradient just above that bound."""
    family = FAMILIES["attention_bias" + ("_mask" if masked else "")]
    case = data.draw(family.cases(), label="case")
    grads = check_op(impl, family, case)
    # meaningful: some query attends >= 2 keys and the key projection gets a real gradient
    assume(np.abs(grads["W_k"]).max() > FD_FLOOR)
    require(inv.attention_ignores_key_bias(impl, case.inputs, case.fixed["n_heads"],
                                           case.fixed["mask"], case.inputs["b_k"], case.dout))
    bound = FD_RTOL * FD_FLOOR
    forward, _ = family.bind(impl)

    def f(v):
        return objective(forward, {**case.inputs, "b_k": v}, case.fixed, case.dout)

    wrong = grads["b_k"] + 2 * bound * np.sign(np.random.default_rng(case.seed)
                                               .standard_normal(grads["b_k"].shape))
    assert not elementwise_check(f, case.inputs["b_k"], wrong).passed, (
        "the absolute check cannot tell a zero key-bias gradient from a wrong one")


@check("fd", "position_embedding.unused_rows_zero", equations=("position.learned.backward",),
       given={"case": S.position_embedding_cases()})
def position_embedding_unused_rows_get_zero(impl, case):
    """Positions >= T never enter the forward: their rows of dW_pos are exactly 0."""
    require(inv.position_embedding_identities(impl, case.inputs["x"], case.inputs["W_pos"],
                                              case.dout))


@check("fd", "pooler.gradient_only_at_cls", equations=("pooler.forward",),
       given={"case": S.pooler_cases()})
def pooler_gradient_only_reaches_cls(impl, case):
    """Only h[:, 0] enters the pooler: dh is exactly 0 at every other position."""
    require(inv.pooler_gradient_only_at_cls(impl, *case.inputs.values(), case.dout))
