"""Token embeddings: the lookup and its scatter-add gradient.

A lookup W[ids] is the linear map onehot(ids) @ W, so its backward is onehot^T @ dout: the
scatter-add over repeated ids.  The SymPy map takes the one-hot matrix O as symbols and the
SymPy <-> code check feeds O = onehot(ids) for the ids it drew.
"""

from __future__ import annotations

import numpy as np

from minibert_spec.equations import Equation, Proof, register
from minibert_spec.equations._cache import maps_cache
from minibert_spec.equations._code import fb_checks
from minibert_spec.equations._sym import arr, first_difference, forward_backward_maps, is_zero, vjp
from minibert_spec.sources import BLOG, MINIBERT, SLIDES

# (V, H, ids) tried by the proofs: repeated ids, an unused id
LOOKUP_CASES = ((3, 2, (0, 2, 0, 2)), (4, 3, (1, 1, 1)), (2, 2, (1, 0)))
# (V, H, B, T) of the SymPy <-> code check
NUMERIC_SIZES = ((3, 2, 2, 2), (4, 3, 1, 3), (2, 2, 3, 1))


def onehot(ids, V: int) -> np.ndarray:
    return np.eye(V, dtype=np.int64)[np.asarray(ids)]


def scatter_add_rows(ids, rows: np.ndarray, n: int) -> np.ndarray:
    """The closed form of a lookup table's gradient: out[i] = the sum of rows[k] over every
    position k with ids[k] = i (repeated ids add up, unused ids stay 0).  ids [...] ->
    [n, H] object array from rows [..., H]."""
    ids = np.asarray(ids).reshape(-1)
    rows = rows.reshape(len(ids), -1)
    out = np.zeros((n, rows.shape[1]), dtype=object)
    for k, i in enumerate(ids):
        out[i] = out[i] + rows[k]
    return out


def table_grad(out, dout, W, ids, n: int):
    """(derived, closed) of a lookup table's gradient: sympy.diff of sum(dout * out) w.r.t.
    the table ``W`` [n, H], and the scatter-add of ``dout`` over ``ids``."""
    return vjp(out, dout, W), scatter_add_rows(ids, dout, n)


def _prove_lookup_backward() -> Proof:
    for V, H, ids in LOOKUP_CASES:
        W, dout = arr("W", V, H), arr("dout", len(ids), H)
        out = onehot(ids, V).astype(object) @ W  # [n, H] -- the lookup as a matmul
        if not all(is_zero(a - b) for a, b in zip(out.ravel(), W[list(ids)].ravel())):
            return Proof("refuted", (V, H), f"onehot @ W != W[ids] for ids={ids}")
        detail = first_difference([table_grad(out, dout, W, ids, V)])
        if detail:
            return Proof("refuted", (V, H), f"ids={ids}: {detail}")
    return Proof("proven", tuple((V, H) for V, H, _ in LOOKUP_CASES),
             "lookup = onehot(ids) @ W; dW = onehot^T @ dout (repeated ids add up)")


# --------------------------------------------------------------------------- SymPy <-> code
@maps_cache
def lookup_maps(n: int, H: int, B: int, T: int, added: bool = False):
    """The forward and backward maps of a [n, H] table's lookup at [B, T], ids as a one-hot
    O [B, T, n]: onehot(ids) @ W, its gradient w.r.t. W; ``added``: x + onehot(ids) @ W (the
    token-type embedding), its gradients w.r.t. x and W."""
    O, W, dout = arr("O", B, T, n), arr("W", n, H), arr("dout", B, T, H)
    if not added:
        return forward_backward_maps(dict(O=O, W=W, dout=dout), O @ W, dout, [W])
    x = arr("x", B, T, H)
    return forward_backward_maps(dict(O=O, x=x, W=W, dout=dout), x + O @ W, dout, (x, W))


def _lookup_fns(size):
    return lookup_maps(*size)


def _lookup_inputs(size):
    V, H, B, T = size
    return dict(ids=("int", (B, T), V), W=("float", (V, H), 2.0), dout=("float", (B, T, H), 1.0))


def _lookup_sympy(which):
    def build(size):
        fns = _lookup_fns(size)
        return lambda ids, W, dout: fns[which](O=onehot(ids, size[0]), W=W, dout=dout)
    return build


LOOKUP_FWD, LOOKUP_BWD = fb_checks(NUMERIC_SIZES, _lookup_inputs, _lookup_sympy,
                                   "embedding_forward", "embedding_backward", ("ids", "W"), "dout")


register(Equation(
    "embedding.forward", "Token embedding lookup",
    (f"{MINIBERT} §2.1", f"{SLIDES} (token IDs and embedding vectors)", f"{BLOG} (initialize)"),
    r"E_{token}[b,t] = W_{tok}[\mathrm{ids}[b,t]] = (\mathrm{onehot}(\mathrm{ids}) W_{tok})[b,t]",
    _prove_lookup_backward, torch_op="torch.nn.functional.embedding",
    numeric=LOOKUP_FWD))

register(Equation(
    "embedding.backward", "Token embedding gradient (scatter-add)",
    (f"{SLIDES} (embedding update)",),
    r"\frac{\partial L}{\partial W_{tok}} = \mathrm{onehot}(\mathrm{ids})^\top "
    r"\frac{\partial L}{\partial E},\ \text{i.e. } dW[v] = "
    r"\sum_{(b,t): \mathrm{ids}[b,t]=v} dE[b,t]",
    _prove_lookup_backward, gradient=True, torch_op="torch.nn.functional.embedding",
    numeric=LOOKUP_BWD,
    note="the slides state the update E_k <- E_k - eta grad; the gradient itself is derived here",
    uses=("embedding.forward",)))
