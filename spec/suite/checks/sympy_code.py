"""Lambdified SymPy == the implementation: for every derivation with a ``Numeric`` spec, the
SymPy map (the forward, or the backward derived with ``sympy.diff``) and the implementation's
function on the same Hypothesis float64 inputs, within SYMPY_CODE_RTOL; and softmax_jacobian
(added with the spec) against central differences and torch.

Listing these checks imports no SymPy: the equations with a ``Numeric`` and their variants come
from the generated index (spec/equations/_generated/_checks.py, ``minibert regenerate``); the
equations themselves are loaded by the worker that runs one (:mod:`.sympy_equations`)."""

from __future__ import annotations

import functools
import warnings

import numpy as np
from hypothesis import assume
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from minibert_spec.numerics.asserts import worst
from minibert_spec.numerics.finite_differences import assert_all_passed, elementwise_check
from minibert_spec.protocol import NotApplicable, capabilities, op_of_equation
from minibert_spec.suite.registry import check, lazy_module
from minibert_spec.tolerances import ORACLE_RTOL_F64, SYMPY_CODE_FLOOR, SYMPY_CODE_RTOL

# the equations, loaded on first use: in the worker that runs a check, never to list them
_loaded = lazy_module("minibert_spec.suite.checks.sympy_equations")


class StaleIndexWarning(UserWarning):
    """The generated index of the SymPy <-> code checks is not the equations' current one."""


@functools.cache
def numeric_equations() -> dict[str, dict]:
    """equation id -> variant of every equation with a ``Numeric``, by file, then line
    (minibert_spec.equations._generated.numeric_entries): from the generated index while it is
    current (no SymPy imported); while an equations file differs from the one it was generated
    from, from the equations themselves (SymPy loaded, ~0.9 s), with a warning naming the
    files -- a stale index could list too few checks, a check left out would be a green never
    earned."""
    from minibert_spec.equations._generated import listed_numeric, numeric_entries

    listed, changed = listed_numeric()
    if listed is not None:
        return listed
    warnings.warn(StaleIndexWarning(
        f"spec/equations/_generated/_checks.py is stale ({', '.join(changed)} changed since "
        "it was generated: run `minibert regenerate --no-maps --no-matrix`): the SymPy <-> "
        "code checks are listed from the equations meanwhile"), stacklevel=2)
    return numeric_entries(_loaded.EQUATIONS)


def implementation_equations() -> list[str]:
    """Derivations with a SymPy <-> code check of an op of the implementation (the others
    check the suite's own machinery: tests/equations/test_spec_equations.py runs them)."""
    return [eq_id for eq_id in numeric_equations() if op_of_equation(eq_id)]


def _arrays(spec: dict):
    """Hypothesis strategies for a Numeric.inputs spec (bounded elements, small shapes)."""
    out = {}
    for name, s in spec.items():
        if s[0] == "float":
            out[name] = hnp.arrays(np.float64, s[1], elements=st.floats(
                -s[2], s[2], allow_nan=False, allow_infinity=False, allow_subnormal=False))
        elif s[0] == "float_away":  # magnitude in [margin, bound], either sign
            mag = hnp.arrays(np.float64, s[1], elements=st.floats(s[3], s[2]))
            sign = hnp.arrays(np.float64, s[1], elements=st.sampled_from([-1.0, 1.0]))
            out[name] = st.tuples(mag, sign).map(lambda ms: ms[0] * ms[1])
        elif s[0] == "int":
            out[name] = hnp.arrays(np.int64, s[1], elements=st.integers(0, s[2] - 1))
        else:
            out[name] = hnp.arrays(np.bool_, s[1], elements=st.booleans())
    return st.fixed_dictionaries(out)


@functools.cache
def _inputs_strategy(eq_id, size):
    """One strategy object per equation and size (a fresh one is validated on its first
    draw, which cost more than the draw: minibert_spec.suite.strategies.np_arrays)."""
    return _arrays(_loaded.EQUATIONS[eq_id].numeric.inputs(size))


