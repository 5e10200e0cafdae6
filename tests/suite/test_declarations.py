"""Every declaration is validated before any check runs (minibert_spec.protocol.capabilities): a
``CAPABILITIES`` the protocol cannot take -- malformed, out of range, contradicting itself or
the code it declares, or raising when read -- is refused in one line naming the key, the value
and what is accepted, never judged with the defaults and never turned into an op red.

In-process and cheap: ``capabilities()`` alone, no check runs.  The four entry points on the
same hostile modules: tests/suite/test_entry_points_refuse.py."""

from __future__ import annotations

import sys
import types

import numpy as np
import pytest

import minibert_reference
from minibert_reference import ops
from minibert_spec.protocol.capabilities import capabilities


def _impl(declaration, **functions):
    """An implementation (a namespace of functions) declaring ``declaration``."""
    return types.SimpleNamespace(CAPABILITIES=declaration, **functions)


def refused(impl, *words) -> str:
    """The one-line refusal of ``impl``'s declaration, holding each of ``words``."""
    with pytest.raises(ValueError) as info:
        capabilities(impl)
    message = str(info.value)
    assert "\n" not in message, message
    assert message.startswith("CAPABILITIES"), message
    for w in words:
        assert w in message, (w, message)
    return message


# --------------------------------------------------------------------------- ranks
@pytest.mark.parametrize("ranks, value", [
    ((0,), "(0,)"), ((-2,), "(-2,)"), (3, "3"), ((10**6,), "(1000000,)"), ((True,), "(True,)"),
    ((2.0,), "(2.0,)"), ((), "()"), ("3", "'3'")])
def test_a_rank_that_is_not_a_small_positive_integer_is_refused(ranks, value):
    refused(_impl({"ranks": {"linear": ranks}}), "CAPABILITIES['ranks']['linear']",
            f"got {value}", "a tuple of integers in [1, 8]")


@pytest.mark.parametrize("ranks", [[("linear", (3,))], 3, (3,), "linear"])
def test_ranks_that_are_not_a_dict_of_ops_are_refused(ranks):
    refused(_impl({"ranks": ranks}), "CAPABILITIES['ranks']", f"got {ranks!r}",
            "a dict {op: tuple of ranks}")


def test_ranks_only_for_ops_that_can_be_rank_adapted():
    msg = refused(_impl({"ranks": {"attention": (3,)}}), "CAPABILITIES['ranks']",
                  "'attention'", "linear")
    assert "layernorm" in msg  # what is accepted: the rank-adaptable ops
    refused(_impl({"ranks": {"linaer": (3,)}}), "'linaer'")


def test_good_ranks_are_taken_sorted():
    caps = capabilities(_impl({"ranks": {"linear": [3, 2], "softmax": (4,)}}))
    assert caps["ranks"] == {"linear": (2, 3), "softmax": (4,)}


# --------------------------------------------------------------------------- guards
@pytest.mark.parametrize("name, value", [
    ("log_eps", 5e-324), ("log_eps", 0.0), ("log_eps", 1.1e-3), ("log_eps", -1e-12),
    ("log_eps", float("nan")), ("log_eps", float("inf")), ("log_eps", True), ("log_eps", "1e-12"),
    ("prob_clip", 5e-324), ("prob_clip", 0.01),
    ("clip_eps", 5e-324), ("clip_eps", 1e-3), ("clip_eps", 0.0), ("mean_eps", 1e-3),
    ("mean_eps", 5e-324), ("softmax_eps", 1e-3), ("adam_sqrt_eps", 1e-6),
    ("adam_sqrt_eps", 0.0)])
def test_a_guard_outside_the_range_that_is_still_a_guard_is_refused(name, value):
    refused(_impl({"guards": {name: value}}), f"CAPABILITIES['guards'][{name!r}]",
            f"got {value!r}", "expected a number in [")


@pytest.mark.parametrize("name, value", [
    ("log_eps", 1e-12), ("log_eps", 1e-3), ("log_eps", np.float32(1e-7)), ("prob_clip", 1e-15),
    ("prob_clip", 1e-7), ("clip_eps", 1e-6), ("clip_eps", 1e-8), ("mean_eps", 1e-8),
    ("mean_eps", 1e-6), ("softmax_eps", 1e-9), ("adam_sqrt_eps", 1e-8),
    ("adam_sqrt_eps", 1e-16)])
def test_the_guards_real_code_uses_are_taken(name, value):
    assert capabilities(_impl({"guards": {name: value}}))["guards"] == {name: value}


def test_one_cross_entropy_guard_at_a_time():
    refused(_impl({"guards": {"log_eps": 1e-12, "prob_clip": 1e-15}}),
            "CAPABILITIES['guards']", "'log_eps'", "'prob_clip'", "one of")


def test_guards_that_are_not_a_dict_are_refused():
    refused(_impl({"guards": [("log_eps", 1e-12)]}), "CAPABILITIES['guards']",
            "got [('log_eps', 1e-12)]", "expected a dict")


# --------------------------------------------------------------------------- the declaration
@pytest.mark.parametrize("declaration", [["key_mask"], "key_mask=False", 3, None, (), 0, ""])
def test_a_declaration_that_is_not_a_dict_is_refused(declaration):
    refused(_impl(declaration), f"got {declaration!r}", "expected a dict")


