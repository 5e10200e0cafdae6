"""Multi-head self-attention: projections, head split/merge, scaled scores, softmax, context,
output projection, and the backward chain (dW_O, dV, dP, dS, dQ, dK, dx).

Head-level identities are derived on symbolic Q, K, V [T, d_k] for T in 2..3, d_k in 1..3; the
whole chain (projections included) on B=1, T=2, H=2 with A=1 and A=2.  Every exp(score) is an
opaque ``Exp`` while differentiating and a symbol E afterwards (see ``_sym.exp_to_symbols``).
"""

from __future__ import annotations

from functools import cache

import numpy as np
import sympy as sp

from minibert_spec.equations import Equation, Numeric, Proof, register
from minibert_spec.equations._cache import maps_cache
from minibert_spec.equations._sym import (
    Exp,
    arr,
    compare,
    counterexample,
    exp_to_symbols,
    fmt_array,
    fmt_values,
    is_zero,
    lambdify_map,
    softmax_rows,
    vjp,
)
from minibert_spec.sources import BLOG, GUIDE, MINIBERT, PROTOCOL_VARIANTS, SEED001, SLIDES

HEAD_SIZES = tuple((T, d_k) for T in (2, 3) for d_k in (1, 2, 3))
CHAIN_SIZES = ((1, 2, 2, 1), (1, 2, 2, 2))  # (B, T, H, A)
NUMERIC_SIZES = ((2, 2, 2, 2), (1, 2, 4, 2), (2, 3, 3, 3))  # (B, T, H, A): d_k = 1, 2, 1


