"""Mathematical invariants of the op pairs (no finite differences).

Generic, for every case family (registered with ``@cases`` in spec/suite/strategies/): a
zero upstream gives exactly zero gradients; a backward is linear in its upstream gradient; two
identical calls are bit-identical and leave their inputs untouched; the float32 path stays
float32 and agrees with the float64 path (the op-pair contract, written once here).  Then
op-specific identities that hold in exact arithmetic (minibert_spec.numerics.identities), on the
cases of one family.  Every check runs its family's fixed-seed cases first (alone in the quick run).
"""

from __future__ import annotations

import dataclasses
import warnings
from types import SimpleNamespace

import numpy as np
from hypothesis import assume
from hypothesis import strategies as st

from minibert_spec.builtin import Identity, declarations
from minibert_spec.numerics import identities as inv
from minibert_spec.numerics.fdcheck import (
    assert_f32_close,
    input_rounding_sensitivity,
    max_abs,
    run_op,
)
from minibert_spec.numerics.identities import require
from minibert_spec.protocol import OPS
from minibert_spec.protocol.capabilities import ConventionWarning, capabilities, declared_guards
from minibert_spec.protocol.norm_eps import pinned_eps
from minibert_spec.suite import strategies as S
from minibert_spec.suite.checks.fd import on_families, on_family
from minibert_spec.suite.registry import check
from minibert_spec.suite.strategies.builtin import HANDED as KIT
from minibert_spec.tolerances import F64_IDENTITY_RTOL


def _zeros_like(dout):
    return np.zeros_like(dout) if isinstance(dout, np.ndarray) else 0.0


def _copy(value):
    return value.copy() if isinstance(value, np.ndarray) else value


def _cast(value, dtype):
    if isinstance(value, np.ndarray) and np.issubdtype(value.dtype, np.floating):
        return value.astype(dtype)
    return value


def cast_case(case: S.OpCase, dtype) -> S.OpCase:
    """The case with its float inputs, float fixed arrays and upstream gradient in ``dtype``."""
    dout = _cast(case.dout, dtype) if isinstance(case.dout, np.ndarray) else case.dout
    return S.OpCase({k: _cast(v, dtype) for k, v in case.inputs.items()},
                    {k: _cast(v, dtype) for k, v in case.fixed.items()}, dout, case.seed)


def _bits(a):
    return None if a is None else (np.asarray(a).dtype, np.asarray(a).shape,
                                   np.asarray(a).tobytes())


def _snapshot(case: S.OpCase) -> dict:
    return {k: _bits(v) if isinstance(v, np.ndarray) else v
            for k, v in {**case.inputs, **case.fixed}.items()}


def _signed(rng) -> float:
    """A random factor with 0.1 <= |v| <= 2, either sign."""
    return float(rng.choice([-1.0, 1.0]) * rng.uniform(0.1, 2.0))


# --------------------------------------------------------------------------- every op
@on_families("invariant", "zero_upstream")
def zero_upstream_gives_exactly_zero_gradients(impl, family, case):
    """A zero upstream gradient gives exactly zero gradients."""
    _, grads = run_op(impl, family, case, dout=_zeros_like(case.dout))
    for name, g in zip(case.inputs, grads):
        if g is not None and not np.all(g == 0):
            idx = tuple(int(i) for i in np.argwhere(g != 0)[0])
            raise AssertionError(f"{family.name}: d{name}{list(idx)} = {g[idx]!r} for a zero "
                                 "upstream gradient (expected exactly 0)")


