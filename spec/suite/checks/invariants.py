"""Mathematical invariants of the op pairs and the model (no finite differences).

Generic, for every case family (registered with ``@cases`` in spec/suite/strategies.py): a
zero upstream gives exactly zero gradients; a backward is linear in its upstream gradient; two
identical calls are bit-identical and leave their inputs untouched; the float32 path agrees
with the float64 path.  Then op-specific identities that hold in exact arithmetic, and the
model's gradient bookkeeping.
"""

from __future__ import annotations

import functools

import numpy as np
from hypothesis import assume
from hypothesis import strategies as st

from reference.config import PRESETS
from spec.numerics import identities as inv
from spec.numerics.fdcheck import assert_f32_close, max_abs, run_op
from spec.numerics.finite_differences import random_batch, random_params
from spec.numerics.identities import require
from spec.protocol import OPS, capabilities
from spec.suite import strategies as S
from spec.suite.checks.fd import FAMILIES, draw_case, family_cases, family_needs
from spec.suite.registry import check
from spec.tolerances import F64_IDENTITY_RTOL

# bert_base (110M parameters) is out of reach of float64 identities here
SMALL_PRESETS = sorted(p for p in PRESETS if p != "bert_base")


def _zeros_like(dout):
    return np.zeros_like(dout) if isinstance(dout, np.ndarray) else 0.0


def _copy(value):
    return value.copy() if isinstance(value, np.ndarray) else value


def _to32(value):
    if isinstance(value, np.ndarray) and value.dtype == np.float64:
        return value.astype(np.float32)
    return value


def _to64(value):
    if isinstance(value, np.ndarray) and value.dtype == np.float32:
        return value.astype(np.float64)
    return value


def _bits(a):
    return None if a is None else (np.asarray(a).dtype, np.asarray(a).shape,
                                   np.asarray(a).tobytes())


def _family_check(name):
    """@check("invariant", "<name>") over every case family, drawing one case per example."""
    return check("invariant", name, cases=family_cases(),
                 equations=lambda kw: kw["family"].equations,
                 ops=lambda kw: (kw["family"].op,), given={"data": st.data()},
                 needs=family_needs)


# --------------------------------------------------------------------------- every op
@_family_check("zero_upstream")
def zero_upstream_gives_exactly_zero_gradients(impl, family, data):
    """A zero upstream gradient gives exactly zero gradients."""
    case = draw_case(impl, family, data)
    _, grads = run_op(impl, family, case, dout=_zeros_like(case.dout))
    for name, g in zip(case.inputs, grads):
        if g is not None and not np.all(g == 0):
            idx = tuple(int(i) for i in np.argwhere(g != 0)[0])
            raise AssertionError(f"{family.name}: d{name}{list(idx)} = {g[idx]!r} for a zero "
                                 "upstream gradient (expected exactly 0)")


@_family_check("linear_in_upstream")
def backward_is_linear_in_upstream(impl, family, data):
    """backward(a d1 + b d2) == a backward(d1) + b backward(d2), to float64 rounding relative to
    the largest term of the op's gradients (entries that cancel to ~0, like the key bias's,
    carry rounding of the size of the terms that cancelled), and never below rounding of the
    upstream gradient times the inputs: a gradient that is ~0 in every call (a LayerNorm over
    two features: x_hat = +-1 whatever x, so dx ~ eps-sized) is a cancellation of terms of that
    size, not of its own."""
    case = draw_case(impl, family, data)
    if isinstance(case.dout, np.ndarray):
        d2 = data.draw(S.upstream(case.dout.shape), label="d2")
    else:
        d2 = data.draw(S.scalar_upstream(), label="d2")
    a, b = data.draw(S.away_from_zero(0.1), label="a"), data.draw(S.away_from_zero(0.1), label="b")
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


