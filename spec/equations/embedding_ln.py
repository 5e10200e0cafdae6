"""BERT's embedding layer: LayerNorm of the sum of token, position and token-type embeddings.

The blog and the Mini-BERT derivation feed token + position straight into the first block;
BERT normalises the sum first (embeddings.LayerNorm).  The LayerNorm's own backward is proven
in layernorm.py; what is new here is how its input gradient dE reaches the three tables: the
sum is linear in each table, so dW_word = onehot(ids)^T dE, dW_pos[t] = sum_b dE[b, t] (zero
for unused positions) and dW_type = onehot(type_ids)^T dE -- proven with sympy.diff below, and
the whole composite (LayerNorm included) checked against the code by the SymPy <-> code check.
"""

from __future__ import annotations

import numpy as np

from minibert_spec.equations import Equation, Proof, register
from minibert_spec.equations._cache import maps_cache
from minibert_spec.equations._code import fb_checks
from minibert_spec.equations._nn import LN_EPS, ln_row
from minibert_spec.equations._sym import arr, compare, forward_backward_maps, vjp
from minibert_spec.equations.embedding import onehot, scatter_add_rows
from minibert_spec.tolerances import LN_MIN_VAR

BERT = "BERT (embeddings.LayerNorm)"
CASE = ((0, 2, 2), (1, 0, 2)), ((0, 0, 1), (1, 1, 1)), 3, 2, 2, 4  # ids, type_ids, V, n, H, T_max
NUMERIC_SIZES = ((3, 2, 3, 2, 2, 3), (2, 2, 3, 1, 3, 3))  # (V, n_types, H, B, T, T_max)


def _sum(O_w, W, P, T, O_t, Wt):
    return O_w @ W + P[:T] + O_t @ Wt  # [B, T, H]


def _prove() -> Proof:
    ids, type_ids, V, n, H, T_max = CASE
    ids, type_ids = np.array(ids), np.array(type_ids)
    B, T = ids.shape
    W, P, Wt, dE = arr("W", V, H), arr("P", T_max, H), arr("Wt", n, H), arr("dE", B, T, H)
    e = _sum(onehot(ids, V).astype(object), W, P, T, onehot(type_ids, n).astype(object), Wt)
    positions = np.broadcast_to(np.arange(T), (B, T))
    closed = {"W": scatter_add_rows(ids, dE, V), "P": scatter_add_rows(positions, dE, T_max),
              "Wt": scatter_add_rows(type_ids, dE, n)}
    for name, table in (("W", W), ("P", P), ("Wt", Wt)):
        ok, detail = compare(vjp(e, dE, table), closed[name])
        if not ok:
            return Proof("refuted", (V, n, H, T_max), f"d{name}: {detail}")
    return Proof("proven", (V, n, H, T_max), "dE scattered to each table by its own ids")


@maps_cache
def _fns(size):
    V, n, H, B, T, T_max = size
    O_w, O_t = arr("Ow", B, T, V), arr("Ot", B, T, n)
    W, P, Wt = arr("W", V, H), arr("P", T_max, H), arr("Wt", n, H)
    gamma, beta, dy = arr("g", H), arr("be", H), arr("dy", B, T, H)
    e = _sum(O_w, W, P, T, O_t, Wt)
    y = np.empty((B, T, H), dtype=object)
    for b in range(B):
        for t in range(T):
            y[b, t] = ln_row(list(e[b, t]), gamma, beta)
    inputs = dict(O_w=O_w, O_t=O_t, W=W, P=P, Wt=Wt, gamma=gamma, beta=beta, dy=dy)
    return forward_backward_maps(inputs, y, dy, (W, P, Wt, gamma, beta))


def _inputs(size):
    V, n, H, B, T, T_max = size
    return dict(ids=("int", (B, T), V), type_ids=("int", (B, T), n), W=("float", (V, H), 2.0),
                P=("float", (T_max, H), 2.0), Wt=("float", (n, H), 2.0),
                gamma=("float", (H,), 2.0), beta=("float", (H,), 1.0),
                dy=("float", (B, T, H), 1.0))


def _accept(size, ids, type_ids, W, P, Wt, **_):
    e = W[ids] + P[: ids.shape[1]] + Wt[type_ids]
    return bool(np.min(e.var(axis=-1)) >= LN_MIN_VAR)


def _sympy(which):
    def build(size):
        f = _fns(size)[which]
        return lambda ids, type_ids, **a: f(O_w=onehot(ids, size[0]),
                                            O_t=onehot(type_ids, size[1]), **a)
    return build


FWD, BWD = fb_checks(NUMERIC_SIZES, _inputs, _sympy, "embedding_ln_forward",
                     "embedding_ln_backward", ("ids", "type_ids", "W", "P", "Wt", "gamma", "beta"),
                     "dy", float(LN_EPS), accept=_accept,
                     needs=("embedding_ln_forward", "embedding_ln_backward"))
register(Equation(
    "embedding_ln.forward", "Embedding LayerNorm of token + position + token type", (BERT,),
    r"E = \mathrm{LN}(W_{tok}[\mathrm{ids}] + W_{pos}[:T] + W_{type}[\mathrm{type\_ids}])",
    _prove, torch_op="torch.nn.functional.layer_norm",
    numeric=FWD,
    uses=("embedding.forward", "position.learned.forward", "token_type.forward",
          "layernorm.forward")))
register(Equation(
    "embedding_ln.backward", "Embedding LayerNorm gradients to the three tables", (BERT,),
    r"dW_{tok} = \mathrm{onehot}(\mathrm{ids})^\top dE,\ dW_{pos}[t] = \sum_b dE[b,t],\ "
    r"dW_{type} = \mathrm{onehot}(\mathrm{type\_ids})^\top dE", _prove, gradient=True,
    torch_op="torch.nn.functional.layer_norm",
    numeric=BWD,
    uses=("embedding_ln.forward", "layernorm.backward.dx", "layernorm.backward.dgamma",
          "layernorm.backward.dbeta", "embedding.backward", "position.learned.backward",
          "token_type.backward")))