@on_families("invariant", "linear_in_upstream")
def backward_is_linear_in_upstream(impl, family, case):
    """backward(a d1 + b d2) == a backward(d1) + b backward(d2) (d2, a, b random from the
    case's seed), to float64 rounding relative to the largest term of the op's gradients
    (entries that cancel to ~0, like the key bias's, carry rounding of the size of the terms
    that cancelled), and never below rounding of the upstream gradient times the inputs: a
    gradient that is ~0 in every call (a LayerNorm over two features: x_hat = +-1 whatever x,
    so dx ~ eps-sized) is a cancellation of terms of that size, not of its own."""
    rng = np.random.default_rng(case.seed)
    if isinstance(case.dout, np.ndarray):
        d2 = rng.standard_normal(case.dout.shape)
    else:
        d2 = _signed(rng)
    a, b = _signed(rng), _signed(rng)
    _, g1 = run_op(impl, family, case)
    _, g2 = run_op(impl, family, case, dout=d2)
    _, g12 = run_op(impl, family, case, dout=a * case.dout + b * d2)
    terms = [np.abs(a * x) + np.abs(b * y) for x, y in zip(g1, g2) if x is not None]
    upstream = max(abs(a) * float(np.max(np.abs(case.dout))), abs(b) * float(np.max(np.abs(d2))))
    inputs = max((float(np.max(np.abs(v))) for v in case.inputs.values()
                  if isinstance(v, np.ndarray) and v.size), default=1.0)
    scale = max(max(float(t.max()) for t in terms), upstream * max(1.0, inputs))
    for name, x, y, z in zip(case.inputs, g1, g2, g12):
        if x is None:
            assert y is None and z is None, f"{family.name}: d{name} is None only sometimes"
            continue
        np.testing.assert_allclose(z, a * x + b * y, rtol=0, atol=F64_IDENTITY_RTOL * scale,
                                   err_msg=f"{family.name}: d{name} is not linear in dout")


@on_families("invariant", "bit_identical_and_pure")
def identical_calls_are_bit_identical_and_pure(impl, family, case):
    """The forward leaves its inputs untouched, the backward leaves dout and the forward's
    inputs untouched, and two identical calls give the same bits."""
    forward, backward = family.bind(impl)
    before, dout_before = _snapshot(case), _bits(case.dout)
    out1, cache = forward(**case.inputs, **case.fixed)
    by_forward = [k for k, v in _snapshot(case).items() if v != before[k]]
    g1 = backward(case.dout, cache)
    by_backward = [k for k, v in _snapshot(case).items() if v != before[k]
                   and k not in by_forward] + (["dout"] if _bits(case.dout) != dout_before else [])
    problems = [f"the forward leaves its inputs untouched: it modified {by_forward} in place"
                ] if by_forward else []
    if by_backward:
        problems.append("the backward leaves dout and the forward's inputs untouched: it "
                        f"modified {by_backward} in place")
    assert not problems, f"{family.name}: " + "; ".join(problems)
    out2, g2 = run_op(impl, family, case)
    assert _bits(out1) == _bits(out2), f"{family.name}: forward output differs between calls"
    for name, x, y in zip(case.inputs, g1, g2):
        assert _bits(x) == _bits(y), f"{family.name}: d{name} differs between identical calls"


@on_families("invariant", "float32_vs_float64")
def float32_path_agrees_with_float64(impl, family, case):
    """Same code, float32 inputs: outputs and gradients stay float32 (no silent casts; a scalar
    loss promoted to float64 is a convention, reported with the number it changes) and agree
    with the float64 run on the same float32-rounded inputs to float32 precision."""
    if family.f32_ok is not None:
        assume(family.f32_ok(case))
    case32 = cast_case(case, np.float32)
    case64 = cast_case(case32, np.float64)
    out64, g64 = run_op(impl, family, case64)
    out32, g32 = run_op(impl, family, case32)
    if np.ndim(out32) == 0 and np.asarray(out32).dtype == np.float64:
        value = float(out32)
        warnings.warn(ConventionWarning(
            f"{family.op}: float32 in -> float32 out: loss promoted to float64: float32 "
            f"rounding would change it by {abs(value - float(np.float32(value))):.1e}"),
            stacklevel=1)
    # the floor scales with the terms the backward sums where they exceed its results (a
    # LayerNorm dx sums terms of |gamma dy| / sigma that cancel): the family's backward_scale,
    # the same rule as the oracle's rounding floor
    # (minibert_spec.tolerances.layernorm_backward_scale)
    scale = max(max_abs(*g64),
                0.0 if family.backward_scale is None else family.backward_scale(case64))

    def compare(conditioning):
        assert_f32_close(out32, out64, max_abs(out64), f"{family.name}: forward",
                         conditioning=conditioning[0])
        for name, x, y, c in zip(case.inputs, g32, g64, conditioning[1:]):
            if y is None:
                assert x is None, f"{family.name}: d{name} is None in float64 only"
                continue
            assert_f32_close(x, y, scale, f"{family.name}: d{name}", what_kept="gradients",
                             conditioning=c)

    try:
        compare([0.0] * (1 + len(g64)))
    except AssertionError:  # wrong, or an ill-conditioned case: what its inputs' rounding allows
        def rerun(inputs, dout):
            out, grads = run_op(impl, family, dataclasses.replace(case64, inputs=inputs,
                                                                   dout=dout))
            return [out, *grads]

        compare(input_rounding_sensitivity(rerun, case64.inputs, case64.dout, [out64, *g64]))