@_family_check("bit_identical_and_pure")
def identical_calls_are_bit_identical_and_pure(impl, family, data):
    """Two identical calls give the same bits and leave every input untouched."""
    case = draw_case(impl, family, data)
    before = {k: _copy(v) for k, v in {**case.inputs, **case.fixed}.items()}
    dout_before = _copy(case.dout)
    out1, g1 = run_op(impl, family, case)
    out2, g2 = run_op(impl, family, case)
    assert _bits(out1) == _bits(out2), f"{family.name}: forward output differs between calls"
    for name, x, y in zip(case.inputs, g1, g2):
        assert _bits(x) == _bits(y), f"{family.name}: d{name} differs between identical calls"
    for k, v in {**case.inputs, **case.fixed}.items():  # no input mutated in place
        assert _bits(v) == _bits(before[k]) if isinstance(v, np.ndarray) else v == before[k], (
            f"{family.name}: input {k} was modified in place")
    assert _bits(case.dout) == _bits(dout_before), f"{family.name}: dout was modified in place"


@_family_check("float32_vs_float64")
def float32_path_agrees_with_float64(impl, family, data):
    """Same code, float32 inputs: outputs and gradients stay float32 (no silent casts) and agree
    with the float64 run on the same float32-rounded inputs to float32 precision."""
    case = draw_case(impl, family, data)
    if family.f32_ok is not None:
        assume(family.f32_ok(case))
    case32 = S.OpCase({k: _to32(v) for k, v in case.inputs.items()}, case.fixed,
                      _to32(case.dout), case.seed)
    case64 = S.OpCase({k: _to64(v) for k, v in case32.inputs.items()}, case.fixed,
                      _to64(case32.dout), case.seed)
    out64, g64 = run_op(impl, family, case64)
    out32, g32 = run_op(impl, family, case32)
    assert_f32_close(out32, out64, max_abs(out64), f"{family.name}: forward")
    scale = max_abs(*g64)
    for name, x, y in zip(case.inputs, g32, g64):
        if y is None:
            assert x is None, f"{family.name}: d{name} is None in float64 only"
            continue
        assert_f32_close(x, y, scale, f"{family.name}: d{name}")


# --------------------------------------------------------------------------- op-specific
# The identities are spec.numerics.identities' (shared with ``minibert check``); here they get drawn
# inputs.  Equation marks come from the protocol's op table.
@check("invariant", "embedding.scatter_adds", equations=("embedding.backward",),
       given={"case": S.embedding_cases()})
def embedding_backward_sums_repeated_ids(impl, case):
    """dW[v] accumulates dout of every position holding id v (ids repeat by construction)."""
    require(inv.embedding_scatter_adds(impl, case.fixed["ids"], case.inputs["W"], case.dout))


@check("invariant", "softmax.rows_sum_to_one", equations=("softmax.forward",),
       given={"case": S.softmax_cases(masked=True), "shift": S.floats(-5.0, 5.0)})
def softmax_rows_sum_to_one_masked_exactly_zero_and_shift_invariant(impl, case, shift):
    """Rows sum to 1, masked entries are exactly 0, adding a constant to a row changes
    nothing."""
    x, mask = case.inputs["x"], case.fixed["mask"]
    require(inv.softmax_identities(impl, x, mask, case.dout)
            + inv.softmax_shift_invariant(impl, x, mask, shift))


@check("invariant", "softmax.stable_far_from_zero", equations=("softmax.forward",),
       given={"case": S.softmax_cases(masked=True),
              "shift": st.one_of(S.floats(720.0, 1000.0), S.floats(-1000.0, -750.0))})
def softmax_is_stable_far_from_zero(impl, case, shift):
    """Logits near +-1000: exp overflows above ~709 and underflows below ~-745, so an unshifted
    softmax returns NaN."""
    require(inv.softmax_shift_invariant(impl, case.inputs["x"], case.fixed["mask"], shift))


@check("invariant", "layernorm.normalises", equations=("layernorm.forward",),
       given={"data": st.data(), "scale": S.floats(0.25, 4.0), "shift": S.floats(-3.0, 3.0)})
def layernorm_normalises_and_ignores_row_affine_maps(impl, data, scale, shift):
    """Normalised rows (mean 0, variance 1 before the affine map, if any); x and a x + c give
    the same output and the backward's invariances hold."""
    variant = S.variant_kwargs("layernorm", {}, ("layernorm.affine", "layernorm.eps"),
                               capabilities(impl))
    case = data.draw(S.layernorm_cases(gamma_margin=0.1, **variant), label="case")
    x, gamma, beta = case.inputs["x"], case.inputs["gamma"], case.inputs["beta"]
    require(inv.layernorm_normalises(impl, x, gamma, beta, scale, shift)
            + inv.layernorm_backward_invariances(impl, x, gamma, beta, case.dout))


