"""Reusable Hypothesis strategies for the op and model tests (and, later, the conformance mode).

Everything here is plain NumPy + Hypothesis: no import of ``reference``, so a strategy draws the
same data whatever implementation is under test.  Conventions:

* float64 arrays with explicit bounded ``elements=`` and ``fill=st.nothing()`` (every element
  drawn, no NaN/inf, no subnormals); small sides so element-wise finite differences stay cheap.
* Shapes: B >= 1 and T >= 1 (T = 1 included), d_k = 1 allowed.
* Upstream gradients are random and never all ones (nor constant, which is all-ones rescaled).
* gamma is random and varies across features (never the initial 1), beta is never all 0.
* Non-smooth points are kept out of the sample: ReLU pre-activations at least
  ``KINK_MARGIN`` from 0, LayerNorm rows with variance at least ``LN_MIN_VAR``.
* An op case is an :class:`OpCase`: the differentiable inputs by forward argument name, the
  non-differentiable ones (ids, masks, labels, n_heads), and an upstream gradient.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from hypothesis import assume
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from spec.tolerances import KINK_MARGIN, LN_MIN_VAR

IGNORE_INDEX = -100  # the labels' "not predicted" marker (the ops' default ignore_index)

# Values of inputs and parameters: large enough that softmax is far from uniform, small enough
# that nothing saturates to exact 0/1 in float64.
VALUE_BOUND = 2.0
# Upstream gradients.
DOUT_BOUND = 1.0

MAX_B = 3
MAX_T = 4
MAX_HEADS = 3
MAX_D_K = 3


# --------------------------------------------------------------------------- building blocks
def floats(lo: float = -VALUE_BOUND, hi: float = VALUE_BOUND) -> st.SearchStrategy[float]:
    return st.floats(lo, hi, allow_nan=False, allow_infinity=False, allow_subnormal=False,
                     width=64)


def arrays(shape, lo: float = -VALUE_BOUND, hi: float = VALUE_BOUND,
           elements: st.SearchStrategy | None = None) -> st.SearchStrategy[np.ndarray]:
    """float64 array of ``shape``, every element drawn from a bounded finite strategy."""
    return hnp.arrays(np.float64, tuple(shape),
                      elements=elements if elements is not None else floats(lo, hi),
                      fill=st.nothing())


def away_from_zero(margin: float = KINK_MARGIN, bound: float = VALUE_BOUND):
    """Scalar floats with margin < |v| <= bound."""
    return floats(-bound, bound).filter(lambda v: abs(v) > margin)


def sizes(lo: int = 1, hi: int = 4) -> st.SearchStrategy[int]:
    return st.integers(lo, hi)


@st.composite
def batch_seq(draw, max_B: int = MAX_B, max_T: int = MAX_T) -> tuple[int, int]:
    """(B, T) with B >= 1, T >= 1."""
    return draw(sizes(1, max_B)), draw(sizes(1, max_T))


@st.composite
def head_dims(draw, max_heads: int = MAX_HEADS, max_d_k: int = MAX_D_K) -> tuple[int, int]:
    """(A, d_k) with d_k = 1 allowed; H = A * d_k."""
    return draw(sizes(1, max_heads)), draw(sizes(1, max_d_k))


@st.composite
def upstream(draw, shape) -> np.ndarray:
    """A random upstream gradient: never all ones, never constant (a rescaled all-ones)."""
    d = draw(arrays(shape, -DOUT_BOUND, DOUT_BOUND))
    if d.size > 1:
        assume(np.ptp(d) > 0.1)
    else:
        assume(abs(float(d.flat[0])) > 0.1 and float(d.flat[0]) != 1.0)
    return d


def scalar_upstream() -> st.SearchStrategy[float]:
    """dloss for a scalar loss: not 1, not ~0."""
    return floats(-2.0, 2.0).filter(lambda v: abs(v) > 0.1 and v != 1.0)


@st.composite
def gammas(draw, n: int, margin: float = 0.0) -> np.ndarray:
    """LayerNorm gamma: random, not all ones, varying across features when n > 1 (a backward
    that pulls gamma out of the feature means is only wrong when gamma varies).  ``margin`` > 0
    keeps every |gamma| above it, per element (for tests that divide by gamma): a whole-array
    assume() would reject a large share of draws and trip Hypothesis's filter health check."""
    g = draw(arrays((n,), elements=away_from_zero(margin, 2.0)) if margin > 0
             else arrays((n,), -2.0, 2.0))
    assume(not np.all(g == 1.0))
    if n > 1:
        assume(np.ptp(g) > 0.1)
    return g


