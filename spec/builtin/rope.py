"""Rotary position embeddings (RoPE): each feature pair turned by the angle m base^(-2i/d) at
position m, pairs (2i, 2i+1) interleaved or (i, i + d/2) half (its SymPy derivation:
spec/equations/rope.py; its reference pair: minibert_reference.ops.embeddings).  The attention's
RoPE (attention.rope, the causal_rope families, rope_attention's twin) stays with the attention;
the twins themselves are torch_oracle.rope_half / rope_interleaved, which rope_attention calls
too."""

from __future__ import annotations

import numpy as np

from minibert_spec.builtin import NOTHING_TO_GUARD, Family, Identity, Mutant, OpDeclaration

NAME = "rope"
MAX_POSITION = 40  # drawn positions: 0..40 (angles up to 40 rad: every pair turns past 2 pi)


def _draw_positions(draw, k, T: int):
    """The protocol's positions argument: None (0..T-1), a start position (Meta's start_pos,
    decoding after a prompt), or one position per token -- any order, repeats allowed (a packed
    or left-padded batch)."""
    kind = draw(k.st.sampled_from(["none", "start", "array"]))
    if kind == "none":
        return None
    if kind == "start":
        return draw(k.st.integers(0, MAX_POSITION))
    return draw(k.np_arrays(np.int64, (T,), k.st.integers(0, MAX_POSITION), k.st.nothing()))


def _draw(draw, k, convention: str):
    """x [..., T, d] with no, one or two leading axes, d even (2 to 8), the three forms of
    positions, base from 2 to 1e6; ``convention`` passed as the keyword."""
    lead = draw(k._lead_shapes(3))
    T, d = draw(k.sizes(1, 4)), 2 * draw(k.sizes(1, 4))
    fixed = {"positions": _draw_positions(draw, k, T), "base": draw(k.rope_bases()),
             "convention": convention}
    return k.OpCase({"x": draw(k.arrays(lead + (T, d)))}, fixed, draw(k.upstream(lead + (T, d))),
                    draw(k._seed()))


def _example(rng, k, convention: str):
    x = rng.standard_normal((2, 3, 5, 6))  # [B, A, T, d]: the layout of an attention's q and k
    fixed = {"positions": np.array([0, 1, 2, 7, 3]), "base": 10000.0, "convention": convention}
    return k.OpCase({"x": x}, fixed, k.upstream_like(rng, x.shape))


def _positions(positions, T: int) -> np.ndarray:
    """The protocol's positions argument as an array [T] (None: 0..T-1; an int: the start)."""
    if positions is None:
        return np.arange(T)
    if isinstance(positions, (int, np.integer)):
        return np.arange(positions, positions + T)
    return np.asarray(positions)


def rope_is_a_rotation_of_relative_positions(impl, case, h, shift):
    """Each feature pair of the convention keeps its norm; the backward of y gives back x (the
    inverse is the transpose); position 0 is the identity; None, the start position and the
    explicit positions are one argument; and a query at m against a key at n depends on n - m
    alone: every position moved by ``shift`` leaves the scores q_m . k_n unchanged."""
    x, f = case.inputs["x"], case.fixed
    T, d = x.shape[-2:]
    kw = {"base": f["base"], "convention": f["convention"]}
    pos = _positions(f["positions"], T)
    y, cache = impl.rope_forward(x, pos, **kw)
    (back,) = impl.rope_backward(y, cache)
    a, b = (list(idx) for idx in zip(*h.rope_pairs(d, f["convention"])))
    k = np.random.default_rng(case.seed).uniform(-2.0, 2.0, x.shape)

    def scores(at):
        q_rot, k_rot = impl.rope_forward(x, at, **kw)[0], impl.rope_forward(k, at, **kw)[0]
        return q_rot @ np.swapaxes(k_rot, -1, -2)  # [..., T, T]

    start = int(pos[0]) if f["positions"] is not None else 0
    h.require([h.close(NAME, "each pair keeps its norm", y[..., a] ** 2 + y[..., b] ** 2,
                       x[..., a] ** 2 + x[..., b] ** 2),
               h.close(NAME, "backward(forward(x)) = x (R^T R = I)", back, x),
               h.close(NAME, "position 0 is the identity",
                       impl.rope_forward(x, np.zeros(T, np.int64), **kw)[0], x),
               h.close(NAME, "positions None / start / array agree",
                       impl.rope_forward(x, None if start == 0 else start, **kw)[0],
                       impl.rope_forward(x, start + np.arange(T), **kw)[0]),
               h.close(NAME, f"q_m . k_n depends on n - m alone (positions + {shift})",
                       scores(pos + shift), scores(pos))])


