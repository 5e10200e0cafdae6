"""Case families of the BERT ops: GELU, the token-type embedding, the
embeddings' sum and LayerNorm, the MLM head and the classifier."""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from minibert_spec.suite.strategies.kit import (
    OpCase,
    _gamma_beta,
    _lead_shapes,
    _seed,
    arrays,
    batch_seq,
    betas,
    cases,
    fixed_examples,
    gammas,
    sizes,
    token_ids,
    upstream,
    upstream_like,
)
from minibert_spec.suite.strategies.norms import drawn_eps
from minibert_spec.tolerances import LN_MIN_VAR, layernorm_backward_scale

# --------------------------------------------------------------------------- BERT ops
# torch in float64, cast back: torch's own float32 GELU forms 1 + erf(x / sqrt 2) in float32,
# which cancels for x << 0 (relative error ~ u / Phi(x), 3e-4 at x = -4), where the reference
# evaluates Phi in float64 -- on a tensor whose entries are all that small, torch float32 is
# the inaccurate side
_GELU = dict(torch="gelu", torch_float64=True)


@cases("gelu", "erf", approximate="none", omit=("tanh",), **_GELU)
@cases("gelu", "tanh", approximate="tanh", omit=("erf",), **_GELU)
@fixed_examples(lambda rng, approximate: OpCase({"x": rng.standard_normal((2, 3, 4)) * 2},
                                                {"approximate": approximate},
                                                upstream_like(rng, (2, 3, 4))))
@st.composite
def gelu_cases(draw, approximate: str) -> OpCase:
    shape = draw(_lead_shapes()) + (draw(sizes(1, 4)),)
    return OpCase({"x": draw(arrays(shape, -4.0, 4.0))}, {"approximate": approximate},
                  draw(upstream(shape)), draw(_seed()))


def _token_type_example(rng):
    type_ids = np.array([[0, 0, 1, 1, 1], [0, 1, 1, 0, 0]])  # repeated ids; segment 2 unused
    return OpCase({"x": rng.standard_normal((2, 5, 4)), "W_type": rng.standard_normal((3, 4))},
                  {"type_ids": type_ids}, upstream_like(rng, (2, 5, 4)))


@cases("token_type", torch="token_type")
@fixed_examples(_token_type_example)
@st.composite
def token_type_cases(draw) -> OpCase:
    B, T = draw(batch_seq())
    H, n_types = draw(sizes(1, 4)), draw(sizes(1, 3))
    type_ids = draw(token_ids((B, T), n_types))  # repeated segment ids
    return OpCase({"x": draw(arrays((B, T, H))), "W_type": draw(arrays((n_types, H)))},
                  {"type_ids": type_ids}, draw(upstream((B, T, H))), draw(_seed()))


def embedding_ln_smooth(case: OpCase) -> bool:
    """The LayerNorm's input rows (the sum of the three embeddings) have variance >=
    LN_MIN_VAR."""
    p, f = case.inputs, case.fixed
    e = (p["W_word"][f["ids"]] + p["W_pos"][: f["ids"].shape[1]] + p["W_type"][f["type_ids"]])
    return bool(np.min(e.var(axis=-1)) >= LN_MIN_VAR)


def _embedding_ln_example(rng):
    H = 5
    gamma, beta = _gamma_beta(rng, H)
    inputs = {"W_word": rng.standard_normal((6, H)), "W_pos": rng.standard_normal((5, H)),
              "W_type": rng.standard_normal((2, H)), "gamma": gamma, "beta": beta}
    fixed = {"ids": np.array([[0, 3, 3, 1], [3, 2, 0, 4]]),
             "type_ids": np.array([[0, 0, 1, 1], [0, 1, 1, 1]])}
    return OpCase(inputs, fixed, upstream_like(rng, (2, 4, H)))


# a LayerNorm over 2 features has a zero Jacobian (see _BLOCK): gradients through it are
# rounding noise in float32, so the float32-vs-float64 comparison needs H >= 3
@cases("embedding_ln", smooth=embedding_ln_smooth, torch="embedding_ln",
       f32_ok=lambda case: case.inputs["W_word"].shape[1] >= 3, resolve=("layernorm.eps",))
@fixed_examples(_embedding_ln_example)
@st.composite
def embedding_ln_cases(draw, eps: bool | float = True) -> OpCase:
    """eps drawn (layernorm_eps) for a LayerNorm with eps inside the root: an embedding
    LayerNorm that ignores its eps was green at the default 1e-12; otherwise left out (the
    declared form's, with_pinned_eps)."""
    B, T = draw(batch_seq())
    H, V, n_types = draw(sizes(2, 5)), draw(sizes(1, 5)), draw(sizes(1, 3))
    inputs = {"W_word": draw(arrays((V, H))), "W_pos": draw(arrays((T + draw(sizes(0, 2)), H))),
              "W_type": draw(arrays((n_types, H))), "gamma": draw(gammas(H)),
              "beta": draw(betas(H))}
    fixed = {"ids": draw(token_ids((B, T), V)), "type_ids": draw(token_ids((B, T), n_types)),
             **drawn_eps(draw, eps)}
    return OpCase(inputs, fixed, draw(upstream((B, T, H))), draw(_seed()))


