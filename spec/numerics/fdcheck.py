"""Running an op case family on an implementation, and the op-level finite-difference check.

A case family (``@cases`` in spec/suite/strategies/) is a row of ``minibert_spec.protocol.OPS``
(its protocol names and equation IDs) with the strategy drawing its cases and, for composite ops
whose smoothness depends on the forward itself (the block), a filter run on the
implementation's own protocol ops.  ``check_op`` compares every output of the backward with
central finite differences of ``sum(out * dout)`` in float64
(``minibert_spec.numerics.finite_differences``).
"""

from __future__ import annotations

import numpy as np

from minibert_spec.numerics.asserts import assert_close
from minibert_spec.numerics.finite_differences import (
    assert_all_passed,
    directional_check,
    elementwise_check,
    localise,
)
from minibert_spec.tolerances import (
    F32_CONDITIONING_FACTOR,
    F32_CONDITIONING_SAMPLES,
    F32_CONDITIONING_SEED,
    F32_VS_F64_ATOL,
    F32_VS_F64_RTOL,
)


def run_op(impl, family, case, inputs=None, dout=None, between=None):
    """forward + backward; returns (out, grads tuple aligned with the differentiable inputs).
    ``family`` / ``case``: a ``CaseFamily`` and one of its ``OpCase`` s (spec/suite/strategies/;
    this layer takes them as they come, it does not import the suite).  ``between``: other
    inputs run through the forward before the backward (the cache of the first call must still
    be the one the backward uses)."""
    forward, backward = family.bind(impl)
    inputs = case.inputs if inputs is None else inputs
    out, cache = forward(**inputs, **case.fixed)
    if between is not None:
        forward(**between, **case.fixed)
    grads = backward(case.dout if dout is None else dout, cache)
    return out, grads


def _other(v):
    """Other values of the same shape and dtype: the entries in reverse order along every axis
    (a row keeps its sum and spread: probabilities stay probabilities, a row away from
    constant stays so); ints and None unchanged."""
    if isinstance(v, np.ndarray) and np.issubdtype(v.dtype, np.floating):
        return np.ascontiguousarray(np.flip(v))
    return v


def objective(forward, inputs, fixed, dout) -> float:
    """sum(out * dout): its gradient w.r.t. each input is what the backward returns for dout."""
    out, _ = forward(**inputs, **fixed)
    return float(np.sum(np.asarray(out) * dout))


def check_op(impl, family, case) -> dict:
    """FD check of every output of the backward; returns {input name: gradient}.  A second
    forward on other values runs before the backward, as FD and training loops do: an
    implementation whose cache is shared state (one object's attributes) then back-propagates
    the wrong activations."""
    forward, _ = family.bind(impl)
    out, grads = run_op(impl, family, case,
                        between={k: _other(v) for k, v in case.inputs.items()})
    names = list(case.inputs)
    assert isinstance(grads, tuple) and len(grads) == len(names), (
        f"{family.name}: backward returned {len(grads) if isinstance(grads, tuple) else grads!r}"
        f" gradients, expected a tuple of one per differentiable input {names}")
    assert np.shape(out) == np.shape(case.dout), (
        f"{family.name}: output shape {np.shape(out)}, expected {np.shape(case.dout)}")
    for name, g in zip(names, grads):
        x = case.inputs[name]
        if x is None:
            assert g is None, (f"{family.name}: gradient for the absent input {name} should be "
                               f"None, got {type(g).__name__}")
            continue
        assert isinstance(g, np.ndarray) and g.shape == x.shape and g.dtype == x.dtype, (
            f"{family.name}: d{name} is {type(g).__name__} {getattr(g, 'shape', '')} "
            f"{getattr(g, 'dtype', '')}, expected {x.shape} {x.dtype}")
    assert_all_passed(either_guarded_form(
        lambda gs: _compare(forward, family, case, gs), dict(zip(names, grads)), impl,
        family.op, case.inputs, case.fixed, case.dout))
    return dict(zip(names, grads))


def either_guarded_form(compare, grads: dict, impl, row: str, inputs, fixed, dout) -> list:
    """``compare(grads)``'s results; when red and ``row`` has a declared loss guard, those of
    the gradients with the guard's other form taken away instead, if they are green.  A
    declared loss guard allows two gradients: the guarded log's (the exact derivative of the
    guarded forward, what finite differences measure) and the plain log's
    (minibert_spec.protocol.guards.alternative_gradient): the backward may return either, and
    nothing
    else."""
    results = compare(grads)
    if all(r.passed for r in results):
        return results
    from minibert_spec.protocol import capabilities
    from minibert_spec.protocol.guards import alternative_gradient

    delta = alternative_gradient(row, capabilities(impl)["guards"], inputs, fixed, dout)
    if delta is None:
        return results
    other = compare({n: g if g is None or delta.get(n) is None
                     else g - np.asarray(delta[n]).astype(g.dtype) for n, g in grads.items()})
    return other if all(r.passed for r in other) else results


