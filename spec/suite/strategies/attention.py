"""Case families of multi-head attention (biases, key masks, no output projection, causal,
causal with RoPE on queries and keys, one head), the split/merge-heads and softmax-rows
strategies, and the attention pieces the block families reuse (weights, example masks,
``with_and_without_mask``)."""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from minibert_spec.suite.strategies.embeddings import rope_bases
from minibert_spec.suite.strategies.kit import (
    OpCase,
    _seed,
    _softmax_rows,
    arrays,
    batch_seq,
    cases,
    fixed_examples,
    head_dims,
    key_masks,
    reused,
    sizes,
    upstream,
    upstream_like,
)

# --------------------------------------------------------------------------- attention
ATTENTION_WEIGHTS = ("W_q", "W_k", "W_v", "W_o")
ATTENTION_BIASES = ("b_q", "b_k", "b_v", "b_o")


@reused
@st.composite
def attention_params(draw, H: int, bias: bool, W_o: bool = True) -> dict:
    """W_q, W_k, W_v, W_o [H, H] and b_q.. [H] in [-1, 1] (None without biases; W_o and b_o None
    without the output projection), in the forward's order, from one drawn seed: eight tensors
    drawn element by element were most of the time of the attention's oracle checks (x, the
    mask and the upstream gradient stay drawn element by element, and shrink)."""
    rng = np.random.default_rng(draw(_seed()))
    p = {name: rng.uniform(-1.0, 1.0, (H, H)) for name in ATTENTION_WEIGHTS}
    p.update({name: rng.uniform(-1.0, 1.0, H) if bias else None for name in ATTENTION_BIASES})
    if not W_o:
        p["W_o"] = p["b_o"] = None
    return p


def _attention_example_params(rng, H: int, bias: bool, W_o: bool = True) -> dict:
    """A fixed example's x [2, 4, H] and attention weights, in the forward's order."""
    p = {n: rng.standard_normal((H, H)) * 0.6 for n in ATTENTION_WEIGHTS}
    p.update({n: 0.3 * rng.standard_normal(H) for n in ATTENTION_BIASES})
    x = rng.standard_normal((2, 4, H))
    if not bias:
        p.update(dict.fromkeys(ATTENTION_BIASES))
    if not W_o:
        p["W_o"] = p["b_o"] = None
    return {"x": x, **p}


def _example_mask(padded_from: int) -> np.ndarray:
    """[2, 4] key mask as 0/1 integers (the protocol accepts them): the second sequence padded
    from ``padded_from``; key 0 always attendable (a causal first query sees it alone)."""
    mask = np.ones((2, 4), dtype=np.int64)
    mask[1, padded_from:] = 0
    return mask


def _attention_example(rng, bias: bool, masked: bool, W_o: bool = True, causal: bool = False,
                       heads: str = "fused", rope: str | None = None):
    H = 8 if rope else 6  # with RoPE, d_k even in both head layouts (2 heads: d_k = 4)
    inputs = _attention_example_params(rng, H, bias, W_o)
    fixed = {"n_heads": 1 if heads == "single" else 2,
             "mask": _example_mask(2) if masked else None,
             **({"causal": True} if causal else {}),
             **({"rope": rope, "rope_base": 100.0} if rope else {})}
    return OpCase(inputs, fixed, upstream_like(rng, (2, 4, H)))


@fixed_examples(lambda rng: (rng.standard_normal((2, 5, 6)), rng.standard_normal((2, 3, 5, 2)),
                             3))
@st.composite
def heads_cases(draw) -> tuple[np.ndarray, np.ndarray, int]:
    """(x [B, T, H], y [B, A, T, d_k], A): a split_heads input and a merge_heads input."""
    (B, T), (A, d_k) = draw(batch_seq()), draw(head_dims())
    return draw(arrays((B, T, A * d_k))), draw(arrays((B, A, T, d_k))), A


def _probability_rows_example(rng):
    p = rng.random((2, 5)) + 0.05
    return p / p.sum(-1, keepdims=True)


@fixed_examples(_probability_rows_example)
@st.composite
def probability_rows(draw) -> np.ndarray:
    """[R, N] rows of a softmax output (every p >= e^-6 / N, N >= 1)."""
    R, N = draw(sizes(1, 3)), draw(sizes(1, 5))
    return _softmax_rows(draw(arrays((R, N), -3.0, 3.0)))


@st.composite
def causal_key_masks(draw, B: int, T: int) -> np.ndarray:
    """A key padding mask that a causal attention can take: key 0 always attendable (the first
    query sees key 0 alone)."""
    m = draw(key_masks(B, T))
    m[:, 0] = True
    return m