@pytest.mark.parametrize("claim", ["attention_bias", "key_mask", "weight_decay"])
def test_a_claim_is_true_or_false(claim):
    refused(_impl({claim: "no"}), f"CAPABILITIES[{claim!r}]", "got 'no'", "True or False")


def test_conventions_are_a_tuple_of_known_names():
    refused(_impl({"conventions": "lr(0)=0"}), "CAPABILITIES['conventions']", "got 'lr(0)=0'",
            "a tuple of names among ['lr(0)=0']")
    assert capabilities(_impl({"conventions": ["lr(0)=0"]}))["conventions"] == ("lr(0)=0",)


# --------------------------------------------------------------------------- reading it
class _PropertyDeclaration:
    def __init__(self, error=None):
        self.error = error

    @property
    def CAPABILITIES(self):
        if self.error is not None:
            raise self.error
        return {"key_mask": False}


@pytest.mark.parametrize("error", [AttributeError("'Impl' has no attribute '_caps'"),
                                   RuntimeError("not ready"), KeyError("ranks")])
def test_a_declaration_that_raises_when_read_is_refused_never_the_defaults(error):
    refused(_PropertyDeclaration(error), "CAPABILITIES", "raised", type(error).__name__,
            str(error))
    assert capabilities(_PropertyDeclaration())["key_mask"] is False


def test_a_module_whose_getattr_raises_for_capabilities_is_refused():
    import tests.examples.hostile_declaration_getattr as hostile

    refused(hostile, "raised RuntimeError: the declaration table is not built yet")


def test_a_module_getattr_saying_absent_means_no_declaration(monkeypatch):
    """PEP 562: a module ``__getattr__`` raises AttributeError for a name it does not have --
    a lazy-loading package without CAPABILITIES claims everything, as any module without it."""
    mod = types.ModuleType("lazy_impl")
    exec("def __getattr__(name):\n    raise AttributeError(name)\n", mod.__dict__)
    monkeypatch.setitem(sys.modules, "lazy_impl", mod)
    assert capabilities(mod)["key_mask"] is True


def test_the_hostile_example_objects_are_refused():
    import tests.examples.hostile_declarations as hostile

    refused(hostile.property_raises, "raised AttributeError")
    refused(hostile.as_list, "got ['key_mask']", "expected a dict")
    refused(hostile.ranks_zero, "CAPABILITIES['ranks']['linear']", "got (0,)")


# --------------------------------------------------------------------------- contradictions
def _attention_taking_causal(x, W_q, W_k, W_v, W_o, b_q=None, b_k=None, b_v=None, b_o=None, *,
                             n_heads, mask=None, causal=False):
    return ops.attention_forward(x, W_q, W_k, W_v, W_o, b_q, b_k, b_v, b_o, n_heads=n_heads,
                                 mask=mask, causal=causal)


def _always_causal(x, W_q, W_k, W_v, W_o, b_q=None, b_k=None, b_v=None, b_o=None, *, n_heads,
                   mask=None):
    return ops.attention_forward(x, W_q, W_k, W_v, W_o, b_q, b_k, b_v, b_o, n_heads=n_heads,
                                 mask=mask, causal=True)


def test_a_single_form_the_code_does_not_default_to_is_named():
    """``causal: True`` alone says the attention is always causal, so the suite leaves
    ``causal=`` out of its calls: code that takes ``causal=False`` by default then runs
    bidirectional, and used to be an op red (invariant[attention.causal]) caused by the
    declaration."""
    impl = _impl({"key_mask": False, "attention": {"causal": True}},
                 attention_forward=_attention_taking_causal,
                 attention_backward=ops.attention_backward)
    refused(impl, "CAPABILITIES['attention']['causal']", "got True", "attention_forward",
            "causal=False", "(False, True)")
    # the same declaration of an attention that is always causal (no keyword) is taken, as is
    # the code with the keyword declaring both forms
    assert capabilities(_impl({"key_mask": False, "attention": {"causal": True}},
                              attention_forward=_always_causal))["attention"]["causal"] == (True,)
    assert capabilities(_impl({"key_mask": False, "attention": {"causal": (False, True)}},
                              attention_forward=_attention_taking_causal))
    # the reference itself takes every keyword option
    assert capabilities(minibert_reference)["block"]["norm"] == ops.BLOCK_NORMS


def test_several_forms_of_code_without_the_keyword_are_named():
    """Declaring both forms makes the suite pass ``causal=True`` for the causal checks: code
    without that keyword fails every one with a TypeError."""
    refused(_impl({"attention": {"causal": (False, True)}}, attention_forward=_always_causal),
            "CAPABILITIES['attention']['causal']", "got (False, True)",
            "attention_forward takes no causal=")


def test_code_whose_signature_cannot_be_read_is_taken_as_declared():
    """A forward taking ``**kwargs`` (a class-layer adapter) or a builtin: nothing to compare."""
    def forward(*args, **kwargs):
        return ops.attention_forward(*args, **kwargs)

    assert capabilities(_impl({"attention": {"causal": (False, True)}},
                              attention_forward=forward))
    assert capabilities(_impl({"attention": {"causal": True}}, attention_forward=max))


def test_the_variant_examples_are_all_taken():
    from tests.examples.variant_styles import STYLES, build

    for style in STYLES:
        for buggy in (False, True):
            capabilities(build(style, buggy))
