"""The block's float32 stability invariant (invariant[<family>.large_mean_and_logits_float32],
spec/suite/checks/invariants.py): the constants it adds are ignored by the block in exact
arithmetic (float64, every block family of the reference), the reference is green on it, and
two stability bugs of the kernels inside a block -- a one-pass LayerNorm variance and a softmax
without the row max subtracted -- are red on it in every family whose form a shift reaches, with
a message naming the tensor, the index and both values.  Before it they were green at block
level (tests/suite/test_infer_mutants.py's KNOWN_GREEN)."""

from __future__ import annotations

import re

import numpy as np
import pytest

import minibert_reference
from minibert_spec.mutants import applied
from minibert_spec.protocol import NotApplicable, capabilities
from minibert_spec.suite import strategies as S
from minibert_spec.suite.checks.invariants import block_at_large_mean_and_logits
from minibert_spec.suite.registry import all_checks, get
from minibert_spec.tolerances import F64_IDENTITY_RTOL

FAMILIES = [f for f in S.families() if f.op == "block"
            and not f.name.startswith("block_llama_swiglu")]  # none reaches (below): no check
# the families whose form no shift reaches, and why: RMSNorm is not shift-invariant (and the
# mutant is LayerNorm's); a softmax row takes a constant through a key bias alone, which RoPE
# turns by position and the bias-free attention lacks
NO_LAYERNORM_SHIFT = {"block_rmsnorm", "block_llama_swiglu"}
NO_LOGIT_SHIFT = {"block_nobias", "block_causal_rope_half", "block_causal_rope_interleaved",
                  "block_llama_swiglu"}
MUTANTS = {"layernorm_one_pass_variance": NO_LAYERNORM_SHIFT,
           "softmax_no_max_subtraction": NO_LOGIT_SHIFT}
# "<family>: forward at <what was shifted> ...: worst at index (i, j, k): got A, expected B"
NAMES_INDEX_AND_VALUES = re.compile(r"forward at (attn|ffn|x).+: worst at index \(\d+, \d+, "
                                    r"\d+\): got \S+, expected \S+")


def _check(family):
    return get(f"invariant[{family.name}.large_mean_and_logits_float32]")


def _outcome(family) -> str:
    try:
        _check(family).call(minibert_reference)
    except NotApplicable:
        return "n/a"
    except AssertionError as e:
        return f"red: {e}"
    return "ok"


def _unmasked(name: str) -> str:
    return name.removesuffix("_mask")


@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f.name)
def test_the_shifts_are_ignored_in_exact_arithmetic(family):
    """In float64 the shifted case's output is the case's own (plus the per-token constant of a
    pre-LN block without LN_f), to rounding of terms of the constants' size: the identity the
    float32 comparison rests on."""
    forward, _ = family.bind(minibert_reference)
    for case in family.examples(capabilities(minibert_reference)):
        stressed, offset, shifted = block_at_large_mean_and_logits(case)
        want = forward(**case.inputs, **case.fixed)[0] + offset
        got = forward(**stressed.inputs, **stressed.fixed)[0]
        terms = max(shifted.values(), default=1.0) * S.block_norm_amplification(case)
        np.testing.assert_allclose(got, want, rtol=0, atol=F64_IDENTITY_RTOL * terms,
                                   err_msg=f"{family.name}: shifted {sorted(shifted)}")


def test_every_block_family_a_shift_reaches_has_the_check():
    ids = {c.id for c in all_checks() if c.id.endswith(".large_mean_and_logits_float32]")}
    assert ids == {f"invariant[{f.name}.large_mean_and_logits_float32]" for f in FAMILIES}
    assert all(_unmasked(f.name) in gap for f in S.families()
               if f.op == "block" and f not in FAMILIES
               for gap in MUTANTS.values())


@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f.name)
def test_the_reference_is_green_and_each_bug_red_where_a_shift_reaches_it(family):
    assert _outcome(family) == "ok"
    for mutant, gap in MUTANTS.items():
        with applied(mutant), np.errstate(all="ignore"):  # the bugs' NaN and overflow
            outcome = _outcome(family)
        if _unmasked(family.name) in gap:
            assert not outcome.startswith("red"), (mutant, outcome)
        else:
            assert outcome.startswith("red") and NAMES_INDEX_AND_VALUES.search(outcome), (
                mutant, outcome)