_SHIFT = dict(given=lambda k: {"shift": k.st.integers(1, 30)}, example={"shift": 5})

OP = OpDeclaration(
    NAME, after="sinusoidal_position", inputs=("x",),
    equations=("rope.forward.interleaved", "rope.backward.interleaved", "rope.forward.half",
               "rope.backward.half"),
    unguarded=NOTHING_TO_GUARD,
    doc="rope_forward(x [...,T,d] (d even), positions [T] int >= 0, a start position or None "
        '(0..T-1), *, base=10000.0, convention="interleaved"|"half") -> each feature pair '
        "turned by the angle m base^(-2i/d) at position m: pairs (2i, 2i+1) interleaved "
        "(Meta's LLaMA, GPT-J) or (i, i + d/2) half (Hugging Face rotate_half); the backward "
        "turns back (the transpose)",
    families=(Family(_draw, _example, "interleaved", torch="rope_interleaved",
                     options=dict(convention="interleaved",
                                  needs={"rope.convention": "interleaved"}, omit=("half",))),
              Family(_draw, _example, "half", torch="rope_half",
                     options=dict(convention="half", needs={"rope.convention": "half"},
                                  omit=("interleaved",), torch_requires=("transformers",)))),
    identities=(Identity("rotation-half", rope_is_a_rotation_of_relative_positions,
                         family="rope_half", options=_SHIFT),
                Identity("rotation-interleaved", rope_is_a_rotation_of_relative_positions,
                         family="rope_interleaved", options=_SHIFT)),
    mutants=(
        Mutant("rope_rotation_sign_flipped", "rope.forward.interleaved",
               "RoPE turns each pair by -m theta (the sign of sin flipped in the shared rotation: "
               "the backward still transposes the forward, so finite differences pass)",
               "ops._rotate",
               (("y[..., a] = x_a * cos - x_b * sin", "y[..., a] = x_a * cos + x_b * sin"),
                ("y[..., b] = x_a * sin + x_b * cos", "y[..., b] = -x_a * sin + x_b * cos"))),
        Mutant("rope_frequency_exponent_halved", "rope.forward.half",
               "RoPE frequencies base^(-i/d) instead of base^(-2i/d): every pair but the first "
               "turns too fast", "ops._rope_angles",
               (("-np.arange(0, d, 2, dtype=np.float64) / d",
                 "-np.arange(0, d // 2, dtype=np.float64) / d"),)),
        Mutant("rope_backward_not_transposed", "rope.backward.half",
               "RoPE backward turns dy by +m theta (the forward's rotation) instead of its "
               "transpose", "ops._rope_backward",
               (("cache.cos, -cache.sin,", "cache.cos, cache.sin,"),)),
        Mutant("rope_backward_ignores_convention", "rope.backward.interleaved",
               "RoPE backward pairs (i, i + d/2) whatever the forward's convention",
               "ops._rope_backward", (("cache.convention),)", '"half"),)'),)),
    ),
    options={
        "convention": dict(values=("interleaved", "half"), meaning={
            "interleaved": "interleaved pairs (2i, 2i+1) (RoFormer, Meta's LLaMA complex form, "
                           "GPT-J)",
            "half": "half-split pairs (i, i + d/2) (Hugging Face rotate_half)"},
            argument="convention"),
    },
    options_after="rmsnorm",
    bad_inputs=(
        ("rope odd d", "x", lambda m, b: m.rope_forward(np.ones((b.B, b.T, 3)))),
        ("rope x rank 1", "x", lambda m, b: m.rope_forward(np.ones(b.H))),
        ("rope positions shape", "positions",
         lambda m, b: m.rope_forward(b.X, np.arange(b.T + 1))),
        ("rope positions < 0", "positions",
         lambda m, b: m.rope_forward(b.X, np.array([0, -1, 2]))),
        ("rope float positions", "positions",
         lambda m, b: m.rope_forward(b.X, np.arange(b.T) * 1.0)),
        ("rope start < 0", "positions", lambda m, b: m.rope_forward(b.X, -2)),
        ("rope base 1", "base", lambda m, b: m.rope_forward(b.X, base=1.0)),
        ("rope base nan", "base", lambda m, b: m.rope_forward(b.X, base=float("nan"))),
    ),
)