# --------------------------------------------------------------------------- op-specific
# The identities are minibert_spec.numerics.identities'; here they get a family's drawn and
# fixed-seed cases.
@on_family("embedding", "scatter_adds", equations=("embedding.backward",))
def embedding_backward_sums_repeated_ids(impl, case):
    """dW[v] accumulates dout of every position holding id v (ids repeat by construction)."""
    require(inv.embedding_scatter_adds(impl, case.fixed["ids"], case.inputs["W"], case.dout))


@on_family("sinusoidal_position", "table", equations=("position.sinusoidal",))
def sinusoidal_table_identities(impl, case):
    """The table is 0 / 1 at position 0, feature 0 is sin(position), values in [-1, 1], and the
    forward adds it."""
    require(inv.sinusoidal_identities(impl, case.inputs["x"]))


@on_family("linear_bias", "xw_plus_b", equations=("linear.forward",))
def linear_is_xw_plus_b(impl, case):
    """The forward is x @ W + b, and db is None without a bias."""
    require(inv.linear_identities(impl, *case.inputs.values(), case.dout))


def _layernorm_variant(caps) -> dict:
    return S.variant_kwargs("layernorm", {}, ("layernorm.affine", "layernorm.eps"), caps)


@check("invariant", "layernorm.normalises", equations=("layernorm.forward",),
       given=lambda _: lambda caps: {
           "case": S.layernorm_cases(gamma_margin=0.1, **_layernorm_variant(caps)),
           "scale": S.floats(0.25, 4.0), "shift": S.floats(-3.0, 3.0)},
       examples=lambda _: lambda caps: [
           {"case": c, "scale": 1.7, "shift": -0.4}
           for c in S.fixed_cases(S.layernorm_cases, **_layernorm_variant(caps))])
def layernorm_normalises_and_ignores_row_affine_maps(impl, case, scale, shift):
    """Normalised rows (mean 0, variance 1 before the affine map, if any); x and a x + c give
    the same output and the backward's invariances hold."""
    x, gamma, beta = case.inputs["x"], case.inputs["gamma"], case.inputs["beta"]
    require(inv.layernorm_normalises(impl, x, gamma, beta, scale, shift)
            + inv.layernorm_backward_invariances(impl, x, gamma, beta, case.dout))


@on_family("softmax_masked", "rows_sum_to_one", equations=("softmax.forward",),
           given={"shift": S.floats(-5.0, 5.0)}, example={"shift": 1.7})
def softmax_rows_sum_to_one_masked_exactly_zero_and_shift_invariant(impl, case, shift):
    """Rows sum to 1, masked entries are exactly 0, adding a constant to a row changes
    nothing."""
    x, mask = case.inputs["x"], case.fixed["mask"]
    require(inv.softmax_identities(impl, x, mask, case.dout)
            + inv.softmax_shift_invariant(impl, x, mask, shift))


@on_family("softmax_masked", "stable_far_from_zero", equations=("softmax.forward",),
           given={"shift": st.one_of(S.floats(720.0, 1000.0), S.floats(-1000.0, -750.0))},
           example=[{"shift": 800.0}, {"shift": -800.0}])
def softmax_is_stable_far_from_zero(impl, case, shift):
    """Logits near +-1000: exp overflows above ~709 and underflows below ~-745, so an unshifted
    softmax returns NaN."""
    require(inv.softmax_shift_invariant(impl, case.inputs["x"], case.fixed["mask"], shift))


@check("invariant", "softmax_jacobian.structure", equations=("softmax.jacobian",),
       given={"p": S.probability_rows()},
       examples=lambda _: lambda caps: [{"p": p} for p in S.fixed_cases(S.probability_rows)])
def softmax_jacobian_is_symmetric_with_zero_column_sums(impl, p):
    """diag(p) - p p^T: symmetric, every column sums to 0, diagonal p (1 - p)."""
    require(inv.softmax_jacobian_identities(impl, p))


