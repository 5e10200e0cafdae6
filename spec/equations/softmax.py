"""Softmax: the forward (and its stable form), the Jacobian, and the Jacobian-vector product.

After differentiating, every exp(x_i) is replaced by a positive symbol E_i: the identities are
then rational in E and exact for every x."""

from __future__ import annotations

from functools import cache

import numpy as np
import sympy as sp

from minibert_spec.equations import Equation, Numeric, Proof, register
from minibert_spec.equations._cache import maps_cache
from minibert_spec.equations._code import by_rows
from minibert_spec.equations._sym import (
    arr,
    compare,
    exp_to_symbols,
    is_zero,
    lambdify_map,
    real_exp,
    softmax_rows,
    vjp,
)
from minibert_spec.sources import MINIBERT, SEED001, SLIDES

FEATURES = (2, 3, 4, 5)
NUMERIC_FEATURES = (2, 3, 4)
ROWS = 2


@cache
def row(N: int):
    x, dp = arr("x", N), arr("dp", N)
    p = softmax_rows(x)
    dx, E, aux = exp_to_symbols(vjp(p, dp, x), x)
    J = np.array([[sp.diff(p[i], x[j]) for j in range(N)] for i in range(N)], dtype=object)
    J, _, _ = exp_to_symbols(J, x)
    pE = E / sp.Add(*E)
    return dict(x=x, dp=dp, p=p, dx=dx, J=J, E=E, pE=pE, aux=aux)


def _prove_forward() -> Proof:
    """Each row is a probability vector: sum_i p_i = 1 identically (entries are exp / sum > 0)."""
    for N in FEATURES:
        if not is_zero(sp.Add(*row(N)["pE"]) - 1):
            return Proof("refuted", (N,), f"N={N}: the entries do not sum to 1")
    return Proof("proven", FEATURES, "sum_i p_i = 1")


def _prove_stable() -> Proof:
    """exp(x_i - c) / sum_j exp(x_j - c) = softmax(x)_i for any c (c = max x in the code)."""
    c = sp.Symbol("c", real=True)
    for N in FEATURES:
        x = row(N)["x"]
        shifted = real_exp(softmax_rows(np.array([xi - c for xi in x], dtype=object)))
        plain = real_exp(row(N)["p"])
        # exp(x - c) = exp(x) exp(-c): expand the exponentials, then the ratio is rational
        diff = [sp.expand_power_exp(sp.expand(a - b)) for a, b in zip(shifted, plain)]
        if not all(is_zero(d) for d in diff):
            return Proof("refuted", (N,), f"N={N}: the shifted form differs")
    return Proof("proven", FEATURES, "invariant to subtracting any constant c from every x_j")


def _prove_jacobian() -> Proof:
    for N in FEATURES:
        r = row(N)
        p = r["pE"]
        closed = np.array([[p[i] * ((1 if i == j else 0) - p[j]) for j in range(N)]
                           for i in range(N)], dtype=object)
        ok, detail = compare(r["J"], closed, r["aux"])
        if not ok:
            return Proof("refuted", (N,), f"N={N}: {detail}")
    return Proof("proven", FEATURES)


def _jvp_rowdot(r):
    p, dp = r["pE"], r["dp"]
    s = sp.Add(*(p * dp))
    return np.array([p[i] * (dp[i] - s) for i in range(len(p))], dtype=object)


def _prove_backward() -> Proof:
    for N in FEATURES:
        r = row(N)
        ok, detail = compare(r["dx"], _jvp_rowdot(r), r["aux"])
        if not ok:
            return Proof("refuted", (N,), f"N={N}: {detail}")
    return Proof("proven", FEATURES)


def _prove_rowdot_reading() -> Proof:
    """NumPy-Transformer document §2.1: dA = Â ⊙ (dÂ - (Â · dÂ) 1).  Read row-wise (Â · dÂ the
    per-row dot product sum_j Â_ij dÂ_ij) it is the JVP above; read as the matrix product
    Â dÂ (then times the ones vector, i.e. row sums of Â dÂ) it is not."""
    T = 2
    P, dP = arr("S", T, T), arr("dP", T, T)
    probs = softmax_rows(P)
    derived = vjp(probs, dP, P)
    derived, E, aux = exp_to_symbols(derived, P)
    pE = E / E.sum(axis=-1, keepdims=True)
    rowdot = pE * (dP - (pE * dP).sum(axis=-1, keepdims=True))
    ok_row, _ = compare(derived, rowdot, aux)
    matprod = pE * (dP - (pE @ dP).sum(axis=-1, keepdims=True))
    ok_mat, detail = compare(derived, matprod, aux)
    if ok_row and not ok_mat:
        return Proof("convention", (T,), "row-wise dot product: proven; matrix-product reading "
                                         f"(row sums of Â dÂ), T={T}: refuted, {detail}")
    return Proof("refuted" if not ok_row else "proven", (T,), detail)


