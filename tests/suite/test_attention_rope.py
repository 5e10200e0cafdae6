"""LLaMA's attention at op level (issue 39): causal attention with RoPE on the queries and the
keys, in both pair conventions, alone and inside a block -- the case families
``attention_causal_rope_half`` / ``_interleaved`` (spec/suite/strategies/attention.py) and
``block_causal_rope_half`` / ``_interleaved`` (blocks.py), whose twin is
``minibert_spec.suite.torch_oracle.rope_attention`` (q, k turned by transformers'
apply_rotary_pos_emb or by Meta's complex product, then torch's scaled_dot_product_attention;
the block's composed around it).

Before them a bug of RoPE inside attention was seen at the decoder's model level only, and no
case was both causal and RoPE.  Here: the reference passes them; each catalog mutant of RoPE in
attention is red at the op -- FD and the oracle's backward in both conventions, the forward
oracle too when the forward is wrong -- and a red names the tensor, the index and both values;
an implementation that declares no RoPE for its attention has the rows not applicable."""

from __future__ import annotations

import re

import pytest

import minibert_reference
from minibert_spec.mutants import applied
from tests.unshrunk import check_implementation

pytestmark = pytest.mark.oracle("attention")

ROWS = r"^(fd|oracle\.\w+|invariant)\[(attention|block)_causal_rope_(half|interleaved)(_mask)?\b"
CONVENTIONS = ("half", "interleaved")
# mutant -> the checks (kind) it must turn red in both conventions
RED = {
    # the keys never turned: the forward differs from the twin, the backward from FD
    "attention_rope_keys_unturned": ("fd", "oracle.forward", "oracle.backward"),
    # dK not turned back: a backward-only bug (the forward is right)
    "attention_rope_backward_skips_keys": ("fd", "oracle.backward"),
}


def _failed(report) -> dict[str, str]:
    return {r.id: r.message for r in report.failures()}


@pytest.mark.slow  # the slow tier: 72 checks (~60 s)
def test_the_reference_passes_the_causal_rope_rows():
    report = check_implementation(minibert_reference, match=ROWS)
    ids = {r.id for r in report.results}
    for op in ("attention", "block"):
        assert {f"fd[{op}_causal_rope_{c}]" for c in CONVENTIONS} <= ids
        assert {f"oracle.{kind}[{op}_causal_rope_{c}-{d}]" for kind in ("forward", "backward")
                for c in CONVENTIONS for d in ("f32", "f64")} <= ids
    assert report.counts() == {"passed": len(report.results)}, report.summary()


@pytest.mark.slow  # the slow tier: >= 5 s each
@pytest.mark.parametrize("name", sorted(RED))
def test_a_rope_bug_inside_attention_is_red_at_the_op(name):
    with applied(name):
        failed = _failed(check_implementation(minibert_reference, match=ROWS))
    for kind in RED[name]:
        for op in ("attention", "block"):
            for c in CONVENTIONS:
                ids = [i for i in failed if re.match(
                    rf"{re.escape(kind)}\[{op}_causal_rope_{c}(-f(32|64))?\]$", i)]
                assert ids, f"{name}: no {kind} check of {op}, {c}, red ({sorted(failed)})"
    if "oracle.forward" not in RED[name]:  # a backward-only bug: the forward stays green
        assert not [i for i in failed if i.startswith("oracle.forward")], sorted(failed)
    # the red names the tensor, the index and both values
    message = failed["fd[attention_causal_rope_half]"]
    assert re.search(r"\b(dx|dW_[qkvo]|db_[qkvo])\b", message), message
    assert re.search(r"at index \(\d+(, \d+)*,?\): analytic -?\d\.\d+e[-+]\d+, finite "
                     r"difference -?\d\.\d+e[-+]\d+", message), message


def test_without_rope_declared_the_rows_are_not_applicable():
    """An attention declaring no RoPE (the suite passes no ``rope=``) is not judged by these
    rows, and says why (the declaration), instead of failing on an argument it lacks; with
    nothing else selected, the run is a could-not-run, not a pass."""
    class NoRope:  # the reference's ops, its declaration without RoPE in attention
        CAPABILITIES = {**minibert_reference.CAPABILITIES,
                        "attention": {**minibert_reference.CAPABILITIES["attention"],
                                      "rope": (None,)}}

        def __getattr__(self, name):
            return getattr(minibert_reference, name)

    report = check_implementation(NoRope(), match=ROWS, quick=True)
    assert report.results and {r.outcome for r in report.results} == {"n/a"}, report.summary()
    assert all("attention.rope=None" in r.message for r in report.results), [
        r.message for r in report.results]
    assert report.exit_code() != 0, report.summary()