@on_family("relu", "zero_below_zero", equations=OPS["relu"].equations)
def relu_output_and_gradient_vanish_below_zero(impl, case):
    """output >= 0, and dx is exactly 0 where x < 0."""
    require(inv.relu_identities(impl, case.inputs["x"], case.dout))


@on_family("tanh", "odd_and_bounded", equations=("tanh.forward",))
def tanh_is_odd_and_bounded(impl, case):
    """|tanh x| <= 1 and tanh(-x) = -tanh(x)."""
    require(inv.tanh_identities(impl, case.inputs["x"]))


@check("invariant", "heads.inverse_and_adjoint", equations=OPS["heads"].equations,
       given={"case": S.heads_cases()},
       examples=lambda _: lambda caps: [{"case": c} for c in S.fixed_cases(S.heads_cases)])
def merge_heads_inverts_and_is_adjoint_of_split_heads(impl, case):
    """merge_heads(split_heads(x)) == x and <split(x), y> == <x, merge(y)>; inputs untouched
    and float32 kept."""
    require(inv.heads_identities(impl, *case))


_ATTENTION_FORWARD = ("attention.qkv", "attention.scores", "attention.context",
                      "attention.output")


@on_family("attention_bias_mask", "permutation_and_key_bias", equations=_ATTENTION_FORWARD)
def attention_is_permutation_equivariant_and_ignores_b_k(impl, case):
    """Without positions, permuting the sequence (and its mask) permutes the output; and b_k
    shifts every score of a row by the same q_i . b_k, which softmax ignores (the permutation
    and the other b_k from the case's seed)."""
    x, n_heads, mask = case.inputs["x"], case.fixed["n_heads"], case.fixed["mask"]
    rng = np.random.default_rng(case.seed)
    perm = rng.permutation(x.shape[1])
    other_b_k = rng.uniform(-2.0, 2.0, case.inputs["b_k"].shape)
    require(inv.attention_permutation_equivariant(impl, case.inputs, n_heads, mask, perm)
            + inv.attention_ignores_key_bias(impl, case.inputs, n_heads, mask, other_b_k,
                                             case.dout))


@on_family("attention_causal", "causal", equations=("attention.causal", "attention.scores"))
def attention_is_causal(impl, case):
    """Changing the tokens after position t leaves the outputs up to t unchanged, for every t
    (with the implementation's own biases, key mask and output projection)."""
    noise = np.random.default_rng(case.seed).uniform(-2.0, 2.0, case.inputs["x"].shape)
    require(inv.attention_is_causal(impl, case.inputs, case.fixed["n_heads"],
                                    case.fixed["mask"], noise))


@on_family("attention_nobias_mask", "padding_ignored", equations=_ATTENTION_FORWARD)
def attention_ignores_padded_keys(impl, case):
    """Changing the tokens at masked key positions leaves every unpadded output unchanged."""
    noise = np.random.default_rng(case.seed).uniform(-2.0, 2.0, case.inputs["x"].shape)
    require(inv.attention_padding_ignored(impl, case.inputs, case.fixed["n_heads"],
                                          case.fixed["mask"], noise))


@on_family("attention_nobias", "scaled_by_sqrt_d_k", equations=("attention.scores",))
def attention_scores_are_scaled_by_sqrt_d_k(impl, case):
    """Two heads with head 1 zeroed equal one head whose W_q carries sqrt(H / d_k): the scores
    are scaled by 1/sqrt(d_k), not 1/sqrt(H) (H even)."""
    assume(case.inputs["x"].shape[-1] % 2 == 0)
    require(inv.attention_scaled_by_sqrt_d_k(impl, case.inputs))


def _block_keywords(case) -> dict:
    """The block keywords a case passes (its form when not the standard one) and its eps."""
    return {"eps": case.fixed["eps"],
            **{k: case.fixed[k] for k in S.BLOCK_KEYWORDS if k in case.fixed}}


def _block_families(test) -> tuple[str, ...]:
    return tuple(f.name for f in S.families() if f.op == "block" and test(f))


def _block_case(case):
    """A block case's x, parameters p, fixed keywords and the noise its invariants add to x."""
    p = {k: v for k, v in case.inputs.items() if k != "x"}
    x = case.inputs["x"]
    return x, p, case.fixed, np.random.default_rng(case.seed).uniform(-2.0, 2.0, x.shape)


