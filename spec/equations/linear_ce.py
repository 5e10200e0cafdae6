"""The Mini-BERT MLM head fused with its loss: L = CE(x W + b, labels) over rows of hidden states,
evaluated block by block of rows, and its gradients through the logit gradient (the reference's
``linear_cross_entropy`` op pair; the head alone is ``linear.forward``, the loss alone
``loss.ce.*``).

Two facts make the fused schedule exact: the loss is a sum over rows divided by one denominator
of the whole batch, so any partition of the rows into blocks sums to it; and every gradient is
linear in the upstream dloss, so the backward may apply dloss to x, dx and db instead of the
[N, V] logit gradient G: dW = (dloss x)^T G = x^T (dloss G).
"""

from __future__ import annotations

from functools import cache

import numpy as np
import sympy as sp

from minibert_spec.equations import Equation, Proof, register
from minibert_spec.equations._cache import maps_cache
from minibert_spec.equations._code import op_check
from minibert_spec.equations._sym import arr, compare, exp_to_symbols, forward_backward_maps, vjp
from minibert_spec.equations.loss import ce
from minibert_spec.protocol import IGNORE_INDEX
from minibert_spec.sources import MINIBERT

# (n rows, n_in, V, mask): one row ignored in each of the first and last cases
CASES = ((3, 2, 3, (1, 0, 1)), (4, 2, 2, (1, 1, 1, 0)), (2, 3, 2, (1, 1)))


def _labels(n: int, V: int) -> list[int]:
    return [(r * 2 + 1) % V for r in range(n)]


@cache
def _head(case, reduction: str):
    """x [n, n_in], W [n_in, V], b [V], the logits z = x W + b, and L = CE(z) for fixed labels."""
    n, n_in, V, mask = case
    x, W, b = arr("x", n, n_in), arr("W", n_in, V), arr("b", V)
    z = x @ W + b  # [n, V]
    O = np.eye(V, dtype=int)[_labels(n, V)]
    return x, W, b, z, O, ce(z, O, mask, reduction)


def _prove_forward() -> Proof:
    """For every partition of the rows into blocks of k consecutive rows (the last one shorter),
    the blocks' summed losses divided once by N_masked ("mean") or by 1 ("sum") are identically
    the loss of the whole batch of logits x W + b."""
    for case in CASES:
        n, _, _, mask = case
        for reduction in ("mean", "sum"):
            _, _, _, z, O, L = _head(case, reduction)
            denom = sum(mask) if reduction == "mean" else 1
            for k in range(1, n + 1):
                blocks = sp.Add(*[ce(z[lo:lo + k], O[lo:lo + k], mask[lo:lo + k], "sum")
                                  for lo in range(0, n, k)])
                if sp.simplify(blocks / denom - L) != 0:
                    return Proof("refuted", case[:3], f"{reduction}, blocks of {k} rows: the "
                                                      "blocked sum differs from the loss")
    return Proof("proven", tuple(c[:3] for c in CASES),
                 "every block size 1..n, mean and sum: sum over blocks / denominator = loss")


def _prove_backward() -> Proof:
    """With upstream dloss = u: dL/dx = u G W^T, dL/dW = (u x)^T G, dL/db = u sum_r G_r, where
    G = (softmax(x W + b) - onehot(labels)) * m / N_masked (Mini-BERT derivation §4.2) is the
    logit gradient for u = 1 -- derived with sympy.diff through the composed map."""
    u = sp.Symbol("u", real=True)
    for case in CASES:
        for reduction in ("mean", "sum"):
            x, W, b, z, O, L = _head(case, reduction)
            mask = np.array(case[3], dtype=object)[:, None]
            up = np.array([u], dtype=object)
            for name, wrt in (("dx", x), ("dW", W), ("db", b)):
                derived, E, aux = exp_to_symbols(vjp(np.array([L], dtype=object), up, wrt), z)
                G = (E / E.sum(axis=-1, keepdims=True) - O) * mask
                if reduction == "mean":
                    G = G / sum(case[3])
                if name == "dx":
                    closed = u * (G @ W.T)
                elif name == "dW":
                    closed = (u * x).T @ G
                else:
                    closed = u * G.sum(axis=0)
                ok, detail = compare(derived, closed, aux)
                if not ok:
                    return Proof("refuted", case[:3], f"{reduction} {name}: {detail}")
    return Proof("proven", tuple(c[:3] for c in CASES),
                 "dx = u G W^T, dW = (u x)^T G, db = u sum_r G_r; mean and sum")


