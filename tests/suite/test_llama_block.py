"""LLaMA's block at op level (issue 39): pre-norm RMSNorms, causal attention with RoPE, SwiGLU
(block.ffn "swiglu": ``swiglu.W_1`` gate, ``swiglu.W_3`` up, ``swiglu.W_2`` down).  Family
block_llama_swiglu[_mask] draws it, torch's composed block runs transformers' LlamaMLP in it,
and every block family follows a declared block.ffn.  tests/examples/realstyle_llama_block.py
(a LLaMA block written by hand) is green there; its SwiGLU backward without SiLU's
``g s (1 - s)`` term is red naming tensor, index and both values; an implementation that does
not declare SwiGLU is n/a naming its declaration."""

from __future__ import annotations

import re
from types import SimpleNamespace

import pytest

import minibert_reference
from tests.examples import realstyle_llama_block as llama
from tests.unshrunk import check_implementation

FAMILIES = ("block_llama_swiglu", "block_llama_swiglu_mask")
# a red names the tensor, the index and both values (FD: analytic and finite difference; the
# oracle: ours and torch's)
NAMED = {"fd": r"d/d\S+ .* at index \(\d+(, \d+)*\): analytic -?\d.*finite difference -?\d",
         "oracle": r"d\S+ \(float64\) differs from torch: worst at index \(\d+(, \d+)*\): "
                   r"ours -?\d\S* torch -?\d"}


@pytest.mark.slow  # a whole block's FD and torch twins: >= 5 s (issue 40)
def test_a_hand_written_llama_block_is_green_in_its_families():
    report = check_implementation(llama.correct, ops=["block"],
                                  kinds=["fd", "oracle.forward", "oracle.backward"])
    outcome = {r.id: r.outcome for r in report.results}
    assert report.verdict(report.grid()["block"]) == "ok", report.summary()
    for family in FAMILIES:
        assert outcome[f"fd[{family}]"] == "passed", outcome
        for kind in ("forward", "backward"):
            for dtype in ("f64", "f32"):
                assert outcome[f"oracle.{kind}[{family}-{dtype}]"] == "passed", outcome
    # the RoPE families follow its declared block.ffn: they draw its SwiGLU too
    assert outcome["fd[block_causal_rope_half]"] == "passed", outcome


@pytest.mark.slow  # a whole block's FD and torch twin: >= 5 s (issue 40)
def test_a_swiglu_backward_without_silus_second_term_is_red_naming_tensor_index_values():
    report = check_implementation(llama.buggy, ops=["block"],
                                  kinds=["fd", "oracle.backward"], match="llama_swiglu")
    red = {r.id: r for r in report.results}
    for check, named in ((f"fd[{FAMILIES[0]}]", NAMED["fd"]),
                         (f"oracle.backward[{FAMILIES[0]}-f64]", NAMED["oracle"])):
        assert red[check].outcome == "failed", red[check].message
        assert re.search(named, red[check].message), red[check].message


def test_an_implementation_without_swiglu_is_not_applicable_naming_its_declaration():
    """The reference's block declared in every form but SwiGLU (block.ffn's default, the FFN
    alone): the SwiGLU families are n/a, saying what it declares -- never run, never a pass."""
    caps = {op: dict(options) for op, options in minibert_reference.CAPABILITIES.items()}
    del caps["block"]["ffn"]
    mlp_only = SimpleNamespace(block_forward=minibert_reference.block_forward,
                               block_backward=minibert_reference.block_backward,
                               CAPABILITIES=caps)
    report = check_implementation(mlp_only, ops=["block"], match="llama_swiglu")
    assert report.results
    for r in report.results:
        assert r.outcome == "n/a", (r.id, r.outcome, r.message)
        assert "SwiGLU" in r.message and "block.ffn=mlp" in r.message, r.message


@pytest.mark.parametrize("H", [9, 8])
def test_the_swiglu_twin_takes_any_width(H):
    """transformers' LlamaConfig validates RoPE's rotary dimension (hidden_size / heads, which
    must be even) even for the MLP alone: the twin is built with an even head_dim of its own, so
    a SwiGLU of odd width is compared, not refused (a false red on a correct implementation
    before: "RoPE requires an even rotary dimension, but got head_dim=9")."""
    import numpy as np

    torch = pytest.importorskip("torch")
    from minibert_spec.suite.torch_swiglu import swiglu

    rng = np.random.default_rng(0)
    x, W_1, W_3, W_2 = (rng.standard_normal(s) for s in ((2, 3, H), (H, 5), (H, 5), (5, H)))
    want = minibert_reference.swiglu_forward(x, W_1, W_2, W_3)[0]
    got = swiglu(*(torch.from_numpy(a) for a in (x, W_1, W_2, W_3))).detach().numpy()
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
