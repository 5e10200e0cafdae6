"""LayerNorm without affine inside a block (issue 39): ``layernorm.affine`` reaches the block
(``also``), whose ``p`` then has no ``ln1.*`` / ``ln2.*`` keys.  Every block family follows the
declaration and ``block_lnplain`` asks for it; tests/examples/realstyle_plain_ln_block.py (a
post-LN block written by hand around affine-free LayerNorms) is green in FD, the invariants and
torch's composed block, and its LayerNorm backward that drops the variance term is red naming
tensor, index and both values.  A block call in a form not declared is n/a."""

from __future__ import annotations

import re

import numpy as np
import pytest

from minibert_spec.protocol import ImplProxy, NotApplicable
from tests.examples import realstyle_plain_ln_block as plain
from tests.unshrunk import check_implementation

FAST = ["fd", "invariant"]


@pytest.mark.slow  # a whole block's FD and invariants: >= 5 s (issue 40)
def test_the_affine_free_block_is_green_in_every_block_family_it_can_take():
    report = check_implementation(plain.correct, ops=["block"], kinds=FAST)
    outcome = {r.id: r.outcome for r in report.results}
    assert report.verdict(report.grid()["block"]) == "ok", report.summary()
    for family in ("block_lnplain", "block_lnplain_mask", "block_bias", "block_nobias"):
        assert outcome[f"fd[{family}]"] == "passed", outcome


@pytest.mark.slow  # a whole block's FD: >= 5 s (issue 40)
def test_a_layernorm_backward_without_the_variance_term_is_red_naming_tensor_index_values():
    report = check_implementation(plain.buggy, ops=["block"], kinds=["fd"])
    red = {r.id: r for r in report.results}["fd[block_lnplain]"]
    assert red.outcome == "failed", red.message
    assert re.search(r"d/d\S+ .* at index \(\d+(, \d+)*\): analytic -?\d.*finite difference -?\d",
                     red.message), red.message


def _block_args(affine: bool):
    rng = np.random.default_rng(0)
    H, I = 4, 6
    p = {f"attn.{n}": rng.standard_normal((H, H)) for n in ("W_q", "W_k", "W_v", "W_o")}
    p.update({f"attn.{n}": rng.standard_normal(H) for n in ("b_q", "b_k", "b_v", "b_o")})
    p.update({"ffn.W_1": rng.standard_normal((H, I)), "ffn.b_1": rng.standard_normal(I),
              "ffn.W_2": rng.standard_normal((I, H)), "ffn.b_2": rng.standard_normal(H)})
    if affine:
        p.update({f"{ln}.{a}": rng.standard_normal(H) for ln in ("ln1", "ln2")
                  for a in ("gamma", "beta")})
    return rng.standard_normal((2, 3, H)), p


def test_a_block_call_in_an_undeclared_layernorm_form_is_not_applicable():
    x, p = _block_args(affine=True)
    with pytest.raises(NotApplicable, match="layernorm with gamma and beta"):
        ImplProxy(plain.correct, "plain").block_forward(x, p, n_heads=2)
    affine_only = type("M", (), {"CAPABILITIES": {"layernorm": {"affine": True}},
                                 "block_forward": staticmethod(lambda x, p, **kw: None)})
    x, p = _block_args(affine=False)
    with pytest.raises(NotApplicable, match="layernorm without gamma/beta"):
        ImplProxy(affine_only, "affine").block_forward(x, p, n_heads=2)


def test_the_reference_block_without_affine_is_its_block_with_gamma_one_beta_zero():
    from minibert_reference import ops

    x, p = _block_args(affine=False)
    out, cache = ops.block_forward(x, p, n_heads=2)
    ones = {f"{ln}.gamma": np.ones(4) for ln in ("ln1", "ln2")}
    zeros = {f"{ln}.beta": np.zeros(4) for ln in ("ln1", "ln2")}
    out1, _ = ops.block_forward(x, {**p, **ones, **zeros}, n_heads=2)
    np.testing.assert_allclose(out, out1, rtol=1e-12, atol=1e-12)
    _, grads = ops.block_backward(np.ones_like(out), cache)
    assert set(grads) == set(p)


@pytest.mark.slow  # torch's import and twins: >= 5 s (issue 40)
def test_torch_judges_the_affine_free_block():
    ok = check_implementation(plain.correct, ops=["block"],
                              kinds=["oracle.forward", "oracle.backward"])
    outcome = {r.id: r.outcome for r in ok.results}
    for kind in ("forward", "backward"):
        assert outcome[f"oracle.{kind}[block_lnplain-f64]"] == "passed", outcome
