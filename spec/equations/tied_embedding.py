"""The tied token embedding and LM head: one table W_E [V, H] used for the lookup
e = W_E[ids] and for the logits (e + x) W_E^T, and its gradient, the sum of both uses.

GPT-2 (and BERT's MLM decoder, spec/equations/mlm_head.py) ties its output projection to the
token embedding; a hand-written backward that keeps one of the two shares of dW_E ("counted
once") trains a different model.  x is what the body between the two uses adds to the residual
stream (the block rows check the body itself).  As in loss.py, the SymPy map takes the ids as a
one-hot matrix O, so the lookup is O W_E and ``sympy.diff`` sees W_E in both places.
"""

from __future__ import annotations

import numpy as np

from minibert_spec.equations import Equation, Numeric, Proof, register
from minibert_spec.equations._cache import maps_cache
from minibert_spec.equations._code import op_check
from minibert_spec.equations._sym import arr, compare, forward_backward_maps, is_zero, vjp
from minibert_spec.sources import PROTOCOL_VARIANTS

# (ids [N tokens], V, H): repeated ids and an unused row in each
CASES = (((0, 2, 2), 4, 2), ((1, 0, 1, 3), 5, 1), ((2, 2), 3, 3))
NUMERIC_SIZES = ((1, 3, 3, 2), (2, 2, 4, 3))  # (B, T, V, H)


def tied(O: np.ndarray, x: np.ndarray, W_E: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(logits, h): h = O W_E + x (the lookup of the ids O one-hot encodes, plus x) and
    logits = h W_E^T, for N tokens."""
    h = O @ W_E + x  # [N, H]
    return h @ W_E.T, h  # [N, V]


def _prove() -> Proof:
    """sympy.diff gives dx = dlogits W_E and dW_E = O^T (dlogits W_E) + dlogits^T h -- the
    lookup's share scattered to the rows of the ids (repeated ids add up) plus the head's
    share; and neither share alone is the gradient (both uses carry gradient here)."""
    for ids, V, H in CASES:
        N = len(ids)
        O = np.eye(V, dtype=int)[list(ids)]
        x, W_E, dlogits = arr("x", N, H), arr("W", V, H), arr("dz", N, V)
        logits, h = tied(O, x, W_E)
        derived = vjp(logits, dlogits, W_E)
        lookup, head = O.T @ (dlogits @ W_E), dlogits.T @ h
        ok, detail = compare(derived, lookup + head)
        if not ok:
            return Proof("refuted", (N, V, H), f"ids={ids}: dW_E: {detail}")
        ok, detail = compare(vjp(logits, dlogits, x), dlogits @ W_E)
        if not ok:
            return Proof("refuted", (N, V, H), f"ids={ids}: dx: {detail}")
        for name, share in (("lookup", lookup), ("head", head)):
            if all(is_zero(e) for e in np.ravel(derived - share)):
                return Proof("refuted", (N, V, H), f"ids={ids}: the {name} share alone is the "
                                                   "gradient: the case does not tell them apart")
    return Proof("proven", tuple((len(i), V, H) for i, V, H in CASES),
                 "dW_E = scatter(ids, dlogits W_E) + dlogits^T h; neither share alone")


# --------------------------------------------------------------------------- SymPy <-> code
@maps_cache
def _fns(size):
    B, T, V, H = size
    N = B * T
    O, x, W_E, dz = arr("O", N, V), arr("x", N, H), arr("W_E", V, H), arr("dz", N, V)
    logits = tied(O, x, W_E)[0]
    return forward_backward_maps(dict(O=O, x=x, W_E=W_E, dz=dz), logits, dz, [x, W_E])


def _inputs(size):
    B, T, V, H = size
    return dict(ids=("int", (B, T), V), x=("float", (B, T, H), 2.0),
                W_E=("float", (V, H), 2.0), dz=("float", (B, T, V), 1.0))


def _sympy(which: int):
    def build(size):
        B, T, V, H = size
        fns = _fns(size)

        def run(ids, x, W_E, dz):
            out = fns[which](O=np.eye(V)[ids.reshape(-1)], x=x.reshape(-1, H), W_E=W_E,
                             dz=dz.reshape(-1, V))
            if which == 0:
                return (out[0].reshape(B, T, V),)
            return out[0].reshape(B, T, H), out[1]
        return run
    return build


def _numeric(which: int) -> Numeric:
    return op_check(which, NUMERIC_SIZES, _inputs, _sympy(which), "tied_embedding_forward",
                    "tied_embedding_backward", lambda ids, x, W_E, dz: ((ids, x, W_E), {}), "dz",
                    pick=slice(None))


register(Equation(
    "tied_embedding.forward", "Tied token embedding and LM head", (PROTOCOL_VARIANTS,),
    r"h = W_E[\mathrm{ids}] + x,\quad \mathrm{logits} = h\,W_E^\top", _prove,
    torch_op="torch.nn.functional.embedding + linear on one tensor (GPT-2's tie_weights)",
    numeric=_numeric(0),
    note="GPT-2's wte is also its lm_head; x is what the body adds to the residual stream",
    uses=("embedding.forward", "linear.forward")))
register(Equation(
    "tied_embedding.backward", "Tied embedding gradient: both uses summed", (PROTOCOL_VARIANTS,),
    r"\frac{\partial L}{\partial W_E} = \sum_{t:\ \mathrm{ids}_t = v} "
    r"\Bigl(\frac{\partial L}{\partial \mathrm{logits}} W_E\Bigr)_t + "
    r"\Bigl(\frac{\partial L}{\partial \mathrm{logits}}\Bigr)^{\!\top} h,\quad "
    r"\frac{\partial L}{\partial x} = \frac{\partial L}{\partial \mathrm{logits}} W_E",
    _prove, gradient=True,
    torch_op="torch.nn.functional.embedding + linear on one tensor (GPT-2's tie_weights)",
    numeric=_numeric(1), uses=("tied_embedding.forward", "embedding.backward",
                               "linear.backward.dx", "linear.backward.dW")))
