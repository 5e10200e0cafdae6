"""Squared ReLU in the suite (issue 39): the FFN family of ``ffn.activation`` "relu2" keeps its
pre-activations off the kink as ReLU's do, a planted backward bug is red naming the tensor, the
index and both values, and a decoder declaring relu2 alone is judged in it in every form it
has -- transformers' GPT-2 (hidden_act "relu2") included, which raised a KeyError before."""

from __future__ import annotations

import re
import types

import numpy as np
import pytest

import minibert_reference
from minibert_spec.mutants import applied
from minibert_spec.protocol import capabilities
from minibert_spec.suite import strategies as S
from minibert_spec.suite.checks.decoder import decoder_config
from minibert_spec.tolerances import KINK_MARGIN
from tests.drawn import family_cases
from tests.unshrunk import check_implementation

WORST = re.compile(r"worst FAIL: ffn_relu2 d/d(x|W_1|b_1) \[elementwise\] .* at index "
                   r"\(([\d, ]+)\): analytic (-?[\d.]+e[-+]\d+), finite difference "
                   r"(-?[\d.]+e[-+]\d+)")


def only_relu2():
    """The reference with the FFN's squared ReLU as its one activation (a speedrun-style MLP):
    declared alone, and so its ffn_forward's default (the suite leaves the keyword out of its
    calls for a single form)."""
    module = types.ModuleType("relu2_only")
    module.__dict__.update({k: v for k, v in vars(minibert_reference).items()
                            if not k.startswith("__")})
    module.CAPABILITIES = {**minibert_reference.CAPABILITIES,
                           "ffn": {**minibert_reference.CAPABILITIES["ffn"],
                                   "activation": ("relu2",)}}

    def ffn_forward(x, W_1, b_1, W_2, b_2, activation="relu2"):
        return minibert_reference.ffn_forward(x, W_1, b_1, W_2, b_2, activation)

    module.ffn_forward = ffn_forward
    return module


def test_relu2_draws_keep_off_the_kink():
    """relu2 is C^1 but its second derivative jumps at 0: a central difference straddling the
    kink is O(h) off, so its pre-activations stay KINK_MARGIN away, as ReLU's."""
    cases = family_cases(S.family("ffn_relu2"), capabilities(minibert_reference), 200)
    assert all(c.fixed == {"activation": "relu2"} for c in cases)
    nearest = min(float(np.min(np.abs(c.inputs["x"] @ c.inputs["W_1"] + c.inputs["b_1"])))
                  for c in cases)
    assert nearest > KINK_MARGIN, nearest


@pytest.mark.equation("relu2.backward")
def test_a_planted_relu2_backward_bug_is_red_naming_tensor_index_and_values():
    """The catalog's relu2 mutant (dx = dy relu(x), the factor 2 lost): fd[ffn_relu2] names
    the tensor, the index and both values, the finite difference twice the analytic one."""
    with applied("relu2_backward_missing_factor_2"):
        report = check_implementation(minibert_reference, match=r"^fd\[ffn_relu2\]$")
    (red,) = report.failures()
    found = WORST.search(red.message)
    assert found, red.message
    analytic, fd = float(found.group(3)), float(found.group(4))
    assert fd == pytest.approx(2 * analytic, rel=1e-6), red.message


def test_a_decoder_declaring_relu2_alone_is_judged_in_it():
    """Each form with an MLP takes the activation declared (the preset's where declared, else
    the first): relu2 for a relu2-only decoder, gelu_new for the reference's gpt2 form."""
    impl = only_relu2()
    assert decoder_config(impl, "gpt2").activation == "relu2"
    assert decoder_config(impl, "relu2").activation == "relu2"
    assert decoder_config(minibert_reference, "gpt2").activation == "gelu_tanh"
    assert decoder_config(minibert_reference, "relu2").activation == "relu2"


def test_transformers_gpt2_meets_a_relu2_decoder():
    """transformers' GPT-2 with activation_function "relu2" is the oracle of a relu2-only
    decoder's gpt2 form (the activation map had no relu2: a KeyError, a red for a correct
    decoder)."""
    pytest.importorskip("transformers")
    report = check_implementation(only_relu2(), ops=["decoder"],
                                  match=r"^oracle\.forward\[decoder\.hf-gpt2-f64\]$")
    assert [r.outcome for r in report.results] == ["passed"], report.summary()