def _attention_needs(bias: bool, masked: bool) -> dict:
    return {"attention.W_o": True, "attention.causal": False,
            **({"attention_bias": True} if bias else {}), **({"key_mask": True} if masked else {})}


_FOLLOW = ("attention_bias", "key_mask")  # biases and masks as the implementation has them
_HEADS = ("attention.heads",)  # one head for a single-head attention, else drawn
_ATTN = dict(also=("heads",), torch="attention")
_NOT_STANDARD = ("causal", "attention.noproj")  # the variants a standard family does not draw


def with_and_without_mask(op: str, variant: str, *, needs: dict, resolve: tuple, **kw):
    """Register a variant's family twice: without a key mask (``op_variant``, every
    implementation of the variant can take it) and with one (``op_variant_mask``, for an
    implementation that claims ``key_mask``).  A family whose mask followed the declaration drew
    masked cases alone for the default claim, so a class with no mask argument had every FD,
    oracle and invariant check of its declared form n/a (issue 41: a W_o-free single-head class
    judged by one SymPy check)."""
    resolve = tuple(k for k in resolve if k != "key_mask")
    plain = cases(op, variant, masked=False, needs=needs, resolve=resolve, **kw)
    masked = cases(op, f"{variant}_mask", masked=True, needs={**needs, "key_mask": True},
                   resolve=resolve, **kw)
    return lambda fn: plain(masked(fn))  # registered in that order


# LLaMA's attention: causal, RoPE on queries and keys, one family per pair convention, each
# with and without a key mask; the twin turns q and k with the RoPE twins
_ROPE = dict(omit=("attention.noproj",), resolve=("attention.W_o",) + _FOLLOW + _HEADS,
             also=("heads", "rope"), torch="attention")


@cases("attention", "nobias", bias=False, masked=False, omit=_NOT_STANDARD,
       needs=_attention_needs(False, False), resolve=_HEADS, **_ATTN)
@cases("attention", "nobias_mask", bias=False, masked=True, omit=_NOT_STANDARD,
       needs=_attention_needs(False, True), resolve=_HEADS, **_ATTN)
@cases("attention", "bias", bias=True, masked=False, omit=_NOT_STANDARD,
       needs=_attention_needs(True, False), resolve=_HEADS, **_ATTN)
@cases("attention", "bias_mask", bias=True, masked=True, omit=_NOT_STANDARD,
       needs=_attention_needs(True, True), resolve=_HEADS, **_ATTN)
@with_and_without_mask("attention", "noproj", omit=("causal", "dW_o"),
                       needs={"attention.W_o": False},
                       resolve=("attention.causal",) + _FOLLOW + _HEADS, **_ATTN)
@with_and_without_mask("attention", "causal", needs={"attention.causal": True},
                       omit=("attention.noproj",),
                       resolve=("attention.W_o",) + _FOLLOW + _HEADS, **_ATTN)
@with_and_without_mask("attention", "causal_rope_half",
                       needs={"attention.causal": True, "attention.rope": "half"},
                       torch_requires=("transformers",),
                       **{**_ROPE, "omit": _ROPE["omit"] + ("interleaved",)})
@with_and_without_mask("attention", "causal_rope_interleaved",
                       needs={"attention.causal": True, "attention.rope": "interleaved"},
                       **{**_ROPE, "omit": _ROPE["omit"] + ("half",)})
@fixed_examples(_attention_example)
@st.composite
def attention_cases(draw, bias: bool, masked: bool, W_o: bool = True,
                    causal: bool = False, heads: str = "fused", rope: str | None = None) -> OpCase:
    """``W_o`` False: no output projection (W_o = b_o = None); ``causal``: the causal variant
    (``causal=True`` passed; a key mask then keeps key 0); ``heads`` "single": one head;
    ``rope`` "half" or "interleaved": queries and keys turned by RoPE (``rope=``, and a drawn
    ``rope_base``; d_k even).  The per-head layout is the proxy's (a conversion of the same
    weights)."""
    B, T = draw(batch_seq())
    A, d_k = draw(head_dims())
    if rope is not None:
        d_k += d_k % 2  # RoPE turns pairs of features
    if heads == "single":
        A, d_k = 1, A * d_k
    H = A * d_k
    inputs = {"x": draw(arrays((B, T, H))), **draw(attention_params(H, bias, W_o))}
    mask = None
    if masked:
        mask = draw(causal_key_masks(B, T) if causal else key_masks(B, T))
    fixed = {"n_heads": A, "mask": mask, **({"causal": True} if causal else {})}
    if rope is not None:
        fixed.update(rope=rope, rope_base=draw(rope_bases()))
    return OpCase(inputs, fixed, draw(upstream((B, T, H))), draw(_seed()))