@st.composite
def betas(draw, n: int) -> np.ndarray:
    b = draw(arrays((n,), -1.0, 1.0))
    assume(np.any(b != 0.0))
    return b


@st.composite
def layernorm_inputs(draw, shape) -> np.ndarray:
    """Rows (last axis, length >= 2) with variance >= LN_MIN_VAR: LayerNorm is smooth there."""
    x = draw(arrays(shape))
    assume(np.min(x.var(axis=-1)) >= LN_MIN_VAR)
    return x


def relu_inputs(shape) -> st.SearchStrategy[np.ndarray]:
    """Pre-activations at least KINK_MARGIN away from ReLU's kink at 0."""
    return arrays(shape, elements=away_from_zero())


@st.composite
def token_ids(draw, shape, vocab: int) -> np.ndarray:
    """int64 ids in [0, vocab) with at least one repeated id whenever there are two positions
    (a scatter-add that keeps only one of repeated ids is caught)."""
    ids = draw(hnp.arrays(np.int64, tuple(shape), elements=st.integers(0, vocab - 1),
                          fill=st.nothing()))
    if ids.size >= 2:
        i, j = draw(st.lists(st.integers(0, ids.size - 1), min_size=2, max_size=2,
                             unique=True))
        ids.flat[j] = ids.flat[i]
    return ids


@st.composite
def row_masks(draw, shape) -> np.ndarray:
    """bool mask over the last axis, each row with one to all entries True."""
    m = draw(hnp.arrays(np.bool_, tuple(shape), elements=st.booleans(), fill=st.nothing()))
    rows = m.reshape(-1, shape[-1])
    for r in range(rows.shape[0]):
        if not rows[r].any():
            rows[r, draw(st.integers(0, shape[-1] - 1))] = True
    return rows.reshape(shape)


def key_masks(B: int, T: int) -> st.SearchStrategy[np.ndarray]:
    """Attention key-padding mask [B, T]: True = may be attended; >= 1 per sequence."""
    return row_masks((B, T))


@st.composite
def ce_labels(draw, shape, vocab: int, ignore_index: int = IGNORE_INDEX) -> np.ndarray:
    """Labels in [0, vocab) at one to all positions, ``ignore_index`` elsewhere."""
    predicted = draw(hnp.arrays(np.bool_, tuple(shape), elements=st.booleans(),
                                fill=st.nothing()))
    if not predicted.any():
        predicted.flat[draw(st.integers(0, predicted.size - 1))] = True
    labels = draw(hnp.arrays(np.int64, tuple(shape), elements=st.integers(0, vocab - 1),
                             fill=st.nothing()))
    return np.where(predicted, labels, ignore_index)


# --------------------------------------------------------------------------- op cases
@dataclass
class OpCase:
    """One input of an op pair.

    inputs: differentiable inputs by forward argument name (None = optional input left out),
            in the order the backward returns their gradients.
    fixed:  everything else the forward takes (ids, masks, labels, n_heads, reduction, ...).
    dout:   the upstream gradient (an array shaped like the output, or a float for a scalar).
    seed:   for the random directions of directional checks.
    """

    inputs: dict
    fixed: dict = field(default_factory=dict)
    dout: object = None
    seed: int = 0


def _seed():
    return st.integers(0, 2**31 - 1)


def _lead_shapes(max_rank: int = 3):
    """Leading shapes (B,), (B, T), ... for ops that act on the last axis."""
    return st.integers(0, max_rank - 1).flatmap(
        lambda r: st.tuples(*[sizes(1, 3)] * r))