# --------------------------------------------------------------------------- SymPy <-> code
SIZES = ((3, 2, 3), (4, 3, 2))  # (n, n_in, V)


@maps_cache
def _fns(size, reduction):
    n, n_in, V = size
    x, W, b = arr("x", n, n_in), arr("W", n_in, V), arr("b", V)
    O, m = arr("O", n, V), arr("m", n)
    L = np.array([ce(x @ W + b, O, m, reduction)], dtype=object)
    one = np.array([1], dtype=object)
    inputs = dict(x=x, W=W, b=b, O=O, m=m)
    return forward_backward_maps(inputs, L, one, (x, W, b))


def _inputs(size):
    n, n_in, V = size
    return dict(x=("float", (n, n_in), 2.0), W=("float", (n_in, V), 2.0),
                b=("float", (V,), 2.0), labels=("int", (n,), V), keep=("bool", (n,)))


def _sympy(reduction, which):
    def build(size):
        fn = _fns(size, reduction)[which]

        def run(x, W, b, labels, keep):
            out = fn(x=x, W=W, b=b, O=np.eye(size[2])[labels], m=keep.astype(float))
            return (out[0].reshape(()),) if which == 0 else out
        return run
    return build


def _call(reduction):
    """How the code side calls the op (its inputs, other arguments, dloss)."""
    return lambda x, W, b, labels, keep: ({"x": x, "W": W, "b": b}, {
        "labels": np.where(keep, labels, IGNORE_INDEX), "reduction": reduction}, 1.0)


def _numeric(reduction, which):
    return op_check(which, SIZES, _inputs, _sympy(reduction, which),
                    "linear_cross_entropy_forward", "linear_cross_entropy_backward",
                    lambda x, W, b, labels, keep: ((x, W, b, np.where(keep, labels, IGNORE_INDEX)),
                                                   {"reduction": reduction}), 1.0, loss=True,
                    accept=lambda size, x, W, b, labels, keep: bool(keep.any()),
                    guard_call=_call(reduction))


TORCH = "torch.nn.functional.linear + torch.nn.functional.cross_entropy"
register(Equation(
    "linear_ce.forward", "MLM head fused with its masked cross-entropy, blocked over rows",
    (f"{MINIBERT} §2.6", f"{MINIBERT} §4.1"),
    r"L = -\frac{1}{N_{masked}} \sum_{\text{blocks } K} \sum_{r \in K,\ masked} "
    r"\log \mathrm{softmax}(x_r W + b)[y_r]",
    _prove_forward, torch_op=TORCH, numeric=_numeric("mean", 0),
    note="the reference never holds a second [N, V] array: each block's logit gradient "
         "overwrites its logits"))
register(Equation(
    "linear_ce.backward", "Gradients of the fused MLM head and loss",
    (f"{MINIBERT} §4.2", f"{MINIBERT} §3.1"),
    r"G = (p - \mathrm{onehot}(y))\,\frac{m}{N_{masked}},\ \frac{\partial L}{\partial x} = "
    r"u\, G W^\top,\ \frac{\partial L}{\partial W} = (u\, x)^\top G,\ "
    r"\frac{\partial L}{\partial b} = u \sum_r G_r",
    _prove_backward, gradient=True, torch_op=TORCH, numeric=_numeric("mean", 1)))
