"""The decoder row in the forms ports write (issue 39): a decoder declares its form
(``CAPABILITIES["decoder"]``: position, final_norm, head_bias, tied) and is judged in it.

tests/examples/wm_decoder.py -- learned + RoPE positions, pre-RMSNorm blocks, no final norm, an
untied head with a bias -- was judged at model level alone (``--model``): no form of the row
could take it.  Through its adapter (``wm_decoder.DECODER``) its correct version is green in every
decoder check of its form, the forms it does not declare are n/a naming the declaration, and
each planted backward bug is red in the decoder FD row naming the tensor, the index and both
values."""

from __future__ import annotations

import re
from types import SimpleNamespace

import pytest

from minibert_spec.protocol import DeclarationError, capabilities
from tests.examples import realstyle_gpt, wm_decoder
from tests.unshrunk import check_implementation

# the FD checks localise every wrong tensor entry by entry: a loaded machine must not turn a
# red into a timeout
TIMEOUT = 300.0
FD = {f"fd[{row}-learned_rope-{case}]" for row in ("decoder", "decoder.loss")
      for case in ("B2-T6", "B3-T2")}
# the decoder composed in torch (transformers has no model of the form)
COMPOSED = {f"oracle.{part}[decoder.composed-learned_rope-{d}]" for part in ("forward", "backward")
            for d in ("f64", "f32")}
# every check of the learned + RoPE form that a decoder with an untied head takes
LEARNED_ROPE = FD | COMPOSED | {f"invariant[decoder.gradient_bookkeeping-learned_rope-{d}]"
                     for d in ("f64", "f32")} | {
    f"invariant[decoder.{name}-learned_rope]"
    for name in ("causal", "bit_identical_and_pure", "float32_vs_float64")}
TENSOR_INDEX_VALUES = re.compile(
    r"d/d(embeddings|layers\.\d|lm_head)\.[\w.]+ \[elementwise\].* at index \([\d, ]+\): "
    r"analytic -?[\d.]+e[-+]\d+, finite difference -?[\d.]+e[-+]\d+")


def test_the_correct_decoder_is_green_in_its_form():
    pytest.importorskip("transformers")
    report = check_implementation(wm_decoder.DECODER, ops=["decoder"], timeout=TIMEOUT)
    outcomes = {r.id: r.outcome for r in report.results}
    assert report.verdicts()["decoder"] == "ok" and not report.failures(), {
        r.id: r.message for r in report.failures()}
    assert {i for i, o in outcomes.items() if o == "passed"} == LEARNED_ROPE
    # the other forms: n/a, each naming the declaration it lacks (the decoder's own first)
    for r in report.results:
        if r.id.startswith(("fd[decoder-gpt2", "fd[decoder-llama", "fd[decoder-sinusoidal",
                            "fd[decoder-nope")):
            assert r.outcome == "n/a" and "(it declares decoder.position=learned_rope)" in (
                r.message), (r.id, r.message)
    tied = next(r for r in report.results if r.id == "invariant[decoder.tied-learned_rope]")
    assert tied.outcome == "n/a" and "decoder.tied=False" in tied.message


@pytest.mark.parametrize("bug, tensor", [
    pytest.param("rope", "attn.W_q", marks=pytest.mark.slow),  # 21 tensors localised: ~30 s
    ("head_bias", "lm_head.b"), ("rmsnorm", "gamma"), ("wpe", "embeddings.position.W")])
def test_each_planted_bug_is_red_in_the_decoder_fd_row(bug, tensor):
    report = check_implementation(wm_decoder.decoder_ops(bug), ops=["decoder"],
                                  match=r"^fd\[decoder.*learned_rope", timeout=TIMEOUT)
    red = {r.id: r.message for r in report.failures()}
    assert report.verdicts()["decoder"] == "FAIL" and red and set(red) <= FD, red
    for check_id, message in red.items():
        worst = message.split("worst FAIL: ")[1]
        assert TENSOR_INDEX_VALUES.match(worst.split("decoder[learned_rope] ")[1].replace(
            "loss ", "", 1)), (check_id, message)
        assert tensor in worst.split(" [elementwise]")[0], (check_id, message)


def test_a_decoder_declaring_nothing_new_is_not_judged_in_the_ports_forms():
    """The standard declaration (no position, final_norm or head_bias declared) is the two
    forms Hugging Face has: the ports' forms are n/a naming decoder.position."""
    report = check_implementation(realstyle_gpt, ops=["decoder"],
                                  match="learned_rope|sinusoidal|nope", timeout=TIMEOUT)
    assert report.results and {r.outcome for r in report.results} == {"n/a"}
    for r in report.results:
        assert "(it declares decoder.position=learned|rope)" in r.message, (r.id, r.message)


def test_a_form_no_decoder_has_is_refused_in_the_declaration():
    for bad, match in (({"position": "alibi"}, r"\['decoder'\]\['position'\]: expected one "
                                               r"value or a tuple of values among \['learned', "
                                               r"'rope', 'learned_rope', 'sinusoidal', 'none'\]"),
                       ({"final_norm": "no"}, r"\['decoder'\]\['final_norm'\]"),
                       ({"head_bias": 1}, r"\['decoder'\]\['head_bias'\]: .* got 1")):
        with pytest.raises(DeclarationError, match=match):
            capabilities(SimpleNamespace(CAPABILITIES={"decoder": bad}))


def test_each_form_meets_one_torch_oracle():
    """transformers' models for the GPT-2 and LLaMA forms (their check ids unchanged), the
    decoder composed in torch for the ports' forms: never both, never neither."""
    from minibert_spec.suite.registry import select

    ids = {c.id for c in select(match=r"^oracle\.forward\[decoder\.")}
    assert ids == {f"oracle.forward[decoder.{oracle}-{form}-{d}]" for d in ("f64", "f32")
                   for oracle, forms in (("hf", ("gpt2", "llama")),
                                         ("composed", ("learned_rope", "sinusoidal", "nope",
                                                       "relu2")))
                   for form in forms}
