"""The linear layer y = x W + b on 3-D inputs and its three gradients (the MLM head's
orientation is spec/equations/head.py)."""

from __future__ import annotations

from functools import cache

import numpy as np
import sympy as sp

from minibert_spec.equations import Equation, Proof, register
from minibert_spec.equations._cache import maps_cache
from minibert_spec.equations._code import op_check
from minibert_spec.equations._sym import arr, compare, fmt_array, lambdify_map, vjp
from minibert_spec.sources import BLOG, GUIDE, MINIBERT, SEED001

SIZES = ((2, 2, 2, 3), (1, 3, 3, 2), (2, 1, 3, 3))  # (B, T, n_in, n_out)


@cache
def layer(size):
    B, T, n_in, n_out = size
    x, W, b, dy = arr("x", B, T, n_in), arr("W", n_in, n_out), arr("b", n_out), arr("dy", B, T,
                                                                                    n_out)
    y = x @ W + b
    return dict(x=x, W=W, b=b, dy=dy, y=y, dx=vjp(y, dy, x), dW=vjp(y, dy, W), db=vjp(y, dy, b))


def _prove(key, closed_fn) -> Proof:
    for size in SIZES:
        r = layer(size)
        ok, detail = compare(r[key], closed_fn(r, size))
        if not ok:
            return Proof("refuted", size, f"(B, T, n_in, n_out)={size}: {detail}")
    return Proof("proven", SIZES)


def _closed_dW(r, size):
    B, T, n_in, n_out = size
    return r["x"].reshape(B * T, n_in).T @ r["dy"].reshape(B * T, n_out)  # [n_in, n_out]


def _prove_forward() -> Proof:
    """y[b,t,o] = sum_i x[b,t,i] W[i,o] + b[o]: the map is affine, so its Jacobian w.r.t. x is
    W^T at every point (checked entry by entry with sympy.diff)."""
    for size in SIZES:
        r = layer(size)
        B, T, n_in, n_out = size
        for o in range(n_out):
            for i in range(n_in):
                if sp.diff(r["y"][0, 0, o], r["x"][0, 0, i]) != r["W"][i, o]:
                    return Proof("refuted", size, "dy/dx != W^T")
    return Proof("proven", SIZES)


def _prove_literal_3d() -> Proof:
    """§3.1 writes dW = x^T @ dL/dy for x [B, T, H_in].  Its own shape analysis flattens first:
    [B*T, H_in]^T @ [B*T, H_out] -- that reading is the proven ``linear.backward.dW``.  Read as
    NumPy on the 3-D arrays, x.T reverses every axis and matmul broadcasts the leading ones."""
    rng = np.random.default_rng(0)
    B, T, n_in, n_out = 2, 3, 2, 2
    x, dy = rng.integers(-3, 4, (B, T, n_in)), rng.integers(-3, 4, (B, T, n_out))
    right = x.reshape(-1, n_in).T @ dy.reshape(-1, n_out)
    try:
        literal = np.transpose(x) @ dy
        what = f"np.transpose(x) @ dy has shape {literal.shape}, not {right.shape}"
    except ValueError as e:
        what = f"np.transpose(x) @ dy raises ({e})"
    return Proof("convention", (B, T, n_in, n_out),
                 f"flattened reading (the section's shape analysis): proven as linear.backward.dW;"
                 f" literal 3-D reading refuted: x={x.tolist()}, dy={dy.tolist()}: {what}; the "
                 f"gradient is {fmt_array(right, 0)}")


# --------------------------------------------------------------------------- SymPy <-> code
@maps_cache
def _fns(size):
    r = layer(size)
    inputs = dict(x=r["x"], W=r["W"], b=r["b"], dy=r["dy"])
    return dict(y=lambdify_map(inputs, [r["y"]]), dx=lambdify_map(inputs, [r["dx"]]),
                dW=lambdify_map(inputs, [r["dW"]]), db=lambdify_map(inputs, [r["db"]]))


def _inputs(size):
    B, T, n_in, n_out = size
    return dict(x=("float", (B, T, n_in), 2.0), W=("float", (n_in, n_out), 2.0),
                b=("float", (n_out,), 2.0), dy=("float", (B, T, n_out), 1.0))


def _numeric(key, which):
    """``which``: the entry of linear_backward's (dx, dW, db); None: the forward."""
    return op_check(which is not None, SIZES, _inputs, lambda s: _fns(s)[key], "linear_forward",
                    "linear_backward", lambda x, W, b, dy: ((x, W, b), {}), "dy", pick=which)


TORCH = "torch.nn.functional.linear"
register(Equation(
    "linear.forward", "Linear layer", (f"{MINIBERT} §3.1", f"{MINIBERT} §2.4", f"{SEED001} §1.2",
                                       f"{BLOG} (forward)", f"{GUIDE} §7"),
    r"y = x W + b,\ x \in \mathbb{R}^{B \times T \times n_{in}},\ W \in "
    r"\mathbb{R}^{n_{in} \times n_{out}}",
    _prove_forward, torch_op=TORCH, numeric=_numeric("y", None)))

register(Equation(
    "linear.backward.dx", "Linear layer input gradient", (f"{MINIBERT} §3.1",),
    r"\frac{\partial L}{\partial x} = \frac{\partial L}{\partial y} W^\top",
    lambda: _prove("dx", lambda r, s: r["dy"] @ r["W"].T), gradient=True, torch_op=TORCH,
    numeric=_numeric("dx", 0),
    uses=("linear.forward",)))

register(Equation(
    "linear.backward.dW", "Linear layer weight gradient (leading axes flattened)",
    (f"{MINIBERT} §3.1 (shape analysis)", f"{MINIBERT} §3.4", f"{SEED001} §2.1"),
    r"\frac{\partial L}{\partial W} = x_{[BT, n_{in}]}^\top \frac{\partial L}{\partial y}"
    r"_{[BT, n_{out}]}",
    lambda: _prove("dW", _closed_dW), gradient=True, torch_op=TORCH, numeric=_numeric("dW", 1),
    uses=("linear.forward",)))

register(Equation(
    "linear.backward.db", "Linear layer bias gradient", (f"{MINIBERT} §3.1",),
    r"\frac{\partial L}{\partial b} = \sum_{b,t} \frac{\partial L}{\partial y}[b,t,:]",
    lambda: _prove("db", lambda r, s: r["dy"].sum(axis=(0, 1))), gradient=True, torch_op=TORCH,
    numeric=_numeric("db", 2),
    uses=("linear.forward",)))

register(Equation(
    "linear.backward.dW.literal3d", "dW = x^T @ dL/dy written on 3-D tensors",
    (f"{MINIBERT} §3.1",),
    r"\frac{\partial L}{\partial W} = x^\top @ \frac{\partial L}{\partial y}",
    _prove_literal_3d, kind="document", expected="convention", target="linear.backward.dW"))