def _mlm_head_ln_input(case: OpCase) -> np.ndarray:
    """The head's LayerNorm input act(h W_t + b_t), computed with the protocol's reference ops
    (a filter's computation, never a judgement: the implementation is not called)."""
    from minibert_reference import ops  # the one definition of each op

    p = case.inputs
    z = p["h"] @ p["W_t"] + p["b_t"]
    return ops.gelu_forward(z, "tanh" if case.fixed["activation"] == "gelu_tanh" else "none")[0]


def mlm_head_smooth(case: OpCase) -> bool:
    """The head's LayerNorm input act(h W_t + b_t) has row variance >= LN_MIN_VAR."""
    return bool(np.min(_mlm_head_ln_input(case).var(axis=-1)) >= LN_MIN_VAR)


def _mlm_head_example(rng, activation: str):
    H, V = 4, 7
    gamma, beta = _gamma_beta(rng, H)
    inputs = {"h": rng.standard_normal((2, 3, H)), "W_t": rng.standard_normal((H, H)),
              "b_t": 0.3 * rng.standard_normal(H), "gamma": gamma, "beta": beta,
              "W_word": rng.standard_normal((V, H)), "b_dec": 0.3 * rng.standard_normal(V)}
    return OpCase(inputs, {"activation": activation}, upstream_like(rng, (2, 3, V)))


# GELU's slope (erf form and tanh approximation alike) never exceeds 1.13 (its maximum,
# 1.129, near x = 2.4)
GELU_SLOPE_MAX = 1.13


def _mlm_head_scale(case: OpCase) -> float:
    """The magnitude of the terms the head's backward sums: the LayerNorm rule
    (minibert_spec.tolerances.layernorm_backward_scale) at its LayerNorm -- input act(h W_t + b_t),
    upstream dlogits W_word -- then carried to dh through act' (<= GELU_SLOPE_MAX) and W_t, a
    sum over the H features of each row of W_t.  Without it the float32-vs-float64 invariant
    was red on the reference's own head (h = 0: dh ~1e-10 exact, its float32 rounding 2.9e-6
    against a floor of the gradients' own size; found at 60 examples, seed 7)."""
    p = case.inputs
    dy = np.asarray(case.dout) @ p["W_word"]  # the LayerNorm's upstream  # [..., H]
    ln = layernorm_backward_scale(_mlm_head_ln_input(case), p["gamma"], dy,
                                  case.fixed.get("eps", 1e-12))
    return ln * max(1.0, GELU_SLOPE_MAX * float(np.abs(p["W_t"]).sum(axis=1).max()))


_MLM = dict(smooth=mlm_head_smooth, also=("gelu",), torch="mlm_head",
            backward_scale=_mlm_head_scale,
            f32_ok=lambda case: case.inputs["h"].shape[-1] >= 3)


@cases("mlm_head", "gelu", activation="gelu", resolve=("layernorm.eps",), **_MLM)
@cases("mlm_head", "gelu_tanh", activation="gelu_tanh", resolve=("layernorm.eps",), **_MLM)
@fixed_examples(_mlm_head_example)
@st.composite
def mlm_head_cases(draw, activation: str, eps: bool | float = True) -> OpCase:
    """eps drawn as embedding_ln_cases draws it (drawn_eps)."""
    lead = draw(_lead_shapes(3).filter(len))
    H, V = draw(sizes(2, 4)), draw(sizes(1, 6))
    inputs = {"h": draw(arrays(lead + (H,))), "W_t": draw(arrays((H, H))),
              "b_t": draw(arrays((H,))), "gamma": draw(gammas(H)), "beta": draw(betas(H)),
              "W_word": draw(arrays((V, H))), "b_dec": draw(arrays((V,)))}
    return OpCase(inputs, {"activation": activation, **drawn_eps(draw, eps)},
                  draw(upstream(lead + (V,))), draw(_seed()))


def _classifier_example(rng):
    H, C = 4, 3
    inputs = {"h": rng.standard_normal((2, 3, H)), "W_p": rng.standard_normal((H, H)),
              "b_p": 0.3 * rng.standard_normal(H), "W_c": rng.standard_normal((H, C)),
              "b_c": 0.3 * rng.standard_normal(C)}
    return OpCase(inputs, {}, upstream_like(rng, (2, C)))


@cases("classifier", also=("pooler",), torch="classifier")
@fixed_examples(_classifier_example)
@st.composite
def classifier_cases(draw) -> OpCase:
    B, T = draw(batch_seq())
    H, C = draw(sizes(1, 4)), draw(sizes(1, 4))
    inputs = {"h": draw(arrays((B, T, H))), "W_p": draw(arrays((H, H))),
              "b_p": draw(arrays((H,))), "W_c": draw(arrays((H, C))), "b_c": draw(arrays((C,)))}
    return OpCase(inputs, {}, draw(upstream((B, C))), draw(_seed()))