def _compare(forward, family, case, grads: dict) -> list:
    """Each present gradient against central differences of sum(out * dout): element by
    element on tiny tensors, along random directions otherwise (the same directions for the
    same case: the seed is the case's)."""
    rng = np.random.default_rng(case.seed)
    results = []
    for name, g in grads.items():
        x = case.inputs[name]
        if x is None:
            continue

        def f(v, _name=name):
            return objective(forward, {**case.inputs, _name: v}, case.fixed, case.dout)

        if x.size <= family.elementwise_max:
            results.append(elementwise_check(f, x, g, op=family.name, tensor=name))
        else:
            r = directional_check(f, x, g, rng=rng, n_dirs=family.n_dirs, op=family.name,
                                  tensor=name)
            results.append(localise(f, x, g, r, rng))  # a red names the worst element
    return results


def assert_f32_close(x32, x64, scale: float, what: str, what_kept: str = "out",
                     offset=0.0, conditioning: float = 0.0) -> None:
    """A float32 result against the float64 run of the same code on the same (float32-rounded)
    inputs: F32_VS_F64_RTOL relative, and an absolute floor F32_VS_F64_ATOL times ``scale``, the
    largest magnitude among the results it is compared with (an entry near 0 because terms of
    that size cancelled carries float32 rounding of that size, not of its own).  ``offset``: a
    known part both results carry (a large constant passed through), subtracted in float64
    before comparing, so the relative rule applies to the rest and not to the constant.
    ``conditioning``: how far float32 rounding of the inputs alone moves the result (measured
    in float64, :func:`input_rounding_sensitivity`), allowed F32_CONDITIONING_FACTOR times on
    top: float32 code cannot be closer to the float64 result than its own rounded inputs
    allow."""
    x32 = np.asarray(x32)
    # a scalar loss promoted to float64 is a documented convention (spec/protocol.py), not a
    # silent cast; every other result must stay float32
    convention = x32.ndim == 0 and x32.dtype == np.float64
    assert x32.dtype == np.float32 or convention, (
        f"{what}: float32 in -> float32 {what_kept} (got {x32.dtype}) -- a silent cast")
    if np.any(offset):
        x32, x64 = x32.astype(np.float64) - offset, np.asarray(x64, np.float64) - offset
    atol = F32_VS_F64_ATOL * max(1.0, scale) + F32_CONDITIONING_FACTOR * conditioning
    rule = None if not conditioning else (
        f"rtol {F32_VS_F64_RTOL:g}, atol {atol:g}: {F32_VS_F64_ATOL:g} x {max(1.0, scale):.3g} "
        f"+ {F32_CONDITIONING_FACTOR:g} x {conditioning:.3g}, the change 1-ulp float32 "
        "roundings of the inputs make in float64")
    assert_close(x32, x64, rtol=F32_VS_F64_RTOL, atol=atol, what=what, rule=rule)


def input_rounding_sensitivity(run, inputs: dict, dout, results) -> list[float]:
    """How far float32 rounding of the inputs alone moves each of ``results`` (the float64
    run's output and gradients, None where absent): the largest change, over
    F32_CONDITIONING_SAMPLES draws, when every float input and ``dout`` is perturbed by one
    float32 unit roundoff (2**-24) relative, each entry with a random sign, and ``run(inputs,
    dout)`` recomputes them in float64.  A well-conditioned op moves by a few roundoffs of its
    results; where a float32 check fails by less than a few times this, the case is
    ill-conditioned (its float32 answer is as good as its float32 inputs), not the code wrong.
    The signs come from a fixed generator: two calls agree."""
    rng = np.random.default_rng(F32_CONDITIONING_SEED)
    u = 2.0 ** -24
    sens = [0.0] * len(results)

    def nudge(v):
        if isinstance(v, np.ndarray) and np.issubdtype(v.dtype, np.floating):
            return v * (1 + u * rng.choice([-1.0, 1.0], size=v.shape))
        return v

    for _ in range(F32_CONDITIONING_SAMPLES):
        moved = run({k: nudge(v) for k, v in inputs.items()}, nudge(dout))
        sens = [s if r is None or m is None else
                max(s, float(np.max(np.abs(np.asarray(m, np.float64) - r), initial=0.0)))
                for s, m, r in zip(sens, moved, results)]
    return sens


def max_abs(*arrays) -> float:
    return max(float(np.max(np.abs(a))) for a in arrays if a is not None)