@check("invariant", "heads.inverse_and_adjoint", equations=OPS["heads"].equations,
       given={"data": st.data()})
def merge_heads_inverts_and_is_adjoint_of_split_heads(impl, data):
    """merge_heads(split_heads(x)) == x and <split(x), y> == <x, merge(y)>."""
    (B, T), (A, d_k) = data.draw(S.batch_seq()), data.draw(S.head_dims())
    x = data.draw(S.arrays((B, T, A * d_k)))
    y = data.draw(S.arrays((B, A, T, d_k)))
    require(inv.heads_identities(impl, x, y, A))


@check("invariant", "attention.permutation_and_key_bias",
       equations=("attention.qkv", "attention.scores", "attention.context", "attention.output"),
       given={"case": S.attention_cases(bias=True, masked=True), "data": st.data()},
       needs=dict(FAMILIES["attention_bias_mask"].needs))
def attention_is_permutation_equivariant_and_ignores_b_k(impl, case, data):
    """Without positions, permuting the sequence (and its mask) permutes the output; and b_k
    shifts every score of a row by the same q_i . b_k, which softmax ignores."""
    x, n_heads, mask = case.inputs["x"], case.fixed["n_heads"], case.fixed["mask"]
    perm = np.array(data.draw(st.permutations(range(x.shape[1])), label="perm"))
    other_b_k = data.draw(S.arrays(case.inputs["b_k"].shape), label="b_k")
    require(inv.attention_permutation_equivariant(impl, case.inputs, n_heads, mask, perm)
            + inv.attention_ignores_key_bias(impl, case.inputs, n_heads, mask, other_b_k,
                                           case.dout))


@check("invariant", "attention.causal", equations=("attention.causal", "attention.scores"),
       given={"data": st.data()}, needs={"attention.causal": True})
def attention_is_causal(impl, data):
    """Changing the tokens after position t leaves the outputs up to t unchanged, for every t
    (with the implementation's own biases, key mask and output projection)."""
    case = data.draw(FAMILIES["attention_causal"].strategy_for(capabilities(impl)),
                     label="case")
    noise = data.draw(S.arrays(case.inputs["x"].shape), label="noise")
    require(inv.attention_is_causal(impl, case.inputs, case.fixed["n_heads"],
                                    case.fixed["mask"], noise))


@check("invariant", "cross_entropy.sum_is_n_times_mean",
       equations=("loss.ce.mean", "loss.ce.sum", "loss.ce.backward.mean", "loss.ce.backward.sum"),
       given={"case": S.cross_entropy_cases("mean")}, needs={"cross_entropy.ignore_index": True})
def cross_entropy_sum_is_n_times_mean(impl, case):
    """The summed loss is N times the mean over the N predicted positions (and its gradient
    too); ignored positions get exactly zero gradient."""
    require(inv.cross_entropy_identities(impl, case.inputs["logits"], case.fixed["labels"],
                                       case.dout))


@check("invariant", "linear_cross_entropy.composition",
       cases=[(r, {"reduction": r}) for r in ("mean", "sum")],
       equations=OPS["linear_cross_entropy"].equations, given={"data": st.data()})
def linear_cross_entropy_is_linear_then_cross_entropy(impl, reduction, data):
    """The fused head equals the linear map followed by the cross-entropy, loss and every
    gradient."""
    case = data.draw(S.linear_cross_entropy_cases(reduction), label="case")
    require(inv.linear_cross_entropy_is_the_composition(
        impl, *case.inputs.values(), case.fixed["labels"], reduction, case.dout))


@check("invariant", "mse.target_gradient", equations=("loss.mse.backward",),
       given={"case": S.mse_cases()})
def mse_target_gradient_is_minus_prediction_gradient(impl, case):
    """dy = -dy_hat."""
    require(inv.mse_identities(impl, case.inputs["y_hat"], case.inputs["y"], case.dout))


