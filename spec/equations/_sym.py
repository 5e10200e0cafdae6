"""SymPy helpers shared by the equation modules: symbol arrays, vector-Jacobian products with
``sympy.diff``, zero tests that stay fast on small sizes, and numeric counterexamples.

Everything is plain SymPy on explicit element symbols (no MatrixSymbol): a size is small
(feature 2..5, T 2..3, d_k 1..3), so every entry is an ordinary expression and ``sympy.diff``
does the calculus; closed forms stated by the documents are built the same way and compared.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping, Sequence
from fractions import Fraction

import numpy as np
import sympy as sp


def arr(name: str, *shape: int, **assumptions) -> np.ndarray:
    """An object ndarray of real symbols ``name_i_j``, shaped ``shape``."""
    assumptions.setdefault("real", True)
    out = np.empty(shape, dtype=object)
    for idx in itertools.product(*(range(n) for n in shape)):
        out[idx] = sp.Symbol(f"{name}_{'_'.join(map(str, idx))}" if idx else name, **assumptions)
    return out


def vjp(out: np.ndarray, dout: np.ndarray, wrt: np.ndarray) -> np.ndarray:
    """d/d(wrt) of sum(dout * out), element by element with ``sympy.diff``: the backward pass
    of ``out`` for upstream gradient ``dout``, derived from the forward map alone."""
    L = sp.Add(*[a * b for a, b in zip(np.ravel(out), np.ravel(dout))])
    res = np.empty(np.shape(wrt), dtype=object)
    for idx in np.ndindex(*np.shape(wrt)):
        res[idx] = sp.diff(L, wrt[idx])
    return res


def is_zero(expr) -> bool:
    """True iff ``expr`` is identically 0 as a rational function of its symbols.

    together -> numerator -> expand: exact and far faster than ``simplify`` for the rational
    expressions here (square roots and exponentials are replaced by symbols before calling).
    """
    expr = sp.sympify(expr)
    if expr == 0:
        return True
    num, _ = sp.fraction(sp.together(expr))
    return sp.expand(num) == 0


def all_zero(diff: np.ndarray) -> bool:
    return all(is_zero(e) for e in np.ravel(diff))


class Exp(sp.Function):
    """exp as an opaque function whose derivative is itself.

    ``sympy.exp`` merges exp(a) * exp(a) into exp(2a), which hides the factors from a
    structural replacement; Exp(a)**2 stays as it is, so every exponential can be swapped for
    a symbol after differentiating."""

    def fdiff(self, argindex=1):
        return self


def exp_to_symbols(exprs: np.ndarray, scores: np.ndarray, name: str = "E"):
    """Replace every Exp(scores[idx]) by a positive symbol E_idx.

    As the exponentials of independent scores are algebraically independent, an identity that
    holds as a rational function of the E's holds for every score value.  Returns the new
    array, the E symbols, and aux = {E: exp(score)} to evaluate or lambdify through."""
    E = arr(name, *scores.shape, positive=True)
    rep = {Exp(s): e for s, e in zip(np.ravel(scores), np.ravel(E))}
    out = np.empty(np.shape(exprs), dtype=object)
    for idx in np.ndindex(*np.shape(exprs)):
        out[idx] = sp.sympify(exprs[idx]).xreplace(rep)
    leftover = [e for e in np.ravel(out) if e.has(Exp)]
    if leftover:
        raise ValueError(f"exprs: an exponential of a non-score argument survived: {leftover[0]}")
    return out, E, {e: sp.exp(s) for s, e in zip(np.ravel(scores), np.ravel(E))}


def real_exp(exprs: np.ndarray) -> np.ndarray:
    """Exp -> sympy.exp, for lambdify and numeric evaluation."""
    out = np.empty(np.shape(exprs), dtype=object)
    for idx in np.ndindex(*np.shape(exprs)):
        out[idx] = sp.sympify(exprs[idx]).replace(Exp, sp.exp)
    return out


def softmax_rows(S: np.ndarray) -> np.ndarray:
    """softmax over the last axis of an object array, as Exp(s) / sum Exp."""
    e = np.vectorize(Exp, otypes=[object])(S)
    return e / e.sum(axis=-1, keepdims=True)


def rational_values(symbols: Sequence[sp.Symbol], seed: int = 0, *,
                    positive: Iterable[sp.Symbol] = ()) -> dict:
    """Deterministic small rationals (numerators -9..9 over 1..4) for a counterexample; symbols
    in ``positive`` get values in (0, 3]."""
    rng = np.random.default_rng(seed)
    positive = set(positive)
    vals = {}
    for s in symbols:
        den = int(rng.integers(1, 5))
        if s in positive or s.is_positive:
            vals[s] = sp.Rational(int(rng.integers(1, 13)), 4)
        else:
            num = int(rng.integers(-9, 10))
            vals[s] = sp.Rational(num if num else 1, den)
    return vals


def numeric(expr, values: Mapping) -> float:
    return float(sp.N(sp.sympify(expr).xreplace(dict(values)), 30))


def fmt_values(values: Mapping, limit: int = 40) -> str:
    """``name=value`` pairs, compact (Fraction formatting)."""
    items = []
    for k, v in list(values.items())[:limit]:
        v = sp.sympify(v)
        items.append(f"{k}={Fraction(int(v.p), int(v.q)) if v.is_Rational else v}")
    more = "" if len(values) <= limit else f", ... ({len(values) - limit} more)"
    return ", ".join(items) + more


def floats(a) -> np.ndarray:
    """An array of exact SymPy numbers as float64 (a concrete counterexample's values)."""
    return np.asarray(a, dtype=float)


def fmt_array(a, digits: int = 6) -> str:
    a = floats(a)
    return np.array2string(a, precision=digits, suppress_small=False, separator=", ")


# --------------------------------------------------------------------------- identities
def _subs_all(expr, aux: Mapping, values: Mapping):
    return sp.sympify(expr).xreplace(dict(aux)).replace(Exp, sp.exp).xreplace(dict(values))


def counterexample(lhs: np.ndarray, rhs: np.ndarray, aux: Mapping | None = None, *,
                   seed: int = 0, positive=()) -> tuple[dict, np.ndarray, np.ndarray] | None:
    """Evaluate both sides at deterministic rational inputs (aux symbols such as s = sqrt(var +
    eps) or E = exp(score) replaced by their definitions first).  Returns (values, lhs, rhs)
    as floats when they differ by more than 1e-12 relative, else None."""
    aux = dict(aux or {})
    lhs = np.asarray(lhs, dtype=object)
    rhs = np.asarray(rhs, dtype=object)
    free = set()
    for e in list(lhs.ravel()) + list(rhs.ravel()):
        free |= sp.sympify(e).xreplace(aux).free_symbols
    free = sorted(free, key=lambda s: s.name)
    for attempt in range(4):
        values = rational_values(free, seed + attempt, positive=positive)
        a = np.array([float(sp.N(_subs_all(e, aux, values), 30)) for e in lhs.ravel()])
        b = np.array([float(sp.N(_subs_all(e, aux, values), 30)) for e in rhs.ravel()])
        scale = max(np.max(np.abs(a)), np.max(np.abs(b)), 1e-300)
        if np.max(np.abs(a - b)) > 1e-12 * scale:
            return values, a.reshape(lhs.shape), b.reshape(rhs.shape)
    return None


def compare(derived: np.ndarray, closed: np.ndarray, aux: Mapping | None = None, *,
            positive=()) -> tuple[bool, str]:
    """(True, "") when closed - derived is identically 0; otherwise (False, counterexample).

    A symbolic non-zero is confirmed numerically before it counts (with aux symbols evaluated
    through their definitions); if the numbers agree after all, full ``simplify`` decides."""
    diff = np.asarray(closed, dtype=object) - np.asarray(derived, dtype=object)
    if all_zero(diff):
        return True, ""
    found = counterexample(derived, closed, aux, positive=positive)
    if found is None:
        aux = dict(aux or {})
        if all(sp.simplify(sp.sympify(e).xreplace(aux)) == 0 for e in np.ravel(diff)):
            return True, ""
        return False, "symbolically non-zero, but no numeric counterexample found"
    values, a, b = found
    return False, (f"at {fmt_values(values)}: sympy.diff gives {fmt_array(a)}, "
                   f"the closed form gives {fmt_array(b)}")


def forward_backward_maps(inputs: Mapping[str, np.ndarray], out: np.ndarray, dout: np.ndarray,
                          wrt: Sequence[np.ndarray]):
    """The two lambdified maps of an op's SymPy <-> code checks, on the same ``inputs``: the
    forward ``out``, and the backward -- sympy.diff of sum(dout * out) w.r.t. each of ``wrt``
    (:func:`vjp`)."""
    return lambdify_map(inputs, [out]), lambdify_map(inputs, [vjp(out, dout, w) for w in wrt])


def first_difference(pairs) -> str:
    """"" when every ``(derived, closed)`` pair is identically equal (:func:`compare`), else
    the first pair's counterexample."""
    for derived, closed in pairs:
        ok, detail = compare(derived, closed)
        if not ok:
            return detail
    return ""


def lambdify_map(inputs: Mapping[str, np.ndarray], outputs: Sequence[np.ndarray],
                 aux: Mapping | None = None):
    """fn(**arrays) -> tuple of float arrays shaped like ``outputs``, from object arrays of
    symbols (``inputs``) and expressions (``outputs``; aux symbols replaced first).  The map
    carries ``cache_spec``, the generated source it runs (spec/equations/_cache.py keeps it on
    disk; :func:`map_from_spec` rebuilds the map from it)."""
    aux = dict(aux or {})
    names = list(inputs)
    syms = [s for n in names for s in np.ravel(inputs[n])]
    flat = [sp.sympify(e).xreplace(aux).replace(Exp, sp.exp) for o in outputs
            for e in np.ravel(o)]
    f = sp.lambdify(syms, flat, "numpy", cse=True)
    shapes = [list(np.shape(o)) for o in outputs]
    call = _map_call(f, names, shapes)
    call.cache_spec = _source_spec(f, names, shapes)
    return call


def _map_call(f, names: Sequence[str], shapes: Sequence[Sequence[int]]):
    """The map over named arrays around the lambdified ``f`` of their flattened elements."""
    def call(**arrays):
        args = [float(v) for n in names for v in np.ravel(np.asarray(arrays[n], dtype=float))]
        vals = np.asarray(f(*args), dtype=float)
        out, k = [], 0
        for shape in shapes:
            n = int(np.prod(shape))
            out.append(vals[k:k + n].reshape(shape))
            k += n
        return tuple(out)

    return call


def _lambdify_namespace() -> dict:
    """The namespace lambdify gives every "numpy" function (built once: ~1 ms)."""
    global _NAMESPACE
    if _NAMESPACE is None:
        _NAMESPACE = dict(sp.lambdify([], 0, "numpy").__globals__)
    return _NAMESPACE


_NAMESPACE = None


def _code_names(code) -> set[str]:
    names = set(code.co_names)
    for const in code.co_consts:
        if hasattr(const, "co_names"):
            names |= _code_names(const)
    return names


def _source_spec(f, names, shapes) -> dict | None:
    """What rebuilds ``f``: its generated source, and where each global it uses beyond
    lambdify's numpy namespace comes from (``erf`` from math...); None when one cannot be
    named (the map is then not cached)."""
    import importlib
    import inspect

    try:
        source = inspect.getsource(f)
    except (OSError, TypeError):
        return None
    base, extras = _lambdify_namespace(), {}
    for name in sorted(_code_names(f.__code__)):
        value = f.__globals__.get(name)
        if name in base and base[name] is value:
            continue
        module, attr = getattr(value, "__module__", None), getattr(value, "__name__", None)
        try:
            if getattr(importlib.import_module(module), attr) is not value:
                return None
        except (ImportError, TypeError, AttributeError, ValueError):
            return None
        extras[name] = [module, attr]
    return {"names": list(names), "shapes": [list(s) for s in shapes], "source": source,
            "function": f.__name__, "extras": extras}


def map_from_spec(spec: Mapping):
    """The map :func:`lambdify_map` built, from its ``cache_spec``."""
    import importlib

    namespace = dict(_lambdify_namespace())
    for name, (module, attr) in spec["extras"].items():
        namespace[name] = getattr(importlib.import_module(module), attr)
    exec(compile(spec["source"], f"<cached lambdified map {spec['function']}>", "exec"),
         namespace)
    call = _map_call(namespace[spec["function"]], spec["names"], spec["shapes"])
    call.cache_spec = dict(spec)
    return call


class Stage:
    """An arbitrary differentiable stage of a network, for chain-rule proofs: ``n`` outputs,
    each an undefined SymPy function of the ``n`` inputs and of the parameter symbols
    ``params`` -- nothing is assumed about what the stage computes.  :meth:`vjp` is the
    stage's backward as the code composes it: the transposed Jacobian *at the stage's own
    input*, times the upstream gradient, for the input and for each parameter."""

    def __init__(self, name: str, n: int, params: Sequence[sp.Symbol] = ()):
        self.fs = [sp.Function(f"{name}{i}") for i in range(n)]
        self.u = sp.symbols(f"{name}_u0:{n}", real=True)  # the stage's own argument symbols
        self.params = tuple(params)

    def __call__(self, v) -> list:
        return [f(*v, *self.params) for f in self.fs]

    def vjp(self, v, d) -> tuple[list, list]:
        """(J_u^T d, [J_p^T d for each parameter p]) with the Jacobians taken at u = v."""
        at = dict(zip(self.u, v))
        outs = [f(*self.u, *self.params) for f in self.fs]

        def back(wrt):
            return sp.Add(*[dj * sp.diff(o, wrt).subs(at) for dj, o in zip(d, outs)])

        return [back(ui) for ui in self.u], [back(p) for p in self.params]


def _partials(expr):
    """Every first derivative of an undefined function, ``Derivative(f(a_0..a_n), a_k)``, as a
    new undefined function ``f__d{k}(a_0..a_n)`` (the partial derivative in argument k): SymPy
    spells one partial several ways (a Derivative at a point, or a Subs over dummies); this is
    one spelling, so two chain rules compare term by term."""
    from sympy.core.function import AppliedUndef

    def rewrite(d):
        f = d.expr
        if not isinstance(f, AppliedUndef) or len(d.variable_count) != 1:
            return d
        var, count = d.variable_count[0]
        positions = [k for k, a in enumerate(f.args) if a == var]
        if count != 1 or len(positions) != 1 or any(var in a.free_symbols for k, a in
                                                      enumerate(f.args) if k != positions[0]):
            return d
        return sp.Function(f"{f.func.__name__}__d{positions[0]}")(*f.args)

    return expr.replace(lambda e: isinstance(e, sp.Derivative), rewrite).doit()


def chain_equal(derived, composed) -> bool:
    """Two expressions built from undefined stage functions agree identically: partial
    derivatives in one spelling (:func:`_partials`), then expanded (fast where ``simplify``
    takes seconds)."""
    return sp.expand(_partials(sp.expand(derived)) - _partials(sp.expand(composed))) == 0
