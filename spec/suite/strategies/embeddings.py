"""Case families of the embedding ops (token, tied, learned and sinusoidal position
embeddings) and of RoPE, with their fixed-seed examples."""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from minibert_spec.suite.strategies.kit import (
    OpCase,
    _seed,
    arrays,
    batch_seq,
    cases,
    fixed_examples,
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
@reused
def rope_bases() -> st.SearchStrategy[float]:
    """rope_theta: 10000 (RoFormer, LLaMA 1-2), 500000 (LLaMA 3), and from 2 to 1e6."""
    return st.one_of(st.sampled_from([10000.0, 500000.0]),
                     st.floats(0.3, 6.0).map(lambda e: float(10.0 ** e)))