# --------------------------------------------------------------------------- the model
PRESET_NAMES = SMALL_PRESETS
DTYPES = [np.float32, np.float64]


@functools.cache
def _random_params(impl, preset, seed):
    return random_params(impl, PRESETS[preset](), seed)


def _model_inputs(impl, preset, dtype, B=2, T=6, seed=0):
    """Random float64 params (gamma != 1, biases != 0) cast to ``dtype``, and a padded batch."""
    config = PRESETS[preset]()
    params = {k: v.astype(dtype) for k, v in _random_params(impl, preset, seed).items()}
    batch = random_batch(config, B, T, seed)
    kw = dict(attention_mask=batch["attention_mask"])
    if config.head == "mlm":
        kw["labels"] = batch["labels"]
    else:
        kw["targets"] = batch["targets"].astype(dtype)
    if "token_type_ids" in batch:
        kw["token_type_ids"] = batch["token_type_ids"]
    return config, params, batch["input_ids"], kw


@check("invariant", "model.gradient_bookkeeping",
       cases=[(f"{p}-{np.dtype(d).name}", {"preset": p, "dtype": d})
              for p in PRESET_NAMES for d in DTYPES], ops=("model",))
def model_grads_match_params_keys_shapes_dtypes(impl, preset, dtype):
    """Gradients have exactly the parameters' keys, shapes and dtypes, are finite, and every
    tensor takes part in the loss (a name mismatch that zeroes a gradient fails)."""
    config, params, ids, kw = _model_inputs(impl, preset, dtype)
    assert set(params) == set(impl.param_shapes(config)), (
        f"init_params keys differ from param_shapes: "
        f"{sorted(set(params) ^ set(impl.param_shapes(config)))}")
    require(inv.model_gradient_bookkeeping(impl, params, config, ids, kw)[:2])
    loss, grads, d_emb = impl.loss_and_grads(params, config, ids, **kw)
    assert np.asarray(loss).dtype == dtype, f"loss dtype {np.asarray(loss).dtype}, expected {dtype}"
    bad = [k for k, g in grads.items() if not np.all(np.isfinite(g))]
    assert not bad, f"non-finite gradients: {bad[:5]}"
    assert d_emb.shape == ids.shape + (config.hidden,) and d_emb.dtype == dtype, (
        f"d_embeddings {d_emb.shape} {d_emb.dtype}, expected {ids.shape + (config.hidden,)} "
        f"{dtype}")
    # every tensor takes part in the loss: a name mismatch that silently zeroes a gradient fails
    for name, g in grads.items():
        if name != "embeddings.position.W":  # rows >= T are legitimately 0, the rest are not
            assert np.any(g != 0), f"{name}: gradient is identically zero"


@check("invariant", "model.bit_identical_and_pure",
       cases=[(p, {"preset": p}) for p in PRESET_NAMES], ops=("model",))
def model_identical_calls_bit_identical_and_pure(impl, preset):
    """Two identical loss_and_grads calls give the same bits and leave params untouched."""
    config, params, ids, kw = _model_inputs(impl, preset, np.float64)
    before = {k: v.copy() for k, v in params.items()}
    l1, g1, e1 = impl.loss_and_grads(params, config, ids, **kw)
    l2, g2, e2 = impl.loss_and_grads(params, config, ids, **kw)
    assert _bits(l1) == _bits(l2) and _bits(e1) == _bits(e2), (
        f"two identical calls differ: loss {l1!r} vs {l2!r}, or their input gradients")
    for name in g1:
        assert _bits(g1[name]) == _bits(g2[name]), name
    for name, v in params.items():
        assert _bits(v) == _bits(before[name]), f"params[{name!r}] was modified"


@check("invariant", "model.float32_vs_float64",
       cases=[(p, {"preset": p}) for p in PRESET_NAMES], ops=("model",))
