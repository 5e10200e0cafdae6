"""RMSNorm: forward, and the gradients w.r.t. x and gamma.

None of the five documents uses RMSNorm (every one normalises with LayerNorm); real code does
(LLaMA, T5: ``torch.nn.functional.rms_norm``), so it is a protocol op of its own.  As for
LayerNorm, the derivation is on one row of N features, the SymPy <-> code check on two rows (the
sum over rows in dgamma); rms = sqrt(mean(x^2) + eps) is replaced by a positive symbol r after
``sympy.diff``, so the identities are polynomial in x, gamma, dy and 1/r.
"""

from __future__ import annotations

from functools import cache

import numpy as np
import sympy as sp

from minibert_spec.equations import Equation, Proof, register
from minibert_spec.equations._cache import maps_cache
from minibert_spec.equations._code import by_rows, op_check
from minibert_spec.equations._sym import arr, compare, is_zero, lambdify_map, vjp
from minibert_spec.sources import PROTOCOL_VARIANTS

FEATURES = (1, 2, 3, 4)  # N tried by every proof
NUMERIC_FEATURES = (1, 2, 3)
ROWS = 2
RMS_EPS = 1e-6  # eps of the SymPy <-> code check (the proofs keep eps symbolic)

EPS = sp.Symbol("eps", positive=True)
R = sp.Symbol("r", positive=True)  # rms = sqrt(mean(x^2) + eps)


@cache
def row(N: int):
    """One row: symbols, forward y, sympy.diff-derived (dx, dgamma) with r for the rms."""
    x, g, dy = arr("x", N), arr("gamma", N), arr("dy", N)
    base = sp.Add(*[xi ** 2 for xi in x]) / N + EPS
    y = np.array([g[i] * x[i] * base ** sp.Rational(-1, 2) for i in range(N)], dtype=object)
    to_r = {base: R ** 2}
    dx, dg = (np.array([sp.sympify(e).xreplace(to_r) for e in vjp(y, dy, w)], dtype=object)
              for w in (x, g))
    return dict(x=x, gamma=g, dy=dy, base=base, y=y, dx=dx, dgamma=dg, aux={R: sp.sqrt(base)})


def x_hat(r) -> np.ndarray:
    return np.array([xi / R for xi in r["x"]], dtype=object)


def closed_dx(r) -> np.ndarray:
    """dx = (1/r) (g - x_hat mean(g x_hat)),  g = dy * gamma."""
    N = len(r["x"])
    g = r["dy"] * r["gamma"]
    xh = x_hat(r)
    mgx = sp.Add(*(g * xh)) / N
    return np.array([(g[i] - xh[i] * mgx) / R for i in range(N)], dtype=object)


def _prove(derived_key: str, closed_fn) -> Proof:
    for N in FEATURES:
        r = row(N)
        ok, detail = compare(r[derived_key], closed_fn(r), r["aux"])
        if not ok:
            return Proof("refuted", (N,), f"N={N}: {detail}")
    return Proof("proven", FEATURES)


def _prove_forward() -> Proof:
    """x_hat = x / r has mean(x_hat^2) = 1 - eps / r^2 (-> 1 as eps -> 0), and RMSNorm is
    invariant to rescaling a row at eps = 0: y(c x) = y(x) for c > 0."""
    c = sp.Symbol("c", positive=True)
    for N in FEATURES:
        r = row(N)
        xh = x_hat(r)
        if not is_zero((sp.Add(*(xh * xh)) / N - (1 - EPS / R ** 2)).xreplace(
                {R: sp.sqrt(r["base"])})):
            return Proof("refuted", (N,), f"N={N}: mean(x_hat^2) != 1 - eps / rms^2")
        scaled = {xi: c * xi for xi in r["x"]}
        for yi in r["y"]:
            if not is_zero(sp.simplify(yi.xreplace({EPS: 0}).xreplace(scaled)
                                       - yi.xreplace({EPS: 0}))):
                return Proof("refuted", (N,), f"N={N}: y(c x) != y(x) at eps = 0")
    return Proof("proven", FEATURES, "mean(x_hat^2) = 1 - eps/rms^2; y(c x) = y(x) at eps = 0")


# --------------------------------------------------------------------------- SymPy <-> code
@maps_cache
def _row_fn(N: int):
    """The proofs' per-row derivation, lambdified with eps as an input:
    (x, gamma, dy, eps) -> (y, dx, dgamma_row).  Read from the generated source (no SymPy
    derivation on the user's clock, issue 40: it was the one builder that still derived and
    lambdified at check time, ~0.1 s of a process's first RMSNorm check)."""
    r = row(N)
    inputs = dict(x=r["x"], gamma=r["gamma"], dy=r["dy"], eps=np.array([EPS], dtype=object))
    return lambdify_map(inputs, [r["y"], r["dx"], r["dgamma"]], r["aux"])


def _inputs(N):
    return dict(x=("float", (ROWS, N), 2.0), gamma=("float", (N,), 2.0),
                dy=("float", (ROWS, N), 1.0))


def _accept(N, x, **_):
    # rows away from 0: mean(x^2) >= 1e-2 keeps 1/rms moderate (RMSNorm's singular point)
    return bool(np.min(np.mean(x * x, axis=-1)) >= 1e-2)


def _numeric(which):
    def sympy_fn(N):
        f = _row_fn(N)  # here, not at the first call: regenerating records the map (_codegen)

        def run(x, gamma, dy):
            out = by_rows(f, dict(x=x, dy=dy), 2, gamma=gamma, eps=np.array([RMS_EPS]))
            return (out[0 if which is None else which + 1],)
        return run
    return op_check(which is not None, NUMERIC_FEATURES, _inputs, sympy_fn, "rmsnorm_forward",
                    "rmsnorm_backward", lambda x, gamma, dy: ((x, gamma, RMS_EPS), {}), "dy",
                    pick=which, accept=_accept, needs=("rmsnorm_forward", "rmsnorm_backward"))


# --------------------------------------------------------------------------- entries
register(Equation(
    "rmsnorm.forward", "RMSNorm forward", (PROTOCOL_VARIANTS,),
    r"y = \gamma \odot \frac{x}{\sqrt{\tfrac1N \sum_j x_j^2 + \epsilon}}",
    _prove_forward, torch_op="torch.nn.functional.rms_norm", numeric=_numeric(None),
    note="no mean subtracted and no beta: LayerNorm's scale part alone (LLaMA, T5)"))

register(Equation(
    "rmsnorm.backward.dx", "RMSNorm input gradient",
    (PROTOCOL_VARIANTS,),
    r"\frac{\partial L}{\partial x} = \frac{1}{r}\Bigl(g - \hat x\,\overline{g \odot \hat x}"
    r"\Bigr),\ g = \frac{\partial L}{\partial y} \odot \gamma,\ \hat x = x / r",
    lambda: _prove("dx", closed_dx), gradient=True, torch_op="torch.nn.functional.rms_norm",
    numeric=_numeric(0), uses=("rmsnorm.forward",)))

register(Equation(
    "rmsnorm.backward.dgamma", "RMSNorm gamma gradient", (PROTOCOL_VARIANTS,),
    r"\frac{\partial L}{\partial \gamma} = \sum_{rows} \frac{\partial L}{\partial y} \odot \hat x",
    lambda: _prove("dgamma", lambda r: r["dy"] * x_hat(r)), gradient=True,
    torch_op="torch.nn.functional.rms_norm", numeric=_numeric(1),
    uses=("rmsnorm.forward",)))
