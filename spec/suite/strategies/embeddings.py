"""Case families of the embedding ops (token, tied, learned and sinusoidal position
embeddings) and of RoPE, with their fixed-seed examples."""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from minibert_spec.suite.strategies.kit import (
    OpCase,
    _lead_shapes,
    _seed,
    arrays,
    batch_seq,
    cases,
    fixed_examples,
    np_arrays,
    reused,
    sizes,
    token_ids,
    upstream,
    upstream_like,
)


# --------------------------------------------------------------------------- embeddings
def _embedding_example(rng):
    W = rng.standard_normal((6, 4))  # id 5 never occurs
    ids = np.array([[0, 3, 3, 1, 0], [3, 3, 2, 0, 4]])  # repeated ids within and across rows
    return OpCase({"W": W}, {"ids": ids}, upstream_like(rng, (2, 5, 4)))


@cases("embedding", torch="embedding")
@fixed_examples(_embedding_example)
@st.composite
def embedding_cases(draw) -> OpCase:
    B, T = draw(batch_seq())
    V, H = draw(sizes(1, 5)), draw(sizes(1, 4))
    ids = draw(token_ids((B, T), V))
    W = draw(arrays((V, H)))
    return OpCase({"W": W}, {"ids": ids}, draw(upstream((B, T, H))), draw(_seed()))


@cases("position_embedding", torch="learned_position")
@fixed_examples(lambda rng: OpCase({"x": rng.standard_normal((3, 4, 5)),
                                    "W_pos": rng.standard_normal((6, 5))}, {},
                                   upstream_like(rng, (3, 4, 5))))
@st.composite
def position_embedding_cases(draw) -> OpCase:
    B, T = draw(batch_seq())
    H = draw(sizes(1, 4))
    T_max = T + draw(st.integers(0, 2))  # unused positions must get exactly zero gradient
    return OpCase({"x": draw(arrays((B, T, H))), "W_pos": draw(arrays((T_max, H)))}, {},
                  draw(upstream((B, T, H))), draw(_seed()))


@cases("sinusoidal_position", torch="sinusoidal_position")
@fixed_examples(lambda rng: OpCase({"x": rng.standard_normal((2, 7, 6))}, {},
                                   upstream_like(rng, (2, 7, 6))))
@st.composite
def sinusoidal_position_cases(draw) -> OpCase:
    B, T = draw(batch_seq())
    H = draw(sizes(1, 6))
    return OpCase({"x": draw(arrays((B, T, H)))}, {}, draw(upstream((B, T, H))), draw(_seed()))


# --------------------------------------------------------------------------- RoPE
MAX_POSITION = 40  # drawn positions: 0..40 (angles up to 40 rad: every pair turns past 2 pi)


@reused
@st.composite
def rope_positions(draw, T: int):
    """The protocol's positions argument: None (0..T-1), a start position (Meta's start_pos,
    decoding after a prompt), or one position per token -- any order, repeats allowed (a packed
    or left-padded batch)."""
    kind = draw(st.sampled_from(["none", "start", "array"]))
    if kind == "none":
        return None
    if kind == "start":
        return draw(st.integers(0, MAX_POSITION))
    return draw(np_arrays(np.int64, (T,), st.integers(0, MAX_POSITION), st.nothing()))


@reused
def rope_bases() -> st.SearchStrategy[float]:
    """rope_theta: 10000 (RoFormer, LLaMA 1-2), 500000 (LLaMA 3), and from 2 to 1e6."""
    return st.one_of(st.sampled_from([10000.0, 500000.0]),
                     st.floats(0.3, 6.0).map(lambda e: float(10.0 ** e)))


def _rope_example(rng, convention: str):
    x = rng.standard_normal((2, 3, 5, 6))  # [B, A, T, d]: the layout of an attention's q and k
    fixed = {"positions": np.array([0, 1, 2, 7, 3]), "base": 10000.0, "convention": convention}
    return OpCase({"x": x}, fixed, upstream_like(rng, x.shape))


@cases("rope", "interleaved", needs={"rope.convention": "interleaved"}, omit=("half",),
       torch="rope_interleaved")
@cases("rope", "half", needs={"rope.convention": "half"}, omit=("interleaved",),
       torch="rope_half", torch_requires=("transformers",))
@fixed_examples(_rope_example)
@st.composite
def rope_cases(draw, convention: str) -> OpCase:
    """x [..., T, d] with no, one or two leading axes, d even (2 to 8), the three forms of
    positions, base from 2 to 1e6; ``convention`` passed as the keyword."""
    lead = draw(_lead_shapes(3))
    T, d = draw(sizes(1, 4)), 2 * draw(sizes(1, 4))
    fixed = {"positions": draw(rope_positions(T)), "base": draw(rope_bases()),
             "convention": convention}
    return OpCase({"x": draw(arrays(lead + (T, d)))}, fixed, draw(upstream(lead + (T, d))),
                  draw(_seed()))