# --------------------------------------------------------------------------- SymPy <-> code
@maps_cache
def _row_fns(N: int):
    """The proofs' per-row derivation (E = exp(x) put back), lambdified."""
    r = row(N)
    inputs = dict(x=r["x"], dp=r["dp"])
    return lambdify_map(inputs, [r["pE"], r["dx"], r["J"]], r["aux"])


def _numeric_fns(N: int):
    """softmax acts on each row of the last axis independently: the row maps, row by row."""
    f = _row_fns(N)

    def part(k):
        return lambda x, dp: (by_rows(f, dict(x=x, dp=dp), 3)[k],)

    return dict(p=part(0), dx=part(1), J=part(2))


def _inputs(N):
    return dict(x=("float", (ROWS, N), 3.0), dp=("float", (ROWS, N), 1.0))


def _code_forward(impl, N, x, dp):
    return (impl.softmax_forward(x)[0],)


def _code_backward(impl, N, x, dp):
    _, cache = impl.softmax_forward(x)
    return impl.softmax_backward(dp, cache)


def _code_jacobian(impl, N, x, dp):
    p, _ = impl.softmax_forward(x)
    return (impl.softmax_jacobian(p),)


def _call(x, dp):
    """How the code side calls softmax (its input, no mask, the upstream gradient)."""
    return {"x": x}, {}, dp


def _numeric(key, code, needs=("softmax_forward", "softmax_backward")):
    return Numeric(NUMERIC_FEATURES, _inputs, lambda N: _numeric_fns(N)[key], code, needs=needs,
                   guard_call=_call if key in ("p", "dx") else None)


register(Equation(
    "softmax.forward", "Softmax over the last axis",
    (f"{MINIBERT} §2.2", f"{MINIBERT} §3.2", f"{MINIBERT} §4.1", f"{SEED001} §1.2",
     f"{SLIDES} (attention, step 2)", "visual guide §7"),
    r"p_i = \frac{e^{x_i}}{\sum_j e^{x_j}},\ \sum_i p_i = 1",
    _prove_forward, torch_op="torch.softmax", numeric=_numeric("p", _code_forward),
    note="masked entries (key padding) get probability exactly 0 in the reference"))

register(Equation(
    "softmax.stable", "Max-shifted softmax equals softmax", (f"{MINIBERT} §7.1",),
    r"\frac{e^{x_i - \max x}}{\sum_j e^{x_j - \max x}} = \frac{e^{x_i}}{\sum_j e^{x_j}}",
    _prove_stable, kind="document", target="softmax.forward"))

register(Equation(
    "softmax.jacobian", "Softmax Jacobian", (f"{MINIBERT} §3.2",),
    r"\frac{\partial p_i}{\partial x_j} = p_i (\delta_{ij} - p_j)",
    _prove_jacobian, gradient=True, torch_op="torch.autograd.functional.jacobian(torch.softmax)",
    numeric=_numeric("J", _code_jacobian, needs=("softmax_forward", "softmax_jacobian")),
    uses=("softmax.forward",)))

register(Equation(
    "softmax.backward", "Softmax Jacobian-vector product",
    (f"{MINIBERT} §3.2", f"{MINIBERT} §3.4", f"{SEED001} §2.1"),
    r"\frac{\partial L}{\partial x_i} = p_i \Bigl(\frac{\partial L}{\partial p_i} - \sum_j p_j "
    r"\frac{\partial L}{\partial p_j}\Bigr)",
    _prove_backward, gradient=True, torch_op="torch.softmax",
    numeric=_numeric("dx", _code_backward),
    uses=("softmax.jacobian",)))

register(Equation(
    "softmax.backward.rowdot", "Softmax JVP written with (Â · dÂ) 1", (f"{SEED001} §2.1",),
    r"\delta A = \hat A \odot \bigl(\delta \hat A - (\hat A \cdot \delta \hat A)\mathbf 1\bigr)",
    _prove_rowdot_reading, kind="document", expected="convention", target="softmax.backward",
    note="right when '·' is the per-row dot product (as the code computes it), wrong as a "
         "matrix product"))
