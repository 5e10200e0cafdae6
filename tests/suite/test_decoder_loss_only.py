"""The decoder row's optional loss-only function (issue 40): the finite differences of the
next-token loss call ``decoder_loss`` where an implementation provides it (the backward of
``decoder_loss_and_grads`` was computed and thrown away ~130 times a check), and trust it only as
the same function as ``decoder_loss_and_grads``' loss: one that gives another value is red,
naming both; an implementation without it is judged through ``decoder_loss_and_grads`` as
before."""

from __future__ import annotations

import types
from collections import Counter

import minibert_reference as ref
from minibert_spec.suite.checks.decoder import LOSS_ONLY
from tests.unshrunk import check_implementation

CHECK = "fd[decoder.loss-gpt2-B2-T6]"


def reference_like(**replaced):
    """The reference under another name, its two loss functions counting their calls, the
    names in ``replaced`` replaced (None: removed)."""
    calls = Counter()
    impl = types.ModuleType("reference_like")
    impl.__dict__.update({k: v for k, v in vars(ref).items() if not k.startswith("__")})

    def counted(name, fn):
        def call(*args, **kwargs):
            calls[name] += 1
            return fn(*args, **kwargs)
        return call

    for name in (LOSS_ONLY, "decoder_loss_and_grads"):
        setattr(impl, name, counted(name, replaced.get(name, getattr(ref, name))))
    for name, fn in replaced.items():
        if fn is None:
            delattr(impl, name)
    return impl, calls


def one_check(impl):
    (result,) = check_implementation(impl, ids=[CHECK]).results
    return result


def test_the_loss_only_function_is_what_the_finite_differences_call():
    impl, calls = reference_like()
    result = one_check(impl)
    assert result.outcome == "passed", result.message
    # the gradients once, the loss-only function checked against the full one at a second point
    assert calls["decoder_loss_and_grads"] == 2 and calls[LOSS_ONLY] > 50, calls


def test_without_it_the_full_function_gives_the_loss():
    impl, calls = reference_like(**{LOSS_ONLY: None})
    result = one_check(impl)
    assert result.outcome == "passed", result.message
    assert LOSS_ONLY not in calls and calls["decoder_loss_and_grads"] > 50, calls


def test_a_loss_only_function_of_another_loss_is_red():
    """Off by 1e-9 relative (a constant factor: its finite differences would still agree with
    the gradients, within FD_RTOL, of a loss that is not the one they are the gradients of)."""
    impl, _ = reference_like(**{LOSS_ONLY: lambda *a, **k: ref.decoder_loss(*a, **k) * (1 + 1e-9)})
    result = one_check(impl)
    assert result.outcome == "failed", result.message
    assert f"{LOSS_ONLY} gives" in result.message and "at the check's parameters" in (
        result.message), result.message


def test_a_loss_only_function_agreeing_only_at_the_checks_parameters_is_red():
    """The same value at the check's parameters, another function elsewhere (a shifted
    loss whose shift vanishes there): red at the second point."""
    base = {}

    def shifted(params, *a, **k):
        value = ref.decoder_loss(params, *a, **k)
        first = base.setdefault("W", params["embeddings.token.W"].copy())
        return value + float(abs(params["embeddings.token.W"] - first).sum())

    impl, _ = reference_like(**{LOSS_ONLY: shifted})
    result = one_check(impl)
    assert result.outcome == "failed", result.message
    assert "at parameters moved by ~1e-2" in result.message, result.message


def test_a_wrong_gradient_is_still_red_with_a_loss_only_function():
    def wrong(*a, **k):
        value, grads = ref.decoder_loss_and_grads(*a, **k)
        return value, {**grads, "lm_head.W" if "lm_head.W" in grads else
                       "embeddings.token.W": 1.01 * grads.get("lm_head.W",
                                                              grads["embeddings.token.W"])}

    impl, calls = reference_like(decoder_loss_and_grads=wrong)
    result = one_check(impl)
    assert result.outcome == "failed" and calls[LOSS_ONLY] > 0, result.message
    assert "gradient check failed" in result.message, result.message
