"""The decoder row on a GPT-style NumPy implementation of its own (tests/examples/realstyle_gpt.py,
GPT-2 and LLaMA forms behind a 30-line adapter): green as written, and each of its realistic
bugs red on the decoder row in exactly the checks that can see it, naming the tensor, the index
and both values."""

from __future__ import annotations

import re

import pytest

from tests import ROOT
from tests.examples import realstyle_gpt
from tests.unshrunk import check_implementation

pytest.importorskip("transformers")

FORMS = ("gpt2", "llama")
DTYPES = ("f64", "f32")


def _oracle(parts, forms=FORMS):
    return {f"oracle.{p}[decoder.hf-{f}-{d}]" for p in parts for f in forms for d in DTYPES}


def _fd(forms=FORMS):
    return {f"fd[{row}-{f}-{c}]" for row in ("decoder", "decoder.loss") for f in forms
            for c in ("B2-T6", "B3-T2")}


# bug -> the checks it must fail (every other decoder check passes), what each message names
BUGS = {
    "causal": ({f"invariant[decoder.causal-{f}]" for f in FORMS}
               | _oracle(("forward", "backward")), "decoder["),
    "final_ln": (_fd() | _oracle(("backward",)), "decoder["),
    "tied": (_fd(("gpt2",)) | {f"invariant[decoder.tied-{f}]" for f in FORMS}
             | _oracle(("backward",), ("gpt2",)), "embeddings.token.W"),
    "rope_sign": (_oracle(("forward", "backward"), ("llama",)), "decoder[llama]"),
    # a pre-LN block dropping its rope_base (issue 41): green while every case ran at 10000
    "rope_base": (_oracle(("forward", "backward"), ("llama",)), "decoder[llama]"),
}
TENSOR = re.compile(r"logits|(embeddings|layers\.\d|final_ln|lm_head)\.\w")
# which checks are red is the point here, not their speed: a loaded machine (the FD checks
# localise every wrong tensor entry by entry) must not turn a red into a timeout
TIMEOUT = 300.0
VALUES = re.compile(r"(ours|analytic|tied|after) -?[\d.]+(e[-+]\d+)?.*(torch|finite difference|"
                    r"sum|before) -?[\d.]+", re.S)


def test_the_adapter_is_at_most_30_lines():
    text = (ROOT / "tests/examples/realstyle_gpt.py").read_text()
    adapter = text.split("# " + "-" * 77 + " the adapter\n")[1]
    assert len(adapter.splitlines()) <= 30


def test_the_correct_decoder_is_green(monkeypatch):
    monkeypatch.setattr(realstyle_gpt, "BUGS", set())
    report = check_implementation(realstyle_gpt, ops=["decoder"], timeout=TIMEOUT)
    assert report.verdicts()["decoder"] == "ok", {r.id: r.message for r in report.failures()}
    assert not report.failures()


@pytest.mark.parametrize("bug", [  # final_ln: red in every FD check of both forms: slow tier
    pytest.param(b, marks=pytest.mark.slow) if b == "final_ln" else b for b in BUGS])
def test_each_bug_is_red_in_exactly_the_checks_that_see_it(bug, monkeypatch):
    monkeypatch.setattr(realstyle_gpt, "BUGS", {bug})
    report = check_implementation(realstyle_gpt, ops=["decoder"], timeout=TIMEOUT)
    want, tensor = BUGS[bug]
    assert report.verdicts()["decoder"] == "FAIL"
    assert {r.id for r in report.failures()} == want
    for r in report.failures():
        assert tensor in r.message and "index (" in r.message, (r.id, r.message)
        assert TENSOR.search(r.message) and VALUES.search(r.message), (r.id, r.message)


def test_a_decoder_is_checked_as_its_parts_declare(monkeypatch):
    """The forms take what the implementation declares: GPT-2 with a ReLU MLP, an untied head
    and no biases is that GPT-2; a LLaMA needs RoPE declared and says so when it is not."""
    from minibert_spec.protocol import NotApplicable
    from minibert_spec.suite.checks.decoder import decoder_config

    monkeypatch.setattr(realstyle_gpt, "CAPABILITIES", {
        "attention_bias": False, "ffn": {"activation": ("relu",), "b_1": (False,),
                                         "b_2": (False,)},
        "decoder": {"tied": (False,)}})
    config = decoder_config(realstyle_gpt, "gpt2")
    assert (config.activation, config.tie_embeddings, config.attn_bias, config.mlp_bias) == (
        "relu", False, False, False)
    with pytest.raises(NotApplicable, match=r"RoPE \(it declares attention.rope=None only\)"):
        decoder_config(realstyle_gpt, "llama")
    monkeypatch.setattr(realstyle_gpt, "CAPABILITIES", {
        "attention": {"rope": ("interleaved",)}, "swiglu": {"bias": (True,)},
        "decoder": {"tied": (True, False)}})
    config = decoder_config(realstyle_gpt, "llama")
    assert (config.rope_convention, config.mlp_bias, config.tie_embeddings, config.attn_bias) == (
        "interleaved", True, False, True)
    assert (config.normalization, config.ffn, config.position) == ("rmsnorm", "swiglu", "rope")


def test_a_gpt2_without_biases_meets_transformers_with_zero_biases(monkeypatch):
    """GPT-2's Conv1D always has a bias: a bias-free GPT-2 is judged against transformers'
    with those biases 0 (its gradients of the weights compared, the biases' not ours)."""
    monkeypatch.setattr(realstyle_gpt, "BUGS", set())
    monkeypatch.setitem(realstyle_gpt.CAPABILITIES, "attention_bias", False)
    monkeypatch.setitem(realstyle_gpt.CAPABILITIES, "ffn", {
        "activation": ("gelu_tanh",), "b_1": (False,), "b_2": (False,)})
    report = check_implementation(realstyle_gpt, match=r"^oracle\..*decoder\.hf-gpt2-f64",
                                  timeout=TIMEOUT)
    assert report.counts() == {"passed": 2}, {r.id: r.message for r in report.results}
    monkeypatch.setattr(realstyle_gpt, "BUGS", {"tied"})
    report = check_implementation(realstyle_gpt, match=r"^oracle\.backward\[decoder\.hf-gpt2-f64",
                                  timeout=TIMEOUT)
    assert report.counts() == {"failed": 1}