def model_float32_agrees_with_float64(impl, preset):
    """float32 params (rounded from the float64 ones) through the same code: logits, loss,
    every gradient and the input gradient agree with the float64 run on those rounded values."""
    config, p32, ids, kw32 = _model_inputs(impl, preset, np.float32)
    p64 = {k: v.astype(np.float64) for k, v in p32.items()}
    kw64 = {k: _to64(v) for k, v in kw32.items()}
    out64, _ = impl.forward(p64, config, ids, kw64["attention_mask"])
    out32, _ = impl.forward(p32, config, ids, kw32["attention_mask"])
    assert_f32_close(out32, out64, max_abs(out64), f"{preset}: forward output")
    l64, g64, e64 = impl.loss_and_grads(p64, config, ids, **kw64)
    l32, g32, e32 = impl.loss_and_grads(p32, config, ids, **kw32)
    assert_f32_close(l32, l64, abs(float(l64)), f"{preset}: loss")
    scale = max_abs(e64, *g64.values())
    for name in g64:
        assert_f32_close(g32[name], g64[name], scale, f"{preset}: d{name}")
    assert_f32_close(e32, e64, scale, f"{preset}: d input_embeddings")


@check("invariant", "model.backward_linear_in_upstream",
       cases=[(p, {"preset": p}) for p in PRESET_NAMES], ops=("model",))
def model_backward_zero_and_linear_in_upstream(impl, preset):
    """backward(0) == 0 exactly and backward is linear in the upstream gradient."""
    config, params, ids, kw = _model_inputs(impl, preset, np.float64)
    out, cache = impl.forward(params, config, ids, kw["attention_mask"])
    rng = np.random.default_rng(7)
    d1, d2 = rng.standard_normal(out.shape), rng.standard_normal(out.shape)
    g0, e0 = impl.backward(np.zeros_like(out), cache)
    nonzero = [k for k, g in g0.items() if np.any(g != 0)] + (["d_embeddings"]
                                                               if np.any(e0 != 0) else [])
    assert not nonzero, f"backward(0) is not 0 for {nonzero[:5]}"
    a, b = 0.7, -1.3
    g1, e1 = impl.backward(d1, cache)
    g2, e2 = impl.backward(d2, cache)
    g12, e12 = impl.backward(a * d1 + b * d2, cache)
    pairs = [(g12[n], a * g1[n] + b * g2[n], np.abs(a * g1[n]) + np.abs(b * g2[n]))
             for n in g1] + [(e12, a * e1 + b * e2, np.abs(a * e1) + np.abs(b * e2))]
    scale = max(float(t.max()) for _, _, t in pairs)
    for got, want, _ in pairs:
        np.testing.assert_allclose(got, want, rtol=0, atol=F64_IDENTITY_RTOL * scale)


@check("invariant", "gelu.odd_part", equations=("gelu.forward.erf", "gelu.forward.tanh"),
       given={"case": S.gelu_cases("none"), "tanh": st.booleans()})
def gelu_odd_part_is_identity(impl, case, tanh):
    """GELU(x) - GELU(-x) = x (the odd part of x Phi(x) is x / 2, twice)."""
    require(inv.gelu_identities(impl, case.inputs["x"], "tanh" if tanh else "none", case.dout))


@check("invariant", "token_type.scatter_adds", equations=("token_type.backward",),
       given={"case": S.token_type_cases()})
def token_type_gradient_scatter_adds_per_segment(impl, case):
    """dW_type[s] sums the upstream gradient over the positions of segment s."""
    require(inv.token_type_identities(impl, case.inputs["x"], case.fixed["type_ids"],
                                    case.inputs["W_type"], case.dout))


@check("invariant", "embedding_ln.column_sums", equations=("embedding_ln.backward",),
       given={"case": S.embedding_ln_cases()})
def embedding_ln_tables_share_column_sums(impl, case):
    """The three tables' gradients have the same total (each position feeds each table once)."""
    require(inv.embedding_ln_identities(impl, case.inputs, case.fixed["ids"],
                                      case.fixed["type_ids"], case.dout))


@check("invariant", "classifier.gradient_only_at_cls", equations=("classifier.backward",),
       given={"case": S.classifier_cases()})
def classifier_gradient_only_reaches_cls(impl, case):
    """Only h[:, 0] enters the classifier: dh is exactly 0 at every other position."""
    require(inv.classifier_gradient_only_at_cls(impl, case.inputs, case.dout))
