"""The sequence classifier on the pooler (BERT-base blog's head): logits = tanh(h[:, 0] W_p +
b_p) W_c + b_c, trained with cross-entropy over the classes (loss.ce.*)."""

from __future__ import annotations

import numpy as np
import sympy as sp

from minibert_spec.equations import Equation, Proof, register
from minibert_spec.equations._cache import maps_cache
from minibert_spec.equations._code import fb_checks
from minibert_spec.equations._sym import arr, compare, forward_backward_maps, vjp
from minibert_spec.sources import BLOG

SIZES = ((2, 2, 2, 3), (1, 3, 2, 2))  # (B, T, H, C)


def _map(B, T, H, C):
    h, W_p, b_p = arr("h", B, T, H), arr("W_p", H, H), arr("b_p", H)
    W_c, b_c, dl = arr("W_c", H, C), arr("b_c", C), arr("dl", B, C)
    pooled = np.vectorize(sp.tanh, otypes=[object])(h[:, 0] @ W_p + b_p)
    return dict(h=h, W_p=W_p, b_p=b_p, W_c=W_c, b_c=b_c), dl, pooled, pooled @ W_c + b_c


def _prove() -> Proof:
    """sympy.diff of sum(dl * logits) against the closed forms: dW_c = pooled^T dl,
    dz = (dl W_c^T) (1 - pooled^2), dW_p = h0^T dz, dh[:, 0] = dz W_p^T, dh[:, t>0] = 0."""
    B, T, H, C = SIZES[0]
    ins, dl, pooled, logits = _map(B, T, H, C)
    dz = (dl @ ins["W_c"].T) * (1 - pooled ** 2)
    dh = np.zeros((B, T, H), dtype=object)
    dh[:, 0] = dz @ ins["W_p"].T
    closed = dict(h=dh, W_p=ins["h"][:, 0].T @ dz, b_p=dz.sum(axis=0),
                  W_c=pooled.T @ dl, b_c=dl.sum(axis=0))
    for name, value in closed.items():
        ok, detail = compare(vjp(logits, dl, ins[name]), value)
        if not ok:
            return Proof("refuted", (B, T, H, C), f"d{name}: {detail}")
    return Proof("proven", (B, T, H, C))


@maps_cache
def _fns(size):
    ins, dl, _, logits = _map(*size)
    names = ("h", "W_p", "b_p", "W_c", "b_c")
    inputs = {**ins, "dl": dl}
    return forward_backward_maps(inputs, logits, dl, [ins[n] for n in names])


def _inputs(size):
    B, T, H, C = size
    return dict(h=("float", (B, T, H), 2.0), W_p=("float", (H, H), 1.0), b_p=("float", (H,), 1.0),
                W_c=("float", (H, C), 2.0), b_c=("float", (C,), 1.0), dl=("float", (B, C), 1.0))


FWD, BWD = fb_checks(SIZES, _inputs, lambda w: lambda s: _fns(s)[w], "classifier_forward",
                     "classifier_backward", ("h", "W_p", "b_p", "W_c", "b_c"), "dl",
                     needs=("classifier_forward", "classifier_backward"))
register(Equation(
    "classifier.forward", "Sequence classifier on the tanh pooler", (f"{BLOG} (final)",),
    r"\mathrm{logits} = \tanh(h_{[:, 0]} W_p + b_p) W_c + b_c", _prove,
    torch_op="torch.nn.functional.linear",
    numeric=FWD,
    uses=("pooler.forward", "linear.forward")))
register(Equation(
    "classifier.backward", "Classifier gradients", (f"{BLOG} (final)",),
    r"dW_c = \mathrm{pooled}^\top d\ell,\ dz = (d\ell W_c^\top) \odot (1 - \mathrm{pooled}^2),"
    r"\ dW_p = h_{[:,0]}^\top dz,\ dh_{[:,0]} = dz W_p^\top", _prove, gradient=True,
    torch_op="torch.nn.functional.linear",
    numeric=BWD,
    uses=("classifier.forward", "linear.backward.dx", "linear.backward.dW",
          "linear.backward.db", "tanh.backward")))
