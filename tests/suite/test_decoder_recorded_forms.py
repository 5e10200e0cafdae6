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
