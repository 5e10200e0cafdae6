"""Rotary position embeddings (RoPE): each feature pair turned by the angle m theta_i of its
position m, theta_i = base^(-2i/d), in the two conventions real code uses -- interleaved pairs
(2i, 2i+1) (the RoFormer paper, Meta's LLaMA as complex numbers, GPT-J) and half-split pairs
(i, i + d/2) (Hugging Face's ``rotate_half``) -- and the backward, the transpose rotation.

None of the five documents uses rotary embeddings (they add learned or sinusoidal positions);
LLaMA-style code does, so it is a protocol op of its own.  The proofs keep the position m and
the base symbolic (cos and sin of m theta_i as SymPy functions): the backward derived with
``sympy.diff`` is the rotation by the opposite angle; per pair the rotation keeps the norm
(tangent half-angle substitution, so the identity is rational); a query at m and a key at n
meet through the angle (n - m) theta_i alone (the relative-position property); and the two
conventions are one map up to the permutation of features that takes pair (2i, 2i+1) to
(i, i + d/2).
"""

from __future__ import annotations

import numpy as np
import sympy as sp

from minibert_spec.equations import Equation, Numeric, Proof, register
from minibert_spec.equations._cache import maps_cache
from minibert_spec.equations._code import op_check
from minibert_spec.equations._sym import arr, compare, forward_backward_maps, is_zero, vjp
from minibert_spec.sources import PROTOCOL_VARIANTS

CONVENTIONS = ("interleaved", "half")
FEATURES = (2, 4, 6)  # d tried by every proof
NUMERIC_SIZES = ((2, 2), (3, 4), (2, 6))  # (T, d) of the SymPy <-> code checks
NUMERIC_BASE = 10000  # the base of the SymPy <-> code checks (the proofs keep it symbolic)
MAX_POSITION = 16  # positions of the SymPy <-> code checks: 0..15

BASE = sp.Symbol("b", positive=True)