@on_family("block_nobias_mask", "padding_ignored", equations=("block.postln",))
def block_ignores_padded_keys(impl, case):
    """Changing the tokens at masked key positions leaves every unpadded output of the block,
    in its family's form, unchanged, and the gradients are keyed like p: a block that drops
    its mask in the forward and the backward alike agrees with its own finite differences,
    so only this (or the oracle) sees it."""
    x, p, f, noise = _block_case(case)
    require(inv.block_identities(impl, x, p, f["n_heads"], f["mask"], case.dout, noise,
                                 **_block_keywords(case)))


def block_form_is_causal(impl, case):
    """Changing the tokens after position t leaves the block's outputs up to t unchanged, for
    every t: a causal block that attends to later tokens in its forward and backward alike
    agrees with its own finite differences."""
    x, p, f, noise = _block_case(case)
    require(inv.block_is_causal(impl, x, p, f["n_heads"], f["mask"], noise,
                                **_block_keywords(case)))


# every other masked block family (block_nobias_mask's is registered above, under its former
# id), and every family of a causal block: each declared form of a block is held to its mask
# and causality
for _name in _block_families(lambda f: f.name.endswith("_mask")
                             and f.name != "block_nobias_mask"):
    on_family(_name, "padding_ignored", by_family=True)(block_ignores_padded_keys)
for _name in _block_families(lambda f: dict(f.needs).get("block.causal") is True):
    on_family(_name, "causal", by_family=True)(block_form_is_causal)


# A per-token constant c at the input of every LayerNorm the block's form lets it reach, and a
# per-query constant on every logit of an attention row, leave the block's output unchanged in
# exact arithmetic: LayerNorm subtracts its row's mean (RMSNorm does not: not shifted), softmax
# ignores a constant added to its row (a key bias b_k + B adds q_i . B to each logit of row i;
# RoPE turns each key's B by its position: not shifted).  In float32 a one-pass variance
# E[x^2] - E[x]^2 loses ~eps32 c^2 of the variance (>> sigma^2: garbage or NaN), and an exp
# without the row max subtracted overflows past 88: the stability bugs of the kernels inside a
# block, which the block's cases (inputs ~1) never reach.  The correct code's float32 error is
# float32 rounding of terms of size c (or of the shifted logits), amplified by the
# normalisations after them: F32_VS_F64_ATOL times c (B where only the key bias is shifted)
# times S.block_norm_amplification.  Measured on the reference (60 drawn cases of each of the
# 24 block families a shift reaches, ~1,250 cases): its float32 error is at most 0.11 of that
# allowance; the one-pass variance exceeds it in 84-100% of each family's cases (NaN in most;
# c = 3e3 killed as few as 84% where 3e4 killed 97%: hence 3e4), the unshifted exp gives NaN
# in 94-100% (B = 300: row shifts |q_i . B| / sqrt(d_k) of 120-2,000, median 840, over 300
# cases -- past float32's exp range, yet well inside the -1e4 some code fills masked logits
# with; B = 1e3 reached 9,100).  The check runs each family's fixed-seed cases,
# on which both bugs are red wherever a shift reaches them (tests/suite/test_block_stability.py):
# ~5 ms per family.
_LARGE_MEAN = 3e4
_LARGE_KEY_BIAS = 300.0


def _shift(p: dict, name: str, by, shifted: dict) -> None:
    p[name] = p[name] + by
    shifted[name] = float(np.max(np.abs(by)))


def block_at_large_mean_and_logits(case):
    """(the case with large constants its form's output ignores, the offset its output carries,
    {what was shifted: by how much}).  Pre-LN: x + c per token (LN1(x + c) = LN1(x), so the
    stream carries c to LN2 and LN_f; the output is block(x) + c without LN_f).  Post- and
    inner-LN: the attention's output bias + c (its value bias without W_o: attention rows sum
    to 1) and the FFN's output bias + c, each reaching the LayerNorm after it.  Any form: a key
    bias + B (+-B per feature) without RoPE."""
    f, p = case.fixed, dict(case.inputs)
    form = {k: f.get(k, S.BLOCK_STANDARD[k]) for k in ("norm", "normalization", "rope")}
    rng = np.random.default_rng(case.seed)
    x, offset, shifted = p["x"], 0.0, {}
    if form["normalization"] == "layernorm":
        if form["norm"] in ("pre", "pre_final"):
            c = _LARGE_MEAN * rng.choice([-1.0, 1.0], size=x.shape[:-1] + (1,))
            _shift(p, "x", c, shifted)
            offset = c if form["norm"] == "pre" else 0.0
        else:
            c = _LARGE_MEAN * rng.choice([-1.0, 1.0])
            for name in ("attn.b_o" if "attn.W_o" in p else "attn.b_v", "ffn.b_2",
                         "swiglu.b_2"):
                if name in p:
                    _shift(p, name, c, shifted)
    if "attn.b_k" in p and form["rope"] is None:
        _shift(p, "attn.b_k", _LARGE_KEY_BIAS * rng.choice([-1.0, 1.0], size=x.shape[-1]),
               shifted)
    return S.OpCase(p, f, case.dout, case.seed), offset, shifted


