"""Every op's backward against central finite differences in float64, on Hypothesis inputs.

The scalar checked is sum(out * dout) with a random upstream gradient dout (never all ones), so
the gradient of each differentiable input is exactly what the backward returns for dout.  Every
output of every backward is compared (``minibert_spec.numerics.fdcheck``): element by element on
tiny tensors, along random directions otherwise, with the tolerances of
``minibert_spec.tolerances``.  Each case family's fixed-seed cases run first (and alone in the quick
run).
"""

from __future__ import annotations

import numpy as np
from hypothesis import assume

from minibert_spec.numerics import identities as inv
from minibert_spec.numerics.fdcheck import check_op, either_guarded_form, objective
from minibert_spec.numerics.finite_differences import assert_all_passed, elementwise_check
from minibert_spec.numerics.identities import require
from minibert_spec.suite import strategies as S
from minibert_spec.suite.registry import check
from minibert_spec.tolerances import FD_FLOOR, FD_RTOL

FAMILIES = {f.name: f for f in S.families()}


def family_cases(fd_only: bool = False, property: str = ""):  # noqa: A002 (the id's part)
    """One case per registered case family: (``family[.property]``, {"family": family});
    ``fd_only``: the families whose backward is the gradient of their forward."""
    return [(f"{name}.{property}" if property else name, {"family": f})
            for name, f in FAMILIES.items() if f.fd or not fd_only]


def on_families(kind: str, property: str = "", *, fd_only: bool = False,  # noqa: A002
                **kw):
    """``@check(kind, ...)`` over every case family (``kind[family]`` or
    ``kind[family.property]``), drawing its cases (``case``) from the family's strategy in the
    variant the implementation declares, its fixed-seed cases first; what the family needs is
    decided before anything is drawn."""
    return check(kind, "", cases=family_cases(fd_only, property),
                 equations=lambda c: c["family"].equations, ops=lambda c: (c["family"].op,),
                 given=lambda c: c["family"].given, examples=lambda c: c["family"].explicit,
                 needs=lambda c: dict(c["family"].needs), **kw)


def on_family(name: str, property: str, *, equations=None,  # noqa: A002 (the id's part)
              given=None, example=None, needs=None, by_family: bool = False, **kw):
    """``@check("invariant", "<op>.<property>")`` on one case family's cases (``case``), its
    fixed-seed cases first: ``given`` adds strategies, ``example`` their values in the
    fixed-seed runs (a dict, or a list of them: each with every fixed-seed case); ``needs``
    (default: the family's); ``by_family``: the id's subject is the family
    (``<family>.<property>``, the rule of drawn checks), not the op."""
    family = FAMILIES[name]
    extras = example if isinstance(example, list) else [example or {}]

    def strategies(caps):
        return {**family.given(caps), **(given or {})}

    def examples(caps):
        return [{**e, **x} for e in family.explicit(caps) for x in extras]

    subject = family.name if by_family else family.op
    return check(kw.pop("kind", "invariant"), f"{subject}.{property}",
                 equations=family.equations if equations is None else equations,
                 ops=(family.op,), given=lambda _: strategies, examples=lambda _: examples,
                 needs=dict(family.needs) if needs is None else needs, **kw)


@on_families("fd", fd_only=True)
def backward_matches_finite_differences(impl, family, case):
    """Every gradient the backward returns equals central differences of sum(out * dout)."""
    check_op(impl, family, case)


@check("fd", "attention.key_bias_exactly_zero", cases=[("nomask", {"masked": False}),
                                                        ("mask", {"masked": True})],
       equations=("attention.backward.dK", "attention.qkv"),
       given=lambda kw: FAMILIES["attention_bias" + ("_mask" if kw["masked"] else "")].given,
       examples=lambda kw: FAMILIES["attention_bias" + ("_mask" if kw["masked"] else "")]
       .explicit,
       needs=lambda kw: dict(FAMILIES["attention_bias" + ("_mask" if kw["masked"] else "")]
                             .needs))
def key_bias_gradient_is_exactly_zero(impl, masked, case):
    """Softmax is invariant to adding a constant to a row of scores, and b_k adds q_i . b_k to
    every score of row i: dL/db_k = 0 exactly (minibert_spec.numerics.identities, relative to the
    other gradients of the call), on cases where the key path does carry gradient (dW_k is not ~0).
    The FD check alone judges db_k in absolute terms (FD_RTOL * FD_FLOOR): it is shown to reject a
    key-bias gradient just above that bound."""
    family = FAMILIES["attention_bias" + ("_mask" if masked else "")]
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


_COMPOSED = {r: FAMILIES[f"cross_entropy_probs_dlogits_{r}"] for r in ("mean", "sum")}


@check("fd", "cross_entropy.probs_dlogits_composed", cases=[(r, {"reduction": r})
                                                             for r in _COMPOSED],
       equations=("loss.ce.probs_dlogits",), given=lambda kw: _COMPOSED[kw["reduction"]].given,
       examples=lambda kw: _COMPOSED[kw["reduction"]].explicit,
       needs=lambda kw: dict(_COMPOSED[kw["reduction"]].needs))
def composed_loss_gradient_matches_finite_differences(impl, reduction, case):
    """The composed form takes p and returns dL/dlogits: the gradient, w.r.t. z, of
    CE(softmax(z)) at z = log p (softmax(log p) = p; the protocol's softmax, minibert_reference.ops,
    the
    one definition), against central differences over z."""
    from minibert_reference.ops import _softmax_forward

    forward, backward = _COMPOSED[reduction].bind(impl)
    p = case.inputs["logits"]
    _, cache = forward(logits=p, **case.fixed)
    (dz,) = backward(case.dout, cache)

    def f(z):
        return objective(forward, {"logits": _softmax_forward(z)[0]}, case.fixed, case.dout)

    # a declared loss guard: the plain log's gradient is allowed too, over z = log p
    assert_all_passed(either_guarded_form(
        lambda gs: [elementwise_check(f, np.log(p), gs["logits"],
                                      op="cross_entropy[probabilities_dlogits]",
                                      tensor="logits")],
        {"logits": np.asarray(dz)}, impl, "cross_entropy", {"logits": np.log(p)},
        {**case.fixed, "input": "logits"}, case.dout))


@on_family("position_embedding", "unused_rows_zero", kind="fd",
           equations=("position.learned.backward",))
def position_embedding_unused_rows_get_zero(impl, case):
    """Positions >= T never enter the forward: their rows of dW_pos are exactly 0; dx = dout
    and dW_pos[:T] sums dout over the batch."""
    require(inv.position_embedding_identities(impl, case.inputs["x"], case.inputs["W_pos"],
                                              case.dout))


@on_family("pooler", "gradient_only_at_cls", kind="fd", equations=("pooler.forward",))
def pooler_gradient_only_reaches_cls(impl, case):
    """Only h[:, 0] enters the pooler: dh is exactly 0 at every other position."""
    require(inv.pooler_gradient_only_at_cls(impl, *case.inputs.values(), case.dout))