def _error(a, b, allow=0.0) -> float:
    """max |a - b| (less a declared guard's ``allow``) over max(|a|, |b|, SYMPY_CODE_FLOOR)."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if np.any(~np.isfinite(a) & np.isfinite(b)):  # NaN compares as no error: never a pass
        return float("inf")
    scale = max(np.max(np.abs(a), initial=0.0), np.max(np.abs(b), initial=0.0), SYMPY_CODE_FLOOR)
    return float(np.max(np.maximum(np.abs(a - b) - allow, 0.0), initial=0.0) / scale)


def _guarded(impl, eq_id, arrays, expected):
    """(expected, one allowance per output) under a declared guard of the equation's row
    (spec/protocol/guards.adjustment, called as the code side calls the op:
    ``Numeric.guard_call``): a forward shifted by the guarded formula's exact effect, each
    gradient allowed |guarded - unguarded|."""
    from minibert_spec.protocol.capabilities import declared_guards as declared
    from minibert_spec.protocol.guards import adjustment

    eq = _loaded.EQUATIONS[eq_id]
    none = (0.0,) * len(expected)
    if eq.numeric.guard_call is None:
        return expected, none
    inputs, fixed, dout = eq.numeric.guard_call(**arrays)
    guarded = adjustment(op_of_equation(eq_id), declared(impl), inputs, fixed, dout)
    if guarded is None:
        return expected, none
    if eq.gradient:  # the backward's outputs, one per differentiable input, in order
        allow = [guarded.allowance.get(name) for name in inputs]
        return expected, tuple(0.0 if a is None else a for a in allow)
    return tuple(np.asarray(e) + guarded.shift for e in expected), none


@functools.cache
def sympy_map(eq_id, size):
    """The lambdified SymPy map of one equation at one size, built once per process (up to
    ~20 s for the embedding LayerNorm's backward)."""
    return _loaded.EQUATIONS[eq_id].numeric.sympy(size)


def build_sympy_maps(eq_id):
    """Every size's map, before the check's time limit starts: the suite's cost, not the
    implementation's."""
    for size in _loaded.EQUATIONS[eq_id].numeric.sizes:
        sympy_map(eq_id, size)


@check("sympy", "", cases=[(i, {"eq_id": i}) for i in implementation_equations()],
       equations=lambda kw: (kw["eq_id"],), given={"data": st.data()},
       prepare=build_sympy_maps, needs=lambda kw: dict(numeric_equations()[kw["eq_id"]]))
def sympy_matches_code(impl, eq_id, data):
    """The lambdified SymPy map (forward, or the backward derived with sympy.diff) equals the
    implementation's function within SYMPY_CODE_RTOL."""
    num = _loaded.EQUATIONS[eq_id].numeric
    for name in num.needs:  # a name the implementation lacks: not applicable
        getattr(impl, name)
    if num.other_convention in capabilities(impl)["conventions"]:
        raise NotApplicable(f"{eq_id}: the implementation declares the convention "
                            f"{num.other_convention!r}, another reading of this equation (its "
                            "oracle check compares that reading)")
    size = data.draw(st.sampled_from(num.sizes), label="size")
    arrays = data.draw(_inputs_strategy(eq_id, size), label="inputs")
    if num.adapt is not None:  # the form the implementation declares, on both sides
        arrays = num.adapt(capabilities(impl), arrays)
    if num.accept is not None:
        assume(num.accept(size, **arrays))
    expected = sympy_map(eq_id, size)(**arrays)
    expected, allow = _guarded(impl, eq_id, arrays, expected)
    got = num.code(impl, size, **arrays)
    assert len(got) == len(expected), (
        f"{eq_id}: the code gives {len(got)} outputs, SymPy {len(expected)}")
    for k, (a, b) in enumerate(zip(got, expected)):
        assert np.shape(a) == np.shape(b), f"{eq_id} output {k}: shape {np.shape(a)} vs SymPy " \
                                           f"{np.shape(b)}"
        err = _error(a, b, allow[k])
        if err > SYMPY_CODE_RTOL and num.convention is not None and err <= num.convention[0]:
            import warnings

            from minibert_spec.protocol.capabilities import ConventionWarning

            warnings.warn(ConventionWarning(f"{eq_id}: {num.convention[1]} changes output {k} "
                                            f"by {err:.1e} relative"), stacklevel=2)
            continue
        if err > SYMPY_CODE_RTOL:
            finite = (np.asarray(y, dtype=np.float64) for y in (a, b, SYMPY_CODE_FLOOR))
            scale = max(float(np.max(np.abs(x), initial=0.0, where=np.isfinite(x)))
                        for x in finite)
            where = worst(a, b, SYMPY_CODE_RTOL * scale + allow[k], got_name="code",
                          want_name="sympy")
            raise AssertionError(
                f"{eq_id} output {k} at size {size}: error {err:.2e} > {SYMPY_CODE_RTOL:g}: "
                f"{where}"
                f"\ncode  {np.asarray(a)}\nsympy {np.asarray(b)}")


ROWS = hnp.arrays(np.float64, st.tuples(st.integers(1, 3), st.integers(2, 5)),
                  elements=st.floats(-3, 3, allow_nan=False, allow_subnormal=False))


@check("fd", "softmax_jacobian", equations=("softmax.jacobian",),
       given={"x": ROWS, "seed": st.integers(0, 2 ** 16)})
def softmax_jacobian_finite_differences(impl, x, seed):
    """Row i of J is the gradient of p_i: each checked element-wise against central differences
    of the forward (a random mixed-sign combination of the rows too)."""
    p, _ = impl.softmax_forward(x)
    J = impl.softmax_jacobian(p)  # [R, N, N]
    u = np.random.default_rng(seed).standard_normal(p.shape)

    def f(x_):
        return float(np.sum(u * impl.softmax_forward(x_)[0]))

    grad = np.einsum("rn,rnm->rm", u, J)  # u^T J per row
    results = [elementwise_check(f, x, grad, op="softmax", tensor="x")]
    for r in range(x.shape[0]):
        for i in range(x.shape[1]):
            def f_i(x_, r=r, i=i):
                return float(impl.softmax_forward(x_)[0][r, i])
            g = np.zeros_like(x)
            g[r] = J[r, i]
            results.append(elementwise_check(f_i, x, g, op="softmax", tensor=f"p[{r},{i}]"))
    assert_all_passed(results)


# hand-written, not a case family's oracle: softmax_jacobian is a function of p alone, no op pair
# (its twin is torch.autograd.functional.jacobian)
@check("oracle.forward", "softmax_jacobian", equations=("softmax.jacobian",), requires=("torch",),
       given={"x": ROWS})
def softmax_jacobian_matches_torch(impl, x):
    """Each row's Jacobian equals torch.autograd.functional.jacobian of torch.softmax."""
    import torch

    p, _ = impl.softmax_forward(x)
    J = impl.softmax_jacobian(p)
    for r in range(x.shape[0]):
        ref = torch.autograd.functional.jacobian(lambda t: torch.softmax(t, dim=-1),
                                                 torch.tensor(x[r]))
        np.testing.assert_allclose(J[r], ref.numpy(), rtol=ORACLE_RTOL_F64, atol=0,
                                   err_msg=f"softmax_jacobian row {r} vs torch")