def block_is_stable_at_large_mean_and_logits(impl, family):
    """On the family's fixed-seed cases with large constants the block's output ignores
    (block_at_large_mean_and_logits): a per-token constant reaching each LayerNorm, a key bias
    shifting each attention row's logits.  The float32 run agrees with the float64 run on the
    same float32-rounded inputs, to float32 rounding of those constants: a one-pass variance
    or an exp without the row max subtracted is far off, or NaN."""
    from minibert_spec.protocol import NotApplicable

    forward, _ = family.bind(impl)
    ran = []
    for case in family.examples(capabilities(impl)):
        stressed, offset, shifted = block_at_large_mean_and_logits(case)
        if not shifted or (family.f32_ok is not None and not family.f32_ok(case)):
            continue
        case32 = cast_case(stressed, np.float32)
        case64 = cast_case(case32, np.float64)
        out64 = forward(**case64.inputs, **case64.fixed)[0]
        out32 = forward(**case32.inputs, **case32.fixed)[0]
        # rounding of terms of the size of the largest constant, amplified by the norms after it
        scale = max(max_abs(np.asarray(out64) - offset),
                    max(shifted.values()) * S.block_norm_amplification(case))
        what = ", ".join(f"{k} + {v:g}" for k, v in shifted.items())
        assert_f32_close(out32, out64, scale, f"{family.name}: forward at {what} (a constant "
                         "the output ignores in exact arithmetic), float32 vs float64",
                         offset=offset)
        ran.append(case)
    if not ran:
        raise NotApplicable(f"not applicable: {family.name} as declared does not claim a "
                            "LayerNorm a constant reaches (RMSNorm is not shift-invariant; "
                            "post- and inner-LN need an output bias) nor a key bias without "
                            "RoPE: no constant it ignores")


def _kernel_equations(family) -> tuple[str, ...]:
    """The kernels' forward equations a block family's shifts reach (the mutation matrix tags
    the check with them): LayerNorm's but under RMSNorm, softmax's where a key bias may be
    drawn and no RoPE turns it.  None (LLaMA's block): the family gets no such check."""
    needs = dict(family.needs)
    layernorm = needs.get("block.normalization") != "rmsnorm"
    softmax = "attention.rope" not in needs and family.cases.keywords.get("bias") is not False
    return ("layernorm.forward",) * layernorm + ("softmax.forward",) * softmax


for _family in (f for f in S.families() if f.op == "block" and _kernel_equations(f)):
    check("invariant", f"{_family.name}.large_mean_and_logits_float32",
          cases=[("", {"family": _family})], ops=("block",),
          equations=tuple(e for e in _family.equations if "backward" not in e)
          + _kernel_equations(_family), needs=dict(_family.needs),
          quick=True)(block_is_stable_at_large_mean_and_logits)


@on_family("cross_entropy_mean", "sum_is_n_times_mean",
           equations=("loss.ce.mean", "loss.ce.sum", "loss.ce.backward.mean",
                      "loss.ce.backward.sum"))
def cross_entropy_sum_is_n_times_mean(impl, case):
    """The summed loss is N times the mean over the N predicted positions (and its gradient
    too); ignored positions get exactly zero gradient; logits + 800 give the same loss."""
    logits, labels, ignore = (case.inputs["logits"], case.fixed["labels"],
                              case.fixed["ignore_index"])
    require(inv.cross_entropy_identities(impl, logits, labels, case.dout, ignore)
            + inv.cross_entropy_shift_invariant(impl, logits, labels, 800.0, ignore))


@on_family("linear_cross_entropy_mean", "composition-mean",
           equations=OPS["linear_cross_entropy"].equations)
