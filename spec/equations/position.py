"""Position embeddings: learned (added to the tokens, gradient summed over the batch) and
sinusoidal (no parameters; each frequency's (sin, cos) pair rotates with the position)."""

from __future__ import annotations

import numpy as np
import sympy as sp

from minibert_spec.equations import Equation, Numeric, Proof, register
from minibert_spec.equations._cache import maps_cache
from minibert_spec.equations._code import fb_checks
from minibert_spec.equations._sym import arr, compare, forward_backward_maps, lambdify_map, vjp
from minibert_spec.sources import BLOG, GUIDE, MINIBERT, SEED001, SLIDES


def _prove_position() -> Proof:
    """out[b, t] = x[b, t] + W_pos[t] for t < T <= T_max; dx = dout, dW_pos[t] = sum_b dout[b, t]
    for t < T and 0 for the unused rows."""
    for B, T, T_max, H in ((2, 2, 3, 2), (1, 3, 3, 2), (3, 1, 2, 1)):
        x, W, dout = arr("x", B, T, H), arr("P", T_max, H), arr("dout", B, T, H)
        out = x + W[None, :T]
        dW = vjp(out, dout, W)
        closed_dW = np.zeros((T_max, H), dtype=object)
        closed_dW[:T] = dout.sum(axis=0)
        ok1, d1 = compare(dW, closed_dW)
        ok2, d2 = compare(vjp(out, dout, x), dout)
        if not (ok1 and ok2):
            return Proof("refuted", (B, T, T_max, H), d1 or d2)
    return Proof("proven", ((2, 2, 3, 2), (1, 3, 3, 2), (3, 1, 2, 1)))


POS, K = sp.symbols("pos k", real=True)


def pe_angle(i2, d):
    """pos / 10000^(2i/d) with i2 = 2i."""
    return POS / sp.Integer(10000) ** (sp.Integer(i2) / d)


def _prove_sinusoidal() -> Proof:
    """Each (sin, cos) pair of frequency w = 10000^(-2i/d) is a point on the unit circle, and a
    shift by k positions is a fixed rotation: [PE(pos+k, 2i), PE(pos+k, 2i+1)] =
    R(w k) [PE(pos, 2i), PE(pos, 2i+1)] -- the relative-position property, for every pos, k."""
    for d in (2, 4, 6):
        for i2 in range(0, d, 2):
            w = sp.Integer(10000) ** (-sp.Integer(i2) / d)
            s, c = sp.sin(w * POS), sp.cos(w * POS)
            if sp.simplify(s ** 2 + c ** 2 - 1) != 0:
                return Proof("refuted", (d,), "sin^2 + cos^2 != 1")
            s_k, c_k = sp.sin(w * (POS + K)), sp.cos(w * (POS + K))
            rot_s = sp.cos(w * K) * s + sp.sin(w * K) * c
            rot_c = -sp.sin(w * K) * s + sp.cos(w * K) * c
            for lhs, rhs in ((s_k, rot_s), (c_k, rot_c)):
                if sp.simplify(sp.expand_trig(lhs - rhs)) != 0:
                    return Proof("refuted", (d,), f"shift by k is not a rotation at 2i={i2}")
    return Proof("proven", (2, 4, 6), "unit pairs; PE(pos + k) = R(k) PE(pos) per frequency")


# --------------------------------------------------------------------------- SymPy <-> code
@maps_cache
def _pos_fns(size):
    B, T, T_max, H = size
    x, P, dout = arr("x", B, T, H), arr("P", T_max, H), arr("dout", B, T, H)
    out = x + P[None, :T]
    inputs = dict(x=x, W_pos=P, dout=dout)
    return forward_backward_maps(inputs, out, dout, (x, P))


def _pos_inputs(size):
    B, T, T_max, H = size
    return dict(x=("float", (B, T, H), 2.0), W_pos=("float", (T_max, H), 2.0),
                dout=("float", (B, T, H), 1.0))


POS_FWD, POS_BWD = fb_checks(((2, 2, 3, 2), (1, 3, 3, 2), (3, 1, 2, 1)), _pos_inputs,
                             lambda w: lambda s: _pos_fns(s)[w], "position_embedding_forward",
                             "position_embedding_backward", ("x", "W_pos"), "dout")


@maps_cache
def _pe_fn(size):
    T, d = size
    pe = np.empty((T, d), dtype=object)
    for p in range(T):
        for j in range(d):
            ang = pe_angle(j - j % 2, d).subs(POS, p)
            pe[p, j] = sp.sin(ang) if j % 2 == 0 else sp.cos(ang)
    return lambdify_map({}, [pe])


register(Equation(
    "position.learned.forward", "Learned position embeddings added to the tokens",
    (f"{MINIBERT} §2.1", f"{SLIDES} (input embedding construction)", f"{BLOG} (initialize)",
     f"{GUIDE} §1"),
    r"E[b,t,h] = E_{token}[b,t,h] + W_{pos}[t,h]",
    _prove_position, torch_op="torch.nn.functional.embedding",
    numeric=POS_FWD,
    note="the BERT-base blog adds all 512 rows of W_P, i.e. inputs padded to the maximum length; "
         "the slides allow P fixed or learned (the sinusoidal entry covers fixed)",
    uses=("embedding.forward",)))

register(Equation(
    "position.learned.backward", "Learned position embedding gradient",
    (f"{MINIBERT} §2.1",),
    r"\frac{\partial L}{\partial x} = \frac{\partial L}{\partial E},\ "
    r"\frac{\partial L}{\partial W_{pos}[t]} = \sum_b \frac{\partial L}{\partial E[b,t]}\ (t<T),"
    r"\ 0\ (t \ge T)",
    _prove_position, gradient=True, torch_op="torch.nn.functional.embedding",
    numeric=POS_BWD,
    uses=("position.learned.forward",)))

register(Equation(
    "position.sinusoidal", "Sinusoidal position encoding", (f"{SEED001} §1.1",),
    r"PE(pos, 2i) = \sin(pos / 10000^{2i/d}),\ PE(pos, 2i+1) = \cos(pos / 10000^{2i/d})",
    _prove_sinusoidal,
    numeric=Numeric(((3, 4), (5, 6), (2, 2), (4, 5)), lambda s: {},
                    # the map itself, built when the check is prepared (not at its first
                    # call): regenerating records it, a check reads the generated source
                    _pe_fn,
                    lambda impl, s: (impl.sinusoidal_encoding(s[0], s[1]),),
                    needs=("sinusoidal_encoding",)),
    note="no parameters; the added encoding passes the gradient through unchanged. Odd d (not "
         "covered by the document) keeps the sin of the last frequency"))
