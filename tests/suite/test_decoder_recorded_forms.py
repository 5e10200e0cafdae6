"""The decoder row infer records (minibert_spec.suite.infer.decoder_recorded) is checked in the
forms its logits confirmed, never in a cross of them: a correct class with exactly two forms --
GPT-2's (LayerNorm, biases everywhere) and an RMSNorm one without any bias -- that refuses
RMSNorm with attention biases.  Each recorded set declared its options' values apart, so
``minibert check`` used to run RMSNorm *with* attention biases (the LLaMA, NoPE and learned +
RoPE forms) and was red on correct code."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from minibert_spec.protocol import DeclarationError, capabilities
from minibert_spec.suite.infer import infer_source
from minibert_spec.suite.infer.decoder_recorded import confirmed_forms
from tests.suite.infer_support import exec_source, load_source
from tests.unshrunk import check_implementation

TWO_FORMS = '''
from tests.examples.realstyle_gpt import MiniGPT


class TwoFormGPT(MiniGPT):
    """realstyle_gpt's MiniGPT in two forms only: LayerNorm with biases, RMSNorm without."""

    def __init__(self, weights, n_layer, n_head, eps, rope_base=None, tied=True):
        if "ln_f.b" not in weights and "h.0.attn.q.b" in weights:
            raise ValueError("RMSNorm with attention biases: not a form of this model")
        super().__init__(weights, n_layer, n_head, eps, rope_base, tied)
'''


@pytest.fixture
def adapter(tmp_path, monkeypatch):
    """The adapter infer writes for the two-form class, as a module."""
    load_source(tmp_path, monkeypatch, TWO_FORMS, "two_form_gpt")
    source = infer_source("two_form_gpt")
    assert "decoder_forward, decoder_backward, decoder_loss_and_grads = decoder(" in source
    return exec_source(source)


def test_a_class_lacking_a_cross_of_its_forms_is_green(adapter):
    """Correct in both its forms: ok; GPT-2's form and LLaMA's (and NoPE's) each run in a
    combination the logits confirmed, the learned + RoPE form (RMSNorm with an MLP, never
    seen with learned positions) n/a saying so -- never a cross of the forms run."""
    report = check_implementation(adapter, ops=["decoder"], timeout=300.0)
    assert report.verdicts()["decoder"] == "ok", {r.id: r.message for r in report.failures()}
    outcomes = {r.id: r.outcome for r in report.results}
    for form in ("gpt2", "llama", "nope"):
        assert outcomes[f"fd[decoder-{form}-B2-T6]"] == "passed", form
        assert outcomes[f"invariant[decoder.tied-{form}]"] == "passed", form
    crossed = [r for r in report.results if "learned_rope" in r.id]
    assert crossed and {r.outcome for r in crossed} == {"n/a"}
    for r in crossed:
        assert "none of its 4 decoder_forms (the combinations it was confirmed in) has " \
               "decoder.position=learned_rope, block.normalization=rmsnorm" in r.message, r.id


def test_recorded_sets_one_option_apart_are_joined_and_no_others():
    """Sets apart in one option's values alone join (the tied and untied head of a form);
    sets apart in two options, or in a claim, stay apart (their cross was never seen)."""
    gpt2 = {"block": {"normalization": "layernorm"}, "attention_bias": True}
    rms = {"block": {"normalization": "rmsnorm"}, "attention_bias": False}
    forms = confirmed_forms([{**f, "decoder": {"tied": t}} for f in (gpt2, rms)
                             for t in (True, False)])
    assert forms == ({**gpt2, "decoder": {"tied": (True, False)}},
                     {**rms, "decoder": {"tied": (True, False)}})
    assert len(confirmed_forms([{"attention_bias": True}, {"attention_bias": False}])) == 2


def test_a_decoder_form_wider_than_the_declaration_is_refused():
    """A form narrows the declaration, never widens it: a value it does not declare (a form
    the checks would run unconfirmed) or an unknown key is refused before any check runs."""
    declared = {"block": {"normalization": "layernorm"}, "attention_bias": False}
    with pytest.raises(DeclarationError, match=r"\[0\]: block.normalization=rmsnorm is not "
                                               "declared"):
        capabilities(SimpleNamespace(CAPABILITIES={
            **declared, "decoder_forms": ({"block": {"normalization": "rmsnorm"}},)}))
    with pytest.raises(DeclarationError, match=r"\[0\]: attention_bias=True is not declared"):
        capabilities(SimpleNamespace(CAPABILITIES={**declared,
                                                   "decoder_forms": ({"attention_bias": True},)}))
    with pytest.raises(DeclarationError, match="unknown keys \\['ranks'\\]"):
        capabilities(SimpleNamespace(CAPABILITIES={**declared,
                                                   "decoder_forms": ({"ranks": {}},)}))
    caps = capabilities(SimpleNamespace(CAPABILITIES={
        "block": {"normalization": ("layernorm", "rmsnorm")},
        "decoder_forms": ({"block": {"normalization": "rmsnorm"}},)}))
    assert caps["decoder_forms"][0]["block"]["normalization"] == ("rmsnorm",)