@on_family("linear_cross_entropy_sum", "composition-sum",
           equations=OPS["linear_cross_entropy"].equations)
def linear_cross_entropy_is_linear_then_cross_entropy(impl, case):
    """The fused head equals the linear map followed by the cross-entropy, loss and every
    gradient."""
    f = case.fixed
    require(inv.linear_cross_entropy_is_the_composition(
        impl, *case.inputs.values(), f["labels"], f["reduction"], case.dout, f["ignore_index"]))


@on_family("mse", "target_gradient", equations=("loss.mse.backward",))
def mse_target_gradient_is_minus_prediction_gradient(impl, case):
    """dy = -dy_hat; loss >= 0, 0 at y_hat = y, symmetric."""
    require(inv.mse_identities(impl, case.inputs["y_hat"], case.inputs["y"], case.dout))


@on_family("gelu_erf", "odd_part", equations=("gelu.forward.erf", "gelu.forward.tanh"),
           given={"tanh": st.booleans()}, example=[{"tanh": False}, {"tanh": True}])
def gelu_odd_part_is_identity(impl, case, tanh):
    """GELU(x) - GELU(-x) = x (the odd part of x Phi(x) is x / 2, twice)."""
    require(inv.gelu_identities(impl, case.inputs["x"], "tanh" if tanh else "none", case.dout))


@on_family("token_type", "scatter_adds", equations=("token_type.backward",))
def token_type_gradient_scatter_adds_per_segment(impl, case):
    """dW_type[s] sums the upstream gradient over the positions of segment s."""
    require(inv.token_type_identities(impl, case.inputs["x"], case.fixed["type_ids"],
                                      case.inputs["W_type"], case.dout))


@on_family("embedding_ln", "column_sums", equations=("embedding_ln.backward",))
def embedding_ln_tables_share_column_sums(impl, case):
    """The three tables' gradients have the same total (each position feeds each table once)."""
    require(inv.embedding_ln_identities(impl, case.inputs, case.fixed["ids"],
                                        case.fixed["type_ids"], case.dout,
                                        **{k: v for k, v in case.fixed.items() if k == "eps"}))


@on_family("classifier", "gradient_only_at_cls", equations=("classifier.backward",))
def classifier_gradient_only_reaches_cls(impl, case):
    """Only h[:, 0] enters the classifier: dh is exactly 0 at every other position."""
    require(inv.classifier_gradient_only_at_cls(impl, case.inputs, case.dout))


def _expected_cross_entropy(*args):
    # imported when called: importing the loss checks registers them, in the suite's order
    from minibert_spec.suite.checks.losses import expected_cross_entropy

    return expected_cross_entropy(*args)


def _rope_pairs(d: int, convention: str) -> list[tuple[int, int]]:
    # imported when called, as the equations are elsewhere here (SymPy)
    from minibert_spec.equations.rope import pairs

    return pairs(d, convention)


# what an identity a built-in op declares is handed (spec/builtin/): the findings and their
# assertion (minibert_spec.numerics.identities), the eps a norm's code fixes, the losses'
# float64 cross-entropy (minibert_spec.suite.checks.losses), an impl's declared guards and the
# feature pairs a RoPE convention turns (minibert_spec.equations.rope)
HANDED = SimpleNamespace(close=inv.close, holds=inv.holds, exact=inv.exact, require=require,
                         pinned_eps=lambda impl, norm: pinned_eps(capabilities(impl), norm),
                         expected_cross_entropy=_expected_cross_entropy,
                         declared_guards=declared_guards, rope_pairs=_rope_pairs)


def _declared_identity(op: str, identity: Identity) -> None:
    """``@on_family`` for an identity a built-in op declares (spec/builtin/): its check is
    handed :data:`HANDED`, a ``given`` that is a function the drawing kit its families are."""

    def body(impl, case, **kw):
        identity.check(impl, case, HANDED, **kw)

    body.__name__, body.__doc__ = identity.check.__name__, identity.check.__doc__
    body.__wrapped__ = identity.check  # its source: the declaration's def (Check.source)
    options = dict(identity.options)
    if callable(options.get("given")):
        options["given"] = options["given"](KIT)
    on_family(identity.family or op, identity.name, **options)(body)


for _decl in declarations():
    for _identity in _decl.identities:
        _declared_identity(_decl.name, _identity)
