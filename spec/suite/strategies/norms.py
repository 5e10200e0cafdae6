"""Case families of linear, LayerNorm, softmax, ReLU and tanh, with their
fixed-seed examples, and the LayerNorm eps draws the composites reuse (``layernorm_eps``,
``drawn_eps``)."""

from __future__ import annotations

from hypothesis import strategies as st

from minibert_spec.protocol.variants import eps_of
from minibert_spec.suite.strategies.kit import (
    OpCase,
    _away_from_zero,
    _gamma_beta,
    _lead_shapes,
    _seed,
    arrays,
    betas,
    cases,
    fixed_examples,
    gammas,
    layernorm_inputs,
    relu_inputs,
    reused,
    row_masks,
    sizes,
    upstream,
    upstream_like,
)
from minibert_spec.tolerances import layernorm_backward_scale


# --------------------------------------------------------------------------- linear / LN
def _linear_example(rng, bias: bool):
    x, W, b = rng.standard_normal((2, 3, 4)), rng.standard_normal((4, 5)), rng.standard_normal(5)
    return OpCase({"x": x, "W": W, "b": b if bias else None}, {},
                  upstream_like(rng, (2, 3, 5)))


@cases("linear", "bias", bias=True, torch="linear")
@cases("linear", "nobias", bias=False, omit=("db",), torch="linear")
@fixed_examples(_linear_example)
@st.composite
def linear_cases(draw, bias: bool) -> OpCase:
    lead = draw(_lead_shapes())
    n_in, n_out = draw(sizes(1, 4)), draw(sizes(1, 4))
    inputs = {"x": draw(arrays(lead + (n_in,))), "W": draw(arrays((n_in, n_out))),
              "b": draw(arrays((n_out,))) if bias else None}
    return OpCase(inputs, {}, draw(upstream(lead + (n_out,))), draw(_seed()))


@reused
def layernorm_eps() -> st.SearchStrategy[float]:
    """LayerNorm eps from 1e-12 (BERT checkpoints) to 1e-3, the ends and 1e-5 (torch's default)
    included: an eps outside the square root is invisible at 1e-12 and plain at 1e-3."""
    return st.one_of(st.sampled_from([1e-12, 1e-5, 1e-3]),
                     st.floats(-12.0, -3.0).map(lambda e: float(10.0 ** e)))


def drawn_eps(draw, eps: bool | float) -> dict:
    """A composite's LayerNorm eps as its case passes it: drawn (layernorm_eps) where the
    implementation's LayerNorm takes eps inside the root (``layernorm.eps`` True), else left
    out: the declared form's (a fixed number is passed by with_pinned_eps)."""
    return {"eps": draw(layernorm_eps())} if eps is True else {}


def _layernorm_example(rng, affine: bool = True, eps: bool | float = True):
    x = rng.standard_normal((2, 3, 6)) * 2 + 1
    gamma, beta = _gamma_beta(rng, 6)
    return OpCase({"x": x, "gamma": gamma if affine else None, "beta": beta if affine else None},
                  {"eps": eps_of(eps, 1e-12)}, upstream_like(rng, (2, 3, 6)))


def _layernorm_scale(case: OpCase) -> float:
    return layernorm_backward_scale(case.inputs["x"], case.inputs["gamma"], case.dout,
                                    case.fixed["eps"])


# N = 2: x_hat = +-sqrt(1 - eps / sigma^2) whatever x, so dx is eps-sized (0 at eps = 0): in
# float32 it is rounding noise of the terms that cancelled -- compared in float64 only
_LN = dict(torch="layernorm", backward_scale=_layernorm_scale,
           f32_ok=lambda case: case.inputs["x"].shape[-1] >= 3)


@cases("layernorm", needs={"layernorm.affine": True}, resolve=("layernorm.eps",),
       omit=("layernorm.plain",), **_LN)
# the affine-free family checks dgamma and dbeta too: that they come back None
@cases("layernorm", "plain", needs={"layernorm.affine": False}, resolve=("layernorm.eps",),
       **_LN)
@fixed_examples(_layernorm_example)
@st.composite
def layernorm_cases(draw, gamma_margin: float = 0.0, affine: bool = True,
                    eps: bool | float = True) -> OpCase:
    """``affine`` False: gamma = beta = None (the variant without the affine map); ``eps``
    False: eps = 0 (rows keep variance >= LN_MIN_VAR, so 1/sqrt(var) stays moderate); a
    number: that eps, the one the code fixes (minibert_spec.protocol.variants.eps_of)."""
    lead = draw(_lead_shapes())
    N = draw(sizes(2, 6))
    inputs = {"x": draw(layernorm_inputs(lead + (N,))),
              "gamma": draw(gammas(N, gamma_margin)) if affine else None,
              "beta": draw(betas(N)) if affine else None}
    fixed = eps_of(eps, None)
    return OpCase(inputs, {"eps": draw(layernorm_eps()) if fixed is None else fixed},
                  draw(upstream(lead + (N,))), draw(_seed()))


# --------------------------------------------------------------------------- softmax
def _softmax_example(rng, masked: bool):
    x = rng.standard_normal((2, 3, 5)) * 2
    mask = rng.random((2, 3, 5)) < 0.6
    mask[..., 0] = True
    return OpCase({"x": x}, {"mask": mask} if masked else {}, upstream_like(rng, (2, 3, 5)))


@cases("softmax", masked=False, torch="softmax")
@cases("softmax", "masked", masked=True, torch="softmax")
@fixed_examples(_softmax_example)
@st.composite
def softmax_cases(draw, masked: bool) -> OpCase:
    shape = draw(_lead_shapes()) + (draw(sizes(1, 5)),)
    fixed = {"mask": draw(row_masks(shape))} if masked else {}
    return OpCase({"x": draw(arrays(shape, -3.0, 3.0))}, fixed, draw(upstream(shape)),
                  draw(_seed()))


@cases("relu", torch="relu")
@fixed_examples(lambda rng: OpCase({"x": _away_from_zero(rng, (2, 3, 4))}, {},
                                   upstream_like(rng, (2, 3, 4))))
@st.composite
def relu_cases(draw) -> OpCase:
    shape = draw(_lead_shapes()) + (draw(sizes(1, 4)),)
    return OpCase({"x": draw(relu_inputs(shape))}, {}, draw(upstream(shape)), draw(_seed()))


@cases("tanh", torch="tanh")
@fixed_examples(lambda rng: OpCase({"x": rng.standard_normal((2, 3, 4))}, {},
                                   upstream_like(rng, (2, 3, 4))))
@st.composite
def tanh_cases(draw) -> OpCase:
    shape = draw(_lead_shapes()) + (draw(sizes(1, 4)),)
    return OpCase({"x": draw(arrays(shape))}, {}, draw(upstream(shape)), draw(_seed()))