@st.composite
def embedding_cases(draw) -> OpCase:
    B, T = draw(batch_seq())
    V, H = draw(sizes(1, 5)), draw(sizes(1, 4))
    ids = draw(token_ids((B, T), V))
    W = draw(arrays((V, H)))
    return OpCase({"W": W}, {"ids": ids}, draw(upstream((B, T, H))), draw(_seed()))


@st.composite
def position_embedding_cases(draw) -> OpCase:
    B, T = draw(batch_seq())
    H = draw(sizes(1, 4))
    T_max = T + draw(st.integers(0, 2))  # unused positions must get exactly zero gradient
    return OpCase({"x": draw(arrays((B, T, H))), "W_pos": draw(arrays((T_max, H)))}, {},
                  draw(upstream((B, T, H))), draw(_seed()))


@st.composite
def sinusoidal_position_cases(draw) -> OpCase:
    B, T = draw(batch_seq())
    H = draw(sizes(1, 6))
    return OpCase({"x": draw(arrays((B, T, H)))}, {}, draw(upstream((B, T, H))), draw(_seed()))


@st.composite
def linear_cases(draw, bias: bool) -> OpCase:
    lead = draw(_lead_shapes())
    n_in, n_out = draw(sizes(1, 4)), draw(sizes(1, 4))
    inputs = {"x": draw(arrays(lead + (n_in,))), "W": draw(arrays((n_in, n_out))),
              "b": draw(arrays((n_out,))) if bias else None}
    return OpCase(inputs, {}, draw(upstream(lead + (n_out,))), draw(_seed()))


@st.composite
def layernorm_cases(draw, gamma_margin: float = 0.0) -> OpCase:
    lead = draw(_lead_shapes())
    N = draw(sizes(2, 6))
    inputs = {"x": draw(layernorm_inputs(lead + (N,))), "gamma": draw(gammas(N, gamma_margin)),
              "beta": draw(betas(N))}
    return OpCase(inputs, {}, draw(upstream(lead + (N,))), draw(_seed()))


@st.composite
def softmax_cases(draw, masked: bool) -> OpCase:
    shape = draw(_lead_shapes()) + (draw(sizes(1, 5)),)
    fixed = {"mask": draw(row_masks(shape))} if masked else {}
    return OpCase({"x": draw(arrays(shape, -3.0, 3.0))}, fixed, draw(upstream(shape)),
                  draw(_seed()))


@st.composite
def relu_cases(draw) -> OpCase:
    shape = draw(_lead_shapes()) + (draw(sizes(1, 4)),)
    return OpCase({"x": draw(relu_inputs(shape))}, {}, draw(upstream(shape)), draw(_seed()))


@st.composite
def tanh_cases(draw) -> OpCase:
    shape = draw(_lead_shapes()) + (draw(sizes(1, 4)),)
    return OpCase({"x": draw(arrays(shape))}, {}, draw(upstream(shape)), draw(_seed()))


ATTENTION_WEIGHTS = ("W_q", "W_k", "W_v", "W_o")
ATTENTION_BIASES = ("b_q", "b_k", "b_v", "b_o")


@st.composite
def attention_params(draw, H: int, bias: bool) -> dict:
    """W_q, W_k, W_v, W_o [H, H] and b_q.. [H] (None without biases), in the forward's order."""
    p = {name: draw(arrays((H, H), -1.0, 1.0)) for name in ATTENTION_WEIGHTS}
    p.update({name: draw(arrays((H,), -1.0, 1.0)) if bias else None
              for name in ATTENTION_BIASES})
    return p


@st.composite
def attention_cases(draw, bias: bool, masked: bool) -> OpCase:
    B, T = draw(batch_seq())
    A, d_k = draw(head_dims())
    H = A * d_k
    inputs = {"x": draw(arrays((B, T, H))), **draw(attention_params(H, bias))}
    fixed = {"n_heads": A, "mask": draw(key_masks(B, T)) if masked else None}
    return OpCase(inputs, fixed, draw(upstream((B, T, H))), draw(_seed()))