def split(x: np.ndarray, A: int) -> np.ndarray:
    """[B, T, H] -> [B, A, T, d_k] (reshape, then swap the T and A axes)."""
    B, T, H = x.shape
    return x.reshape(B, T, A, H // A).transpose(0, 2, 1, 3)


def merge(x: np.ndarray) -> np.ndarray:
    B, A, T, d_k = x.shape
    return x.transpose(0, 2, 1, 3).reshape(B, T, A * d_k)


def causal_softmax_rows(S: np.ndarray) -> np.ndarray:
    """softmax over keys j <= i of row i (the causal mask), as Exp(s) / sum Exp; 0 for j > i."""
    T = S.shape[0]
    e = np.array([[Exp(S[i, j]) if j <= i else sp.Integer(0) for j in range(T)]
                  for i in range(T)], dtype=object)
    return e / e.sum(axis=-1, keepdims=True)


@cache
def head_forward(size, causal: bool = False):
    """One head: C = softmax(Q K^T / sqrt(d_k)) V as symbols (Exp kept opaque); ``causal``:
    each query attends keys j <= i only."""
    T, d_k = size
    Q, K, V, dC = arr("Q", T, d_k), arr("K", T, d_k), arr("V", T, d_k), arr("dC", T, d_k)
    scale = 1 / sp.sqrt(d_k)
    S = (Q @ K.T) * scale
    P = causal_softmax_rows(S) if causal else softmax_rows(S)
    return dict(Q=Q, K=K, V=V, dC=dC, S=S, P=P, C=P @ V, scale=scale)


@cache
def head(size, causal: bool = False):
    """head_forward plus the sympy.diff gradients w.r.t. Q, K, V (E symbols for the exps)."""
    r = dict(head_forward(size, causal))
    for name in ("Q", "K", "V"):
        r[f"d{name}"], E, aux = exp_to_symbols(vjp(r["C"], r["dC"], r[name]), r["S"])
    r.update(E=E, pE=E / E.sum(axis=-1, keepdims=True), aux=aux)
    return r


def closed_chain(r):
    """The documents' closed forms, in terms of P (= pE)."""
    P, V, dC = r["pE"], r["V"], r["dC"]
    dP = dC @ V.T  # [T, T]
    dS = P * (dP - (P * dP).sum(axis=-1, keepdims=True))
    return dict(dV=P.T @ dC, dP=dP, dS=dS, dQ=(dS * r["scale"]) @ r["K"],
                dK=(dS * r["scale"]).T @ r["Q"])


def _prove_head(key) -> Proof:
    """End to end through the softmax for T = 2 (d_k = 1..3); for every (T, d_k) of HEAD_SIZES
    the last stage alone (the bilinear S = Q K^T / sqrt(d_k), or C = P V, with a free upstream
    gradient), which together with the proven softmax JVP (attention.backward.dS) is the chain
    rule."""
    for size in [s for s in HEAD_SIZES if s[0] == 2]:
        r = head(size)
        ok, detail = compare(r[key], closed_chain(r)[key], r["aux"])
        if not ok:
            return Proof("refuted", size, f"(T, d_k)={size}, end to end: {detail}")
    for T, d_k in HEAD_SIZES:
        Q, K, V = arr("Q", T, d_k), arr("K", T, d_k), arr("V", T, d_k)
        scale = 1 / sp.sqrt(d_k)
        if key == "dV":
            P, dC = arr("P", T, T), arr("dC", T, d_k)
            derived, closed = vjp(P @ V, dC, V), P.T @ dC
        else:
            dS = arr("dS", T, T)
            S = (Q @ K.T) * scale
            derived = vjp(S, dS, Q if key == "dQ" else K)
            closed = (dS * scale) @ K if key == "dQ" else (dS * scale).T @ Q
        ok, detail = compare(derived, closed)
        if not ok:
            return Proof("refuted", (T, d_k), f"(T, d_k)={(T, d_k)}: {detail}")
    return Proof("proven", HEAD_SIZES, "end to end at T = 2; last stage at every size")


def _prove_dP() -> Proof:
    """C = P V is bilinear: dL/dP = dC V^T, with P as free symbols."""
    for T, d_k in HEAD_SIZES:
        P, V, dC = arr("P", T, T), arr("V", T, d_k), arr("dC", T, d_k)
        ok, detail = compare(vjp(P @ V, dC, P), dC @ V.T)
        if not ok:
            return Proof("refuted", (T, d_k), detail)
    return Proof("proven", HEAD_SIZES)


def _prove_dS() -> Proof:
    """dL/dS = P ⊙ (dP - rowsum(P ⊙ dP)) for P = softmax(S) row-wise, with dP free."""
    for T in (2, 3):
        S, dP = arr("S", T, T), arr("dP", T, T)
        derived, E, aux = exp_to_symbols(vjp(softmax_rows(S), dP, S), S)
        P = E / E.sum(axis=-1, keepdims=True)
        ok, detail = compare(derived, P * (dP - (P * dP).sum(axis=-1, keepdims=True)), aux)
        if not ok:
            return Proof("refuted", (T,), detail)
    return Proof("proven", (2, 3))


@cache
def chain(size, bias: bool = True):
    """Full attention on x [B, T, H]: projections, split, scores, softmax, merge, output."""
    B, T, H, A = size
    x, dy = arr("x", B, T, H), arr("dy", B, T, H)
    W = {n: arr(n, H, H) for n in ("W_q", "W_k", "W_v", "W_o")}
    b = {n: (arr(n, H) if bias else np.zeros(H, dtype=object)) for n in ("b_q", "b_k", "b_v",
                                                                           "b_o")}
    q, k, v = (x @ W[f"W_{n}"] + b[f"b_{n}"] for n in "qkv")
    qh, kh, vh = split(q, A), split(k, A), split(v, A)
    scale = 1 / sp.sqrt(H // A)
    S = (qh @ kh.transpose(0, 1, 3, 2)) * scale  # [B, A, T, T]
    P = softmax_rows(S)
    ctx = merge(P @ vh)
    y = ctx @ W["W_o"] + b["b_o"]
    return dict(x=x, dy=dy, W=W, b=b, q=q, k=k, v=v, qh=qh, kh=kh, vh=vh, S=S, P=P, ctx=ctx, y=y,
                scale=scale, A=A)


def _prove_dx() -> Proof:
    """dx = dQ W_q^T + dK W_k^T + dV W_v^T: the three projections of the same x add up (derived
    with free upstream dQ, dK, dV; the stages before them are the proven dQ, dK, dV entries, and
    the whole-layer sympy.diff is compared with the code by the SymPy <-> code check)."""
    sizes = CHAIN_SIZES + ((2, 3, 2, 2),)
    for B, T, H, A in sizes:
        x = arr("x", B, T, H)
        W = {n: arr(n, H, H) for n in "qkv"}
        up = {n: arr(f"d{n}", B, T, H) for n in "qkv"}
        out = np.concatenate([x @ W[n] for n in "qkv"], axis=-1)
        dout = np.concatenate([up[n] for n in "qkv"], axis=-1)
        ok, detail = compare(vjp(out, dout, x), sum(up[n] @ W[n].T for n in "qkv"))
        if not ok:
            return Proof("refuted", (B, T, H, A), detail)
    return Proof("proven", sizes)


def _prove_dW_o() -> Proof:
    """dW_O = ctx^T dY with the leading axes flattened, and dctx = dY W_O^T."""
    for size in CHAIN_SIZES:
        B, T, H, A = size
        ctx, W_o, dy = arr("c", B, T, H), arr("W_o", H, H), arr("dy", B, T, H)
        y = ctx @ W_o
        ok1, d1 = compare(vjp(y, dy, W_o), ctx.reshape(-1, H).T @ dy.reshape(-1, H))
        ok2, d2 = compare(vjp(y, dy, ctx), dy @ W_o.T)
        if not (ok1 and ok2):
            return Proof("refuted", size, d1 or d2)
    return Proof("proven", CHAIN_SIZES)


def _prove_split() -> Proof:
    """Head a owns features a*d_k .. (a+1)*d_k - 1 (visual guide §3); merge inverts split, and
    merge is split's adjoint (<split(x), y> = <x, merge(y)>), so the backward of a split is a
    merge and vice versa."""
    for B, T, A, d_k in ((1, 2, 2, 1), (2, 3, 2, 2), (1, 2, 3, 2)):
        x, yh = arr("x", B, T, A * d_k), arr("y", B, A, T, d_k)
        xh = split(x, A)
        for a in range(A):
            if not np.array_equal(xh[:, a], x[:, :, a * d_k:(a + 1) * d_k]):
                return Proof("refuted", (B, T, A, d_k), f"head {a} is not the slice")
        if not np.array_equal(merge(xh), x):
            return Proof("refuted", (B, T, A, d_k), "merge(split(x)) != x")
        if sp.expand(sp.Add(*(xh * yh).ravel()) - sp.Add(*(x * merge(yh)).ravel())) != 0:
            return Proof("refuted", (B, T, A, d_k), "merge is not the adjoint of split")
    return Proof("proven", ((1, 2, 2, 1), (2, 3, 2, 2), (1, 2, 3, 2)))


def _prove_reshape_only(direction: str) -> Proof:
    """A bare reshape between [B, A, T, d_k] and [B, T, H] (no transpose) is the identity on the
    memory order, which puts head a's row t where token (a*T + t) // A's features go."""
    B, A, T, d_k = 1, 2, 2, 1
    if direction == "merge":
        ctx = np.arange(B * A * T * d_k).reshape(B, A, T, d_k)  # ctx[0, a, t, 0] = 2a + t
        right, bare = merge(ctx), ctx.reshape(B, T, A * d_k)
        what = "Context [B, A, T, d_k] -> [B, T, H]"
    else:
        g = np.arange(B * T * A * d_k).reshape(B, T, A * d_k)  # g[0, t, h] = 2t + h
        right, bare = split(g, A), g.reshape(B, A, T, d_k)
        what = "grad_context [B, T, H] -> [B, A, T, d_k]"
    if np.array_equal(right, bare):
        return Proof("proven", (B, A, T, d_k))
    return Proof("refuted", (B, A, T, d_k),
                 f"{what} with B={B}, A={A}, T={T}, d_k={d_k}: reshape alone gives "
                 f"{bare.ravel().tolist()}, reshape + transpose gives {right.ravel().tolist()} "
                 "(equal only when A = 1 or T = 1)")


def _prove_qkv() -> Proof:
    """One fused [H, H] projection followed by the head split equals per-head [H, d_k]
    projections with W_h = W[:, h*d_k:(h+1)*d_k] (BERT-base blog's per-head W^Q_{h,l})."""
    for B, T, A, d_k in ((1, 2, 2, 1), (1, 2, 2, 2), (2, 1, 3, 1)):
        H = A * d_k
        x, W, b = arr("x", B, T, H), arr("W", H, H), arr("b", H)
        fused = split(x @ W + b, A)
        for h in range(A):
            sl = slice(h * d_k, (h + 1) * d_k)
            ok, detail = compare(fused[:, h], x @ W[:, sl] + b[sl])
            if not ok:
                return Proof("refuted", (B, T, A, d_k), detail)
    return Proof("proven", ((1, 2, 2, 1), (1, 2, 2, 2), (2, 1, 3, 1)))


def _prove_scores() -> Proof:
    """S[a, i, j] = <q_i, k_j> / sqrt(d_k) over head a's features (the slides' S_ij = <q_i, k_j>,
    scaled)."""
    for size in CHAIN_SIZES:
        r = chain(size, bias=False)
        B, T, H, A = size
        d_k = H // A
        for a in range(A):
            for i in range(T):
                for j in range(T):
                    q = r["q"][0, i, a * d_k:(a + 1) * d_k]
                    k = r["k"][0, j, a * d_k:(a + 1) * d_k]
                    if sp.expand(r["S"][0, a, i, j] - q @ k / sp.sqrt(d_k)) != 0:
                        return Proof("refuted", size, f"S[{a},{i},{j}] != <q_i, k_j>/sqrt(d_k)")
    return Proof("proven", CHAIN_SIZES)


def _prove_context_rowwise() -> Proof:
    """Row i of softmax(Q K^T / sqrt(d_k)) V is sum_j softmax_j(q_i . k_j / sqrt(d_k)) v_j
    (the slides' per-query form), and each row of weights sums to 1."""
    for size in HEAD_SIZES:
        r = head_forward(size)
        T, d_k = size
        rows = []
        for i in range(T):
            w = softmax_rows(np.array([r["S"][i, j] for j in range(T)], dtype=object))
            rows.append(sum((w[j] * r["V"][j] for j in range(T)), np.zeros(d_k, dtype=object)))
        row_form, _, aux = exp_to_symbols(np.array(rows, dtype=object), r["S"])
        matrix_form, _, _ = exp_to_symbols(r["C"], r["S"])
        ok, detail = compare(matrix_form, row_form, aux)
        weights, _, _ = exp_to_symbols(r["P"].sum(axis=-1), r["S"])
        if not ok or not all(is_zero(e - 1) for e in weights):
            return Proof("refuted", size, detail or "a row of weights does not sum to 1")
    return Proof("proven", HEAD_SIZES)


def _prove_sqrt_d() -> Proof:
    """The slides scale single-head scores by sqrt(d); with A heads the per-head width is
    d_k = d / A, and sqrt(d) = sqrt(d_k) exactly when A = 1."""
    d, A = sp.symbols("d A", positive=True, integer=True)
    ratio = sp.sqrt(d / A) / sp.sqrt(d)  # (score / sqrt(d)) / (score / sqrt(d_k))
    at_one = sp.simplify(ratio.subs(A, 1))
    at_minibert = ratio.subs({d: 192, A: 4})
    if at_one != 1:
        return Proof("refuted", ("symbolic",), "sqrt(d) != sqrt(d_k) even for one head")
    return Proof("convention", (1, 4),
                 f"one head (the slides): sqrt(d) = sqrt(d_k), proven; Mini-BERT (d=192, A=4): "
                 f"dividing by sqrt(192) instead of sqrt(48) scales every score by {at_minibert} "
                 "(refuted for A > 1)")


def _prove_seed001_dV() -> Proof:
    """NumPy-Transformer document §2.1 defines dY as the gradient after W^O, then writes
    dV = Â^T dY and dÂ = dY V^T.  Through the output projection the right forms are
    dV_h = Â_h^T (dY W_O^T)_h and dÂ_h = (dY W_O^T)_h V_h^T; the stated ones skip W_O^T."""
    size = (1, 2, 2, 1)
    r = chain(size, bias=False)
    derived, E, aux = exp_to_symbols(vjp(r["y"], r["dy"], r["W"]["W_v"]), r["S"])
    P = E / E.sum(axis=-1, keepdims=True)
    stated_dv = merge(P.transpose(0, 1, 3, 2) @ split(r["dy"], r["A"]))  # Â^T dY
    stated = r["x"].reshape(-1, 2).T @ stated_dv.reshape(-1, 2)  # -> dW_V = X^T dV
    found = counterexample(derived, stated, aux)
    if found is None:
        return Proof("proven", size)
    values, a, b = found
    return Proof("refuted", size,
                 f"B=1, T=2, H=2, one head, at {fmt_values(values)}: dW_V by sympy.diff "
                 f"{fmt_array(a)}, with dV = Â^T dY {fmt_array(b)}; correct if dY is read as the "
                 "gradient of the concatenated heads (before W^O)")


def _at_identity_wo(size) -> tuple[bool, str]:
    """:func:`compare` of the layer at W_o = I (no biases) with merge(C)."""
    r = chain(size, bias=False)
    ident = {w: (1 if i == j else 0) for (i, j), w in np.ndenumerate(r["W"]["W_o"])}
    return compare(np.vectorize(lambda e: sp.sympify(e).xreplace(ident),
                                otypes=[object])(r["y"]), r["ctx"])


def _prove_blog_no_wo() -> Proof:
    """The blog passes concat(heads) to the residual without an output projection; that is the
    general layer with W_O = I, b_O = 0 (proven), i.e. one parameter matrix fewer than BERT."""
    ok, detail = _at_identity_wo((1, 2, 2, 2))
    if not ok:
        return Proof("refuted", (1, 2, 2, 2), detail)
    return Proof("convention", (1, 2, 2, 2),
                 "no W^O: equal to the reference's layer with W_o = I, b_o = 0 (proven); BERT-base "
                 "has a learned [768, 768] output projection, which the blog omits")


# --------------------------------------------------------------------------- SymPy <-> code
GRAD_NAMES = ("dx", "dW_q", "dW_k", "dW_v", "dW_o", "db_q", "db_k", "db_v", "db_o")


@maps_cache
def _head_fns(size, causal: bool = False):
    """A head's map and its sympy.diff gradients (E = exp(score) put back), lambdified:
    (Q, K, V, dC) -> (C, dQ, dK, dV)."""
    r = head(size, causal)
    inputs = dict(Q=r["Q"], K=r["K"], V=r["V"], dC=r["dC"])
    return lambdify_map(inputs, [r["C"], r["dQ"], r["dK"], r["dV"]], r["aux"])


def _fns(size, causal: bool = False):
    """The layer from its stages: the affine projections (whose gradients are the proven
    linear.* entries, exact in NumPy) around the lambdified SymPy head map and its sympy.diff
    backward, head by head.  Deriving the whole layer symbolically costs ~20 s per size.  A
    ``W_o`` of None: no output projection (y = merge(C)); ``causal``: the causal head map."""
    B, T, H, A = size
    f = _head_fns((T, H // A), causal) if causal else _head_fns((T, H // A))

    def heads(x, W_q, W_k, W_v, b_q, b_k, b_v, dC=None):
        q, k, v = (split(x @ W + b, A) for W, b in ((W_q, b_q), (W_k, b_k), (W_v, b_v)))
        dC = np.zeros_like(q) if dC is None else dC
        out = [[f(Q=q[i, a], K=k[i, a], V=v[i, a], dC=dC[i, a]) for a in range(A)]
               for i in range(B)]
        return [np.array([[o[n] for o in row] for row in out]) for n in range(4)]

    def forward(x, W_q, W_k, W_v, W_o, b_q, b_k, b_v, b_o, dy):
        C = heads(x, W_q, W_k, W_v, b_q, b_k, b_v)[0]
        return (merge(C) if W_o is None else merge(C) @ W_o + b_o,)

    def backward(x, W_q, W_k, W_v, W_o, b_q, b_k, b_v, b_o, dy):
        C = heads(x, W_q, W_k, W_v, b_q, b_k, b_v)[0]
        ctx = merge(C)
        if W_o is None:  # y = merge(C): the context gradient is dy itself
            W_o = np.eye(H)
        dC = split(dy @ W_o.T, A)
        _, dQ, dK, dV = (merge(t) for t in heads(x, W_q, W_k, W_v, b_q, b_k, b_v, dC))
        flat = x.reshape(-1, H)
        dW = [flat.T @ d.reshape(-1, H) for d in (dQ, dK, dV)]
        db = [d.reshape(-1, H).sum(axis=0) for d in (dQ, dK, dV)]
        dx = dQ @ W_q.T + dK @ W_k.T + dV @ W_v.T
        dW_o = ctx.reshape(-1, H).T @ dy.reshape(-1, H)
        return (dx, *dW, dW_o, *db, dy.reshape(-1, H).sum(axis=0))

    return dict(y=forward, grads=backward)


def _inputs(size):
    B, T, H, A = size
    spec = dict(x=("float", (B, T, H), 2.0), dy=("float", (B, T, H), 1.0))
    spec.update({n: ("float", (H, H), 1.5) for n in ("W_q", "W_k", "W_v", "W_o")})
    spec.update({n: ("float", (H,), 1.0) for n in ("b_q", "b_k", "b_v", "b_o")})
    return spec


def _sympy(picks, causal: bool = False):
    """The SymPy side: the outputs named by ``picks`` ("y" the layer's output, the others
    GRAD_NAMES'); absent biases (None: declared_pieces) are zero."""
    def build(size):
        fns = _fns(size, causal)
        zero = np.zeros(size[2])

        def run(x, W_q, W_k, W_v, W_o, b_q, b_k, b_v, b_o, dy):
            args = dict(x=x, W_q=W_q, W_k=W_k, W_v=W_v, W_o=W_o,
                        b_q=zero if b_q is None else b_q, b_k=zero if b_k is None else b_k,
                        b_v=zero if b_v is None else b_v,
                        b_o=zero if b_o is None and W_o is not None else b_o, dy=dy)
            grads = fns["grads"](**args) if set(picks) - {"y"} else None
            return tuple(fns["y"](**args)[0] if n == "y" else grads[GRAD_NAMES.index(n)]
                         for n in picks)
        return run
    return build


def _code(picks, causal: bool = False):
    """The code side: impl.attention_forward (and attention_backward when a gradient is
    picked), the outputs named by ``picks`` as in :func:`_sympy`."""
    def code(impl, size, x, W_q, W_k, W_v, W_o, b_q, b_k, b_v, b_o, dy):
        y, cache_ = impl.attention_forward(x, W_q, W_k, W_v, W_o, b_q, b_k, b_v, b_o,
                                           n_heads=size[3], **({"causal": True} if causal
                                                               else {}))
        grads = impl.attention_backward(dy, cache_) if set(picks) - {"y"} else None
        return tuple(y if n == "y" else grads[GRAD_NAMES.index(n)] for n in picks)
    return code


def _numeric(picks=("y",)):
    return Numeric(NUMERIC_SIZES, _inputs, _sympy(picks), _code(picks),
                   needs=("attention_forward",) + (("attention_backward",)
                                                   if set(picks) - {"y"} else ()))


TORCH = "torch.nn.functional.multi_head_attention_forward"
register(Equation(
    "attention.qkv", "Q, K, V projections (fused, split into heads)",
    (f"{MINIBERT} §2.2", f"{SEED001} §1.2", f"{SLIDES} (step 2)", f"{BLOG} (forward)",
     f"{GUIDE} §3"),
    r"Q = X W^Q + b^Q,\ K = X W^K + b^K,\ V = X W^V + b^V;\ Q_h = X W^Q_{[:, h d_k:(h+1) d_k]}",
    _prove_qkv, torch_op=TORCH, numeric=_numeric(),
    note="biases: the NumPy-Transformer document has them, Mini-BERT and the slides do not; the "
         "reference supports both (attn_bias)",
    uses=("linear.forward", "attention.split_heads")))
register(Equation(
    "attention.split_heads", "Split into heads", (f"{MINIBERT} §2.2", f"{GUIDE} §3"),
    r"[B,T,H] \to [B,T,A,d_k] \to [B,A,T,d_k],\ \text{head } a = \text{features } a d_k .. "
    r"(a+1) d_k - 1",
    _prove_split, gradient=True,
    numeric=Numeric(((1, 2, 2, 1), (2, 3, 2, 2)), lambda s: dict(x=("float", (s[0], s[1],
                                                                              s[2] * s[3]), 2.0)),
                    lambda s: (lambda x: (split(x, s[2]),)),
                    lambda impl, s, x: (impl.split_heads(x, s[2]),), needs=("split_heads",)),
    note="a permutation: its backward is merge_heads (adjoint, proven)"))
register(Equation(
    "attention.merge_heads", "Concatenate heads", (f"{MINIBERT} §2.2", f"{SEED001} §1.2",
                                                   f"{BLOG} (forward)", f"{GUIDE} §3"),
    r"[B,A,T,d_k] \to [B,T,A,d_k] \to [B,T,H] = \mathrm{Concat}(\mathrm{head}_1..\mathrm{head}_A)",
    _prove_split, gradient=True,
    numeric=Numeric(((1, 2, 2, 1), (2, 3, 2, 2)), lambda s: dict(x=("float", s, 2.0)),
                    lambda s: (lambda x: (merge(x),)),
                    lambda impl, s, x: (impl.merge_heads(x),), needs=("merge_heads",))))
register(Equation(
    "attention.merge_heads.reshape_only", "Context concat written as a bare reshape",
    (f"{MINIBERT} §2.2",),
    r"\mathrm{Context\_concat} = \mathrm{reshape}(\mathrm{Context}, [B,T,H])",
    lambda: _prove_reshape_only("merge"), kind="document", expected="refuted",
    target="attention.merge_heads"))
register(Equation(
    "attention.backward.split_reshape_only", "Head split of the gradient as a bare reshape",
    (f"{MINIBERT} §3.4",),
    r"\mathrm{grad\_context\_heads} = \mathrm{reshape}(\mathrm{grad\_context}, [B,A,T,d_k])",
    lambda: _prove_reshape_only("split"), kind="document", expected="refuted",
    target="attention.split_heads"))
register(Equation(
    "attention.scores", "Scaled dot-product scores",
    (f"{MINIBERT} §2.2", f"{SEED001} §1.2", f"{SLIDES} (basic formula)", f"{BLOG} (forward)",
     f"{GUIDE} §3"),
    r"S = \frac{Q_h K_h^\top}{\sqrt{d_k}},\ S_{ij} = \frac{\langle q_i, k_j \rangle}{\sqrt{d_k}}",
    _prove_scores, torch_op=TORCH, numeric=_numeric(),
    uses=("attention.qkv",)))
register(Equation(
    "attention.scores.sqrt_d", "Scores scaled by sqrt(d)", (f"{SLIDES} (step 2)",),
    r"A^{(\ell)} = \mathrm{softmax}\Bigl(\frac{Q K^\top}{\sqrt d}\Bigr) V",
    _prove_sqrt_d, kind="document", expected="convention", target="attention.scores"))
register(Equation(
    "attention.context", "Attention-weighted values",
    (f"{MINIBERT} §2.2", f"{SEED001} §1.2", f"{SLIDES} (steps 2-3, full interpretation)",
     f"{BLOG} (forward)", f"{GUIDE} §3"),
    r"C = \mathrm{softmax}(S) V_h,\ c_i = \sum_j \mathrm{softmax}_j(\langle q_i, k_j \rangle / "
    r"\sqrt{d_k})\, v_j",
    _prove_context_rowwise, torch_op=TORCH, numeric=_numeric(),
    uses=("attention.scores", "softmax.forward")))
register(Equation(
    "attention.output", "Output projection", (f"{MINIBERT} §2.2", f"{SEED001} §1.2",
                                              f"{GUIDE} §3"),
    r"Y = \mathrm{Concat}(C_1..C_A) W^O + b^O", _prove_dW_o, torch_op=TORCH,
    numeric=_numeric(),
    uses=("attention.context", "attention.merge_heads", "linear.forward")))
register(Equation(
    "attention.output.no_projection", "Heads concatenated without W^O", (f"{BLOG} (forward)",),
    r"\tilde Z_l = \mathrm{concat}(Z_{1,l}, .., Z_{A,l})", _prove_blog_no_wo, kind="document",
    expected="convention", target="attention.output"))

for _id, _title, _src, _latex, _proof, _picks, _uses in (
    ("attention.backward.dW_o", "Output projection gradients",
     (f"{MINIBERT} §3.4", f"{SEED001} §2.1"),
     r"\frac{\partial L}{\partial W^O} = C^\top \delta Y,\ \delta C = \delta Y (W^O)^\top",
     _prove_dW_o, ("dW_o", "db_o"),
     ("attention.output", "linear.backward.dx", "linear.backward.dW", "linear.backward.db")),
    ("attention.backward.dV", "Value gradient", (f"{MINIBERT} §3.4",),
     r"\delta V_h = P^\top \delta C_h", lambda: _prove_head("dV"), ("dW_v", "db_v"),
     ("attention.context", "attention.backward.dW_o")),
    ("attention.backward.dP", "Attention-weight gradient", (f"{MINIBERT} §3.4",),
     r"\delta P = \delta C_h V_h^\top", _prove_dP, ("dW_q", "dW_k"),
     ("attention.context", "attention.backward.dW_o")),
    ("attention.backward.dS", "Score gradient (softmax JVP)",
     (f"{MINIBERT} §3.4", f"{SEED001} §2.1"),
     r"\delta S = P \odot (\delta P - \mathrm{rowsum}(P \odot \delta P))", _prove_dS,
     ("dW_q", "dW_k"), ("attention.backward.dP", "softmax.backward")),
    ("attention.backward.dQ", "Query gradient", (f"{MINIBERT} §3.4", f"{SEED001} §2.1"),
     r"\delta Q_h = \frac{\delta S}{\sqrt{d_k}} K_h", lambda: _prove_head("dQ"),
     ("dW_q", "db_q"), ("attention.scores", "attention.backward.dS")),
    ("attention.backward.dK", "Key gradient", (f"{MINIBERT} §3.4", f"{SEED001} §2.1"),
     r"\delta K_h = \Bigl(\frac{\delta S}{\sqrt{d_k}}\Bigr)^\top Q_h", lambda: _prove_head("dK"),
     ("dW_k", "db_k"), ("attention.scores", "attention.backward.dS")),
    ("attention.backward.dx", "Input gradient through the three projections",
     (f"{MINIBERT} §3.4", f"{SEED001} §2.1"),
     r"\delta X = \delta Q (W^Q)^\top + \delta K (W^K)^\top + \delta V (W^V)^\top,\ "
     r"\frac{\partial L}{\partial W^Q} = X^\top \delta Q", _prove_dx, ("dx", "dW_q"),
     ("attention.qkv", "attention.backward.dQ", "attention.backward.dK", "attention.backward.dV",
      "attention.merge_heads", "linear.backward.dx", "linear.backward.dW",
      "linear.backward.db")),
):
    register(Equation(_id, _title, _src, _latex, _proof, gradient=True, torch_op=TORCH,
                      numeric=_numeric(_picks), uses=_uses))

register(Equation(
    "attention.backward.dV.after_WO", "dV = Â^T dY with dY taken after W^O", (f"{SEED001} §2.1",),
    r"\delta Y \triangleq \frac{\partial L}{\partial(\text{after } W^O)},\ \delta V = "
    r"\hat A^\top \delta Y,\ \delta \hat A = \delta Y V^\top",
    _prove_seed001_dV, kind="document", expected="refuted", target="attention.backward.dV"))


# --------------------------------------------------------------------------- variants' SymPy
VARIANT = PROTOCOL_VARIANTS
# The attention variants an implementation may declare (spec/protocol/variants.py), each
# checked against the same stage maps: no output projection, causal, one head, per-head
# projections.  Outputs: y, dx and the projection gradients dW_q, dW_k, dW_v.
VARIANT_OUTPUTS = ("dx", "dW_q", "dW_k", "dW_v")
SINGLE_SIZES = ((2, 2, 2, 1), (1, 3, 3, 1))  # (B, T, H, A = 1)


def declared_pieces(caps, arrays):
    """The attention's inputs in the form the implementation declares: zero biases for one
    without them (its call passes None), W_o = b_o = None for one without the output
    projection -- on both sides, so SymPy evaluates the form the code is called in."""
    out = dict(arrays)
    if not caps["attention_bias"]:
        out.update({n: None for n in ("b_q", "b_k", "b_v", "b_o")})
    if True not in caps["attention"]["W_o"]:
        out["W_o"] = out["b_o"] = None
    return out


def _variant_numeric(sizes, variant, causal=False):
    picks = ("y",) + VARIANT_OUTPUTS
    return Numeric(sizes, _inputs, _sympy(picks, causal), _code(picks, causal),
                   needs=("attention_forward", "attention_backward"), variant=variant,
                   adapt=declared_pieces)


def _prove_noproj() -> Proof:
    """Without W^O the layer's output is the merged context, y = merge(C): the general layer
    at W^O = I, b^O = 0, so its backward hands dy to the heads unchanged (dC = split(dy)) and
    every other gradient is the general one's there (B=1, T=2, H=2, A=1, 2)."""
    for size in CHAIN_SIZES:
        ok, detail = _at_identity_wo(size)
        if not ok:
            return Proof("refuted", size, detail)
    return Proof("proven", CHAIN_SIZES, "y = merge(C) is the layer at W_o = I, b_o = 0: "
                                        "dC = split(dy), the rest of the chain unchanged")


def _prove_single_head() -> Proof:
    """One head (A = 1): split and merge are the identity reshapes [B, T, H] <-> [B, 1, T, H]
    and the scores are scaled by 1/sqrt(H) (d_k = H): the head map on the whole width."""
    for B, T, H in ((1, 2, 2), (2, 3, 3)):
        x = arr("x", B, T, H)
        if not np.array_equal(merge(split(x, 1)), x) or \
                not np.array_equal(split(x, 1)[:, 0], x):
            return Proof("refuted", (B, T, H), "split/merge with A = 1 is not the identity")
        if head_forward((T, H))["scale"] != 1 / sp.sqrt(H):
            return Proof("refuted", (T, H), "d_k != H for one head")
    return Proof("proven", ((1, 2, 2), (2, 3, 3)), "A = 1: split/merge are identities, "
                                                   "d_k = H")


def _prove_per_head() -> Proof:
    """Per-head projections W[a] [H, d_k] are the fused [H, H] projection's columns a*d_k ..
    (a+1)*d_k - 1: split(x W, A)[:, a] = x W[a], and the output projection's rows likewise:
    merge(C) W_o = sum_a C_a W_o[a] with W_o[a] [d_k, H] its rows a*d_k.. (symbolic, H = 4,
    A = 2)."""
    B, T, H, A = 1, 2, 4, 2
    d = H // A
    x, W, Wo = arr("x", B, T, H), arr("W", H, H), arr("Wo", H, H)
    C = arr("C", B, A, T, d)
    for a in range(A):
        per = W[:, a * d:(a + 1) * d]  # head a's [H, d_k] projection
        if not np.array_equal(split(x @ W, A)[:, a], x @ per):
            return Proof("refuted", (B, T, H, A), f"head {a}: split(x W) != x W[a]")
    fused = merge(C) @ Wo
    per_head = sum(C[:, a] @ Wo[a * d:(a + 1) * d] for a in range(A))
    ok, detail = compare(fused, per_head)
    if not ok:
        return Proof("refuted", (B, T, H, A), detail)
    return Proof("proven", ((B, T, H, A),), "W[a] = W[:, a d_k:(a+1) d_k], W_o[a] = "
                                            "W_o[a d_k:(a+1) d_k]: the same layer")


register(Equation(
    "attention.noproj", "Attention without the output projection (forward and gradients)",
    (VARIANT, f"{BLOG} (forward)"),
    r"Y = \mathrm{Concat}(C_1..C_A),\ \delta C_h = \mathrm{split}(\delta Y)_h",
    _prove_noproj, gradient=True, torch_op=TORCH + "(out_proj = I)",
    numeric=_variant_numeric(NUMERIC_SIZES, {"attention.W_o": False}),
    note="a variant of the protocol (CAPABILITIES attention W_o=False): W_o = b_o = None",
    uses=("attention.context", "attention.merge_heads", "attention.backward.dV",
          "attention.backward.dQ", "attention.backward.dK", "attention.backward.dx")))
register(Equation(
    "attention.single_head", "Single-head attention (A = 1, no n_heads)",
    (VARIANT, f"{SLIDES} (step 2)"),
    r"Y = \mathrm{softmax}\Bigl(\frac{Q K^\top}{\sqrt{H}}\Bigr) V W^O + b^O",
    _prove_single_head, gradient=True, torch_op=TORCH + "(num_heads=1)",
    numeric=_variant_numeric(SINGLE_SIZES, {"attention.heads": "single"}),
    note="a variant of the protocol (CAPABILITIES attention heads='single'): the call takes "
         "no n_heads; the suite draws one head",
    uses=("attention.scores", "attention.context", "attention.output",
          "attention.backward.dx")))
register(Equation(
    "attention.per_head", "Per-head projections are the fused projection's column blocks",
    (VARIANT,),
    r"W^Q_a = W^Q_{[:,\,a d_k:(a+1) d_k]},\ \mathrm{Concat}(C_a) W^O = \sum_a C_a "
    r"W^O_{[a d_k:(a+1) d_k,\,:]}",
    _prove_per_head, torch_op=TORCH,
    numeric=_variant_numeric(NUMERIC_SIZES, {"attention.heads": "per_head"}),
    note="a variant of the protocol (CAPABILITIES attention heads='per_head'): the suite "
         "converts the [H, H] weights to [A, H, d_k] and the gradients back "
         "(minibert_spec.protocol.variants.to_per_head)",
    uses=("attention.split_heads", "attention.merge_heads", "attention.qkv",
          "attention.output")))


# --------------------------------------------------------------------------- causal variant
def _prove_causal() -> Proof:
    """The causal mask as the code applies it (scores of keys j > i set to -inf before the
    softmax) is the softmax restricted to keys j <= i: with a finite -L in their place the row
    tends to the restricted softmax as L -> oo (T = 3, one feature).  Then y_i depends on x_j
    for j <= i only: dy_i/dx_j = 0 for j > i, and dy_i/dx_0 != 0 (causal, not cut off)."""
    T = 3
    x = arr("x", T)
    wq, wk, wv = sp.symbols("w_q w_k w_v", real=True)
    L = sp.Symbol("L", positive=True)
    q, k, v = x * wq, x * wk, x * wv
    y = []
    for i in range(T):
        s = [q[i] * k[j] for j in range(T)]
        big = [sp.exp(s[j] - (L if j > i else 0)) for j in range(T)]
        masked = sp.Add(*[big[j] * v[j] for j in range(T)]) / sp.Add(*big)
        restricted = (sp.Add(*[sp.exp(s[j]) * v[j] for j in range(i + 1)])
                      / sp.Add(*[sp.exp(s[j]) for j in range(i + 1)]))
        if not is_zero(sp.limit(masked, L, sp.oo) - restricted):
            return Proof("refuted", (T,), f"row {i}: the -L masked softmax does not tend to "
                                          "the restricted one")
        y.append(restricted)
    for i in range(T):
        for j in range(i + 1, T):
            if sp.diff(y[i], x[j]) != 0:
                return Proof("refuted", (T,), f"dy_{i}/dx_{j} != 0 for a later position")
    if is_zero(sp.diff(y[T - 1], x[0])):
        return Proof("refuted", (T,), "the last position does not depend on the first")
    return Proof("proven", (T,), "masking with -L -> -oo is the softmax over keys j <= i; "
                                 "dy_i/dx_j = 0 for j > i and dy_2/dx_0 != 0")


register(Equation(
    "attention.causal", "Causal attention mask", (VARIANT,),
    r"P_{ij} = \frac{e^{S_{ij}} [j \le i]}{\sum_{k \le i} e^{S_{ik}}},\ "
    r"\frac{\partial y_i}{\partial x_j} = 0\ (j > i)",
    _prove_causal, gradient=True,
    torch_op="torch.nn.functional.multi_head_attention_forward(attn_mask=causal)",
    numeric=_variant_numeric(NUMERIC_SIZES, {"attention.causal": True}, causal=True),
    note="a variant of the protocol for GPT-style implementations (CAPABILITIES attention."
         "causal); combined with a key mask, key 0 must stay attendable",
    uses=("attention.scores", "softmax.forward")))