def pairs(d: int, convention: str) -> list[tuple[int, int]]:
    """The features turned together: (2i, 2i+1), or (i, i + d/2), for i < d/2."""
    if convention == "interleaved":
        return [(2 * i, 2 * i + 1) for i in range(d // 2)]
    return [(i, i + d // 2) for i in range(d // 2)]


def theta(d: int, base=BASE) -> list:
    """theta_i = base^(-2i/d), i < d/2."""
    return [base ** sp.Rational(-2 * i, d) for i in range(d // 2)]


def rotate(v, cos, sin, convention: str) -> np.ndarray:
    """Pair i of ``v`` turned by the angle whose cosine and sine are cos[i], sin[i]:
    (v_a cos - v_b sin, v_a sin + v_b cos)."""
    out = np.array(v, dtype=object)
    for i, (a, b) in enumerate(pairs(len(v), convention)):
        out[a] = v[a] * cos[i] - v[b] * sin[i]
        out[b] = v[a] * sin[i] + v[b] * cos[i]
    return out


def rope_row(v, m, convention: str, base=BASE) -> np.ndarray:
    """One token's rotary embedding at position m (the angles expanded: m theta_i - n theta_i,
    not (m - n) theta_i, so that the angle-difference formulas apply)."""
    angles = [sp.expand(m * t) for t in theta(len(v), base)]
    return rotate(v, [sp.cos(a) for a in angles], [sp.sin(a) for a in angles], convention)


def _prove_backward(convention: str) -> Proof:
    """sympy.diff of sum(dy * y) w.r.t. x is R(m theta)^T dy: the rotation by -m theta_i."""
    m = sp.Symbol("m", real=True)
    for d in FEATURES:
        x, dy = arr("x", d), arr("dy", d)
        y = rope_row(x, m, convention)
        angles = [m * t for t in theta(d)]
        closed = rotate(dy, [sp.cos(a) for a in angles], [-sp.sin(a) for a in angles],
                        convention)
        ok, detail = compare(vjp(y, dy, x), closed)
        if not ok:
            return Proof("refuted", (d,), f"d={d}: {detail}")
    return Proof("proven", FEATURES, "dx = R(-m theta) dy (sympy.diff)")


def _norm_kept(convention: str, d: int) -> bool:
    """(y_a^2 + y_b^2) = (x_a^2 + x_b^2) per pair, with cos = (1 - t^2)/(1 + t^2) and
    sin = 2t/(1 + t^2) (t = tan of half the angle): a rational identity."""
    x, t = arr("x", d), arr("t", d // 2)
    y = rotate(x, [(1 - ti ** 2) / (1 + ti ** 2) for ti in t], [2 * ti / (1 + ti ** 2) for ti in t],
               convention)
    return all(is_zero(y[a] ** 2 + y[b] ** 2 - x[a] ** 2 - x[b] ** 2)
               for a, b in pairs(d, convention))


def _relative(convention: str, d: int) -> bool:
    """(R(m theta) q) . (R(n theta) k) = q . R((n - m) theta) k: positions meet through their
    difference (angle-difference formulas, sympy.expand_trig)."""
    m, n = sp.symbols("m n", real=True)
    q, k = arr("q", d), arr("k", d)
    lhs = sp.Add(*(rope_row(q, m, convention) * rope_row(k, n, convention)))
    rhs = sp.Add(*(q * rope_row(k, n - m, convention)))
    return sp.expand(sp.expand_trig(lhs - rhs)) == 0


def _conjugate(d: int) -> bool:
    """The half-split map is the interleaved one on permuted features: with h[i] = v[2i],
    h[i + d/2] = v[2i + 1], half(h) is interleaved(v) permuted the same way."""
    m = sp.Symbol("m", real=True)
    v = arr("v", d)
    perm = [2 * i for i in range(d // 2)] + [2 * i + 1 for i in range(d // 2)]
    h = np.array([v[j] for j in perm], dtype=object)
    inter = rope_row(v, m, "interleaved")
    return all(is_zero(a - b) for a, b in zip(rope_row(h, m, "half"), [inter[j] for j in perm]))


def _prove_forward(convention: str) -> Proof:
    """Per pair the norm is kept, a query at m and a key at n meet through n - m alone, the two
    conventions are one map up to a permutation of features, and position 0 is the
    identity."""
    m0 = sp.Integer(0)
    for d in FEATURES:
        if not _norm_kept(convention, d):
            return Proof("refuted", (d,), f"d={d}: a pair's norm changes")
        if not _relative(convention, d):
            return Proof("refuted", (d,), f"d={d}: q_m . k_n depends on more than n - m")
        if not _conjugate(d):
            return Proof("refuted", (d,), f"d={d}: half-split != permuted interleaved")
        x = arr("x", d)
        if not all(is_zero(a - b) for a, b in zip(rope_row(x, m0, convention), x)):
            return Proof("refuted", (d,), f"d={d}: position 0 is not the identity")
    return Proof("proven", FEATURES, "per-pair norm kept; q_m . k_n a function of n - m; "
                                     "half = permuted interleaved; R(0) = I")


# --------------------------------------------------------------------------- SymPy <-> code
@maps_cache
def _rope_fns(size, convention: str):
    """The forward over T tokens at symbolic positions m_t (base NUMERIC_BASE) and its
    sympy.diff backward, lambdified."""
    T, d = size
    x, m, dy = arr("x", T, d), arr("m", T), arr("dy", T, d)
    y = np.stack([rope_row(x[t], m[t], convention, sp.Integer(NUMERIC_BASE))
                  for t in range(T)])
    return forward_backward_maps(dict(x=x, m=m, dy=dy), y, dy, [x])


def _inputs(size):
    T, d = size
    return dict(x=("float", (T, d), 2.0), m=("int", (T,), MAX_POSITION),
                dy=("float", (T, d), 1.0))


def _numeric(convention: str, which: int) -> Numeric:
    return op_check(which, NUMERIC_SIZES, _inputs, lambda s: _rope_fns(s, convention)[which],
                    "rope_forward", "rope_backward", lambda x, m, dy: (
                        (x, m), {"base": float(NUMERIC_BASE), "convention": convention}), "dy",
                    pick=slice(None), needs=("rope_forward", "rope_backward"))


_ROTATION = {
    "interleaved": (r"\begin{pmatrix} y_{2i} \\ y_{2i+1} \end{pmatrix} = "
                    r"\begin{pmatrix} \cos m\theta_i & -\sin m\theta_i \\ \sin m\theta_i & "
                    r"\cos m\theta_i \end{pmatrix} \begin{pmatrix} x_{2i} \\ x_{2i+1} "
                    r"\end{pmatrix},\ \theta_i = b^{-2i/d}"),
    "half": (r"\begin{pmatrix} y_{i} \\ y_{i+d/2} \end{pmatrix} = "
             r"\begin{pmatrix} \cos m\theta_i & -\sin m\theta_i \\ \sin m\theta_i & "
             r"\cos m\theta_i \end{pmatrix} \begin{pmatrix} x_{i} \\ x_{i+d/2} "
             r"\end{pmatrix},\ \theta_i = b^{-2i/d}"),
}
_TORCH = {"interleaved": "torch.view_as_complex (Meta's LLaMA complex form)",
          "half": "transformers LlamaRotaryEmbedding + apply_rotary_pos_emb"}
_WHAT = {"interleaved": "interleaved pairs (2i, 2i+1): RoFormer, Meta's LLaMA, GPT-J",
         "half": "half-split pairs (i, i + d/2): Hugging Face rotate_half"}

for _c in CONVENTIONS:
    register(Equation(
        f"rope.forward.{_c}", f"Rotary position embedding, {_c} pairs", (PROTOCOL_VARIANTS,),
        _ROTATION[_c], lambda c=_c: _prove_forward(c), torch_op=_TORCH[_c],
        numeric=_numeric(_c, 0), note=_WHAT[_c]))
    register(Equation(
        f"rope.backward.{_c}", f"Rotary position embedding gradient, {_c} pairs",
        (PROTOCOL_VARIANTS,),
        r"\frac{\partial L}{\partial x} = R(m\theta)^\top \frac{\partial L}{\partial y} = "
        r"R(-m\theta)\,\frac{\partial L}{\partial y}",
        lambda c=_c: _prove_backward(c), gradient=True, torch_op=_TORCH[_c],
        numeric=_numeric(_c, 1), uses=(f"rope.forward.{_c}",)))