@st.composite
def ffn_params(draw, H: int, I: int) -> dict:
    """W_1 [H, I], b_1 [I] (kept off 0 so a zero input is not at the kink), W_2 [I, H], b_2."""
    return {"W_1": draw(arrays((H, I))), "b_1": draw(arrays((I,), elements=away_from_zero())),
            "W_2": draw(arrays((I, H))), "b_2": draw(arrays((H,)))}


def relu_preactivation_ok(x: np.ndarray, W_1: np.ndarray, b_1: np.ndarray) -> bool:
    """The FFN's ReLU pre-activation x W_1 + b_1 is at least KINK_MARGIN from 0 everywhere."""
    return bool(np.min(np.abs(x @ W_1 + b_1)) > KINK_MARGIN)


@st.composite
def ffn_cases(draw) -> OpCase:
    B, T = draw(batch_seq())
    H, I = draw(sizes(1, 4)), draw(sizes(1, 5))
    inputs = {"x": draw(arrays((B, T, H))), **draw(ffn_params(H, I))}
    assume(relu_preactivation_ok(inputs["x"], inputs["W_1"], inputs["b_1"]))
    return OpCase(inputs, {}, draw(upstream((B, T, H))), draw(_seed()))


def block_param_names(attn_bias: bool) -> tuple[str, ...]:
    """Local names of one post-LN block's parameters (the protocol's ``p`` dict)."""
    attn = ATTENTION_WEIGHTS + (ATTENTION_BIASES if attn_bias else ())
    return (tuple(f"attn.{n}" for n in attn) + ("ln1.gamma", "ln1.beta")
            + tuple(f"ffn.{n}" for n in ("W_1", "b_1", "W_2", "b_2")) + ("ln2.gamma", "ln2.beta"))


@st.composite
def block_cases(draw, bias: bool, masked: bool) -> OpCase:
    """x plus every block parameter as a differentiable input named by its local name.

    The ReLU and LayerNorm conditions depend on the attention output, so the test filters
    them with the implementation's forward (see ``block_smooth`` in tests/fdcheck.py)."""
    B, T = draw(batch_seq())
    A, d_k = draw(head_dims())
    H = A * d_k
    assume(H >= 2)  # a LayerNorm over one feature is constant: nothing to differentiate
    I = draw(sizes(1, 5))
    p = {f"attn.{k}": v for k, v in draw(attention_params(H, bias)).items() if v is not None}
    p.update({"ln1.gamma": draw(gammas(H)), "ln1.beta": draw(betas(H))})
    p.update({f"ffn.{k}": v for k, v in draw(ffn_params(H, I)).items()})
    p.update({"ln2.gamma": draw(gammas(H)), "ln2.beta": draw(betas(H))})
    inputs = {"x": draw(arrays((B, T, H))), **{n: p[n] for n in block_param_names(bias)}}
    fixed = {"n_heads": A, "mask": draw(key_masks(B, T)) if masked else None}
    return OpCase(inputs, fixed, draw(upstream((B, T, H))), draw(_seed()))


@st.composite
def pooler_cases(draw, bias: bool = True) -> OpCase:
    B, T = draw(batch_seq())
    H = draw(sizes(1, 4))
    inputs = {"h": draw(arrays((B, T, H))), "W": draw(arrays((H, H))),
              "b": draw(arrays((H,))) if bias else None}
    return OpCase(inputs, {}, draw(upstream((B, H))), draw(_seed()))


@st.composite
def cross_entropy_cases(draw, reduction: str) -> OpCase:
    lead = draw(_lead_shapes(3).filter(len))  # labels need at least one axis
    V = draw(sizes(1, 6))
    inputs = {"logits": draw(arrays(lead + (V,), -4.0, 4.0))}
    fixed = {"labels": draw(ce_labels(lead, V)), "reduction": reduction}
    return OpCase(inputs, fixed, draw(scalar_upstream()), draw(_seed()))


@st.composite
def mse_cases(draw) -> OpCase:
    shape = draw(_lead_shapes()) + (draw(sizes(1, 4)),)
    inputs = {"y_hat": draw(arrays(shape)), "y": draw(arrays(shape))}
    return OpCase(inputs, {}, draw(scalar_upstream()), draw(_seed()))
