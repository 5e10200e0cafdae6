"""Gradient checking (Mini-BERT derivation §9.1): the central difference and the error measure.

Implemented by the checking machinery itself (``minibert_spec.numerics.finite_differences``), not by
the reference."""

from __future__ import annotations

import numpy as np
import sympy as sp

from minibert_spec.equations import Equation, Numeric, Proof, register
from minibert_spec.sources import MINIBERT

x, h = sp.symbols("x epsilon", real=True)


def _prove_central() -> Proof:
    """(f(x + h) - f(x - h)) / 2h = f'(x) + f'''(x) h^2 / 6 + O(h^4) for an arbitrary smooth f:
    second-order accurate, which is why eps = 1e-5 gives ~1e-10 truncation error in float64."""
    f = sp.Function("f")
    cd = (f(x + h) - f(x - h)) / (2 * h)
    series = sp.series(cd, h, 0, 4).removeO().doit()
    expected = sp.diff(f(x), x) + sp.diff(f(x), x, 3) * h ** 2 / 6
    if sp.simplify(series - expected) != 0:
        return Proof("refuted", ("symbolic",), f"series: {series}")
    return Proof("proven", (4,), "error f'''(x) eps^2 / 6 + O(eps^4)")


def doc_error(a, n, eps):
    """|a - n| / (|a| + |n| + eps), the §9.1 measure."""
    return abs(a - n) / (abs(a) + abs(n) + eps)


def _prove_doc_relative_error() -> Proof:
    """As the pass criterion of §9.1 (error < 1e-4 with eps = 1e-5), the measure accepts an
    analytic gradient of the wrong sign whenever both magnitudes are below ~2.5e-10, and it
    halves the relative error of close values (denominator |a| + |n| ~ 2|a|)."""
    a, n = sp.Rational(1, 10 ** 10), -sp.Rational(1, 10 ** 10)
    flipped = doc_error(a, n, sp.Rational(1, 10 ** 5))
    close = doc_error(sp.Integer(1), 1 + sp.Rational(15, 10 ** 5), sp.Rational(1, 10 ** 5))
    if flipped < sp.Rational(1, 10 ** 4):
        return Proof("refuted", ("numeric",),
                     f"analytic=1e-10, numeric=-1e-10 (opposite signs, 200% "
                                    f"apart): |a-n|/(|a|+|n|+1e-5) = {float(flipped):.3g} < 1e-4 "
                                    f"passes; analytic=1, numeric=1.00015 (1.5e-4 apart) gives "
                                    f"{float(close):.3g} < 1e-4 passes too")
    return Proof("proven", ())


def _prove_relative_error() -> Proof:
    """|a - b| / max(|a|, |b|, floor): symmetric; the true relative error when either side is
    above the floor; a sign flip at or above the floor scores exactly 2; below the floor it is
    |a - b| / floor (absolute)."""
    a, b, fl = sp.symbols("a b floor", positive=True)
    err = sp.Abs(a - b) / sp.Max(a, b, fl)
    flip = (sp.Abs(a - (-a)) / sp.Max(a, a, fl)).subs(fl, a / 2)
    if sp.simplify(err - err.subs({a: b, b: a}, simultaneous=True)) != 0:
        return Proof("refuted", ("symbolic",), "not symmetric")
    if sp.simplify(flip - 2) != 0:
        return Proof("refuted", ("symbolic",), f"sign flip scores {flip}")
    return Proof("proven", ("symbolic",), "symmetric; sign flip above the floor = 2")


def _rel_sympy(size):
    a, b = sp.symbols("a b", real=True)
    from minibert_spec.tolerances import FD_FLOOR
    f = sp.lambdify([a, b], sp.Abs(a - b) / sp.Max(sp.Abs(a), sp.Abs(b), FD_FLOOR), "numpy")
    return lambda a, b: (np.vectorize(f)(a, b).astype(float),)


def _rel_code(impl, size, a, b):
    from minibert_spec.numerics.finite_differences import (
        relative_error,  # the checking machinery, not the implementation
    )
    return (relative_error(a, b),)


register(Equation(
    "gradcheck.central_difference", "Central finite difference", (f"{MINIBERT} §9.1",),
    r"f'(x) \approx \frac{f(x + \epsilon) - f(x - \epsilon)}{2 \epsilon}", _prove_central,
    impl_hint="minibert_spec.numerics.finite_differences:directional_check",
    numeric_na="the FD machinery is what the FD tests run; its own behaviour is checked by them"))
register(Equation(
    "gradcheck.relative_error", "Error measure with an absolute floor", (f"{MINIBERT} §9.1",),
    r"e = \frac{|a - n|}{\max(|a|, |n|, \mathrm{floor})}", _prove_relative_error,
    impl_hint="minibert_spec.numerics.finite_differences:relative_error",
    numeric=Numeric(((3,), (6,)), lambda s: dict(a=("float", s, 2e-3), b=("float", s, 2e-3)),
                    _rel_sympy, _rel_code),
    note="the project's replacement for the document's measure (below)",
    uses=("gradcheck.central_difference",)))
register(Equation(
    "gradcheck.relative_error.sum_eps", "|a - n| / (|a| + |n| + eps) as the pass criterion",
    (f"{MINIBERT} §9.1",),
    r"\mathrm{relative\_error} = \frac{|a - n|}{|a| + |n| + \epsilon} < 10^{-4}",
    _prove_doc_relative_error, kind="document", expected="refuted",
    target="gradcheck.relative_error"))
