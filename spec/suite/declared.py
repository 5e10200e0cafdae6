"""The checks of the ops a user declares (minibert_spec.ops): built per implementation from its
``OPS``, with the same :class:`~minibert_spec.suite.registry.Check` objects, runner, messages and
exit statuses as the built-in ops'.

Per declared op ``<name>`` (ids stable: derived from the name alone):

* ``fd[<name>]`` -- every gradient of the backward against central differences of
  ``sum(out * dout)`` in float64, a random upstream gradient, over drawn sizes; along random
  directions, then element by element to name the worst index
  (minibert_spec.numerics.finite_differences.check_gradients);
* ``oracle.forward[<name>-f64|f32]``, ``oracle.backward[<name>-f64|f32]`` (with a torch twin):
  the forward and every gradient against the twin and torch.autograd, at the oracle's
  tolerances (minibert_spec.suite.torch_oracle.assert_oracle);
* ``invariant[<name>.inputs_untouched|float32_kept|finite]``;
* ``bad_input[<name>.rank|dtype|nan|shape]``: a ValueError whose message starts with the
  argument's name, the rule of the built-in ops (minibert_spec.suite.checks.bad_input.raises).

A case is drawn sizes and a seed (:class:`DeclaredCase`): the inputs, the upstream gradient and
the FD directions come from the seed, so a red's "reproduce" line names everything it needs.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from minibert_spec.numerics.asserts import assert_finite
from minibert_spec.numerics.fdcheck import objective
from minibert_spec.numerics.finite_differences import assert_all_passed, check_gradients
from minibert_spec.ops import DeclarationError, OpDeclaration, declared_ops, shape_of
from minibert_spec.protocol import NotApplicable
from minibert_spec.suite.registry import Check, lazy_module

__all__ = ["DeclaredCase", "declared_checks", "checks_of"]

to = lazy_module("minibert_spec.suite.torch_oracle")
TORCH = ("torch",)
DTYPES = (("f64", np.float64), ("f32", np.float32))
INVARIANTS = ("inputs_untouched", "float32_kept", "finite")
BAD_INPUTS = ("rank", "dtype", "nan", "shape")


@dataclass(frozen=True)
class DeclaredCase:
    """One drawn case of a declared op: a size per symbol, and the seed of its values."""

    sizes: tuple  # ((symbol, size), ...): hashable, and printed in order
    seed: int

    def rng(self, salt: int = 0) -> np.random.Generator:
        return np.random.default_rng([self.seed, salt])

    def inputs(self, decl: OpDeclaration, dtype=np.float64) -> dict:
        """The forward's array arguments, in the declaration's order (scalars apart)."""
        rng, sizes, out = self.rng(), dict(self.sizes), {}
        for name, arg in decl.args.items():
            shape = shape_of(arg, sizes)
            if arg.kind == "array":
                out[name] = rng.uniform(arg.low, arg.high, shape).astype(dtype)
            elif arg.kind == "ints":
                out[name] = rng.integers(int(arg.low), int(arg.high) + 1, shape)
            elif arg.kind == "bools":
                out[name] = rng.random(shape) < 0.5
        return out

    def dout(self, out, dtype=np.float64) -> np.ndarray:
        """A random upstream gradient shaped like the forward's output."""
        return self.rng(1).standard_normal(np.shape(out)).astype(dtype)


def smallest(decl: OpDeclaration) -> DeclaredCase:
    """The fixed example: every symbol at its smallest size, seed 0 (the quick run's case)."""
    return DeclaredCase(tuple((s, lo) for s, (lo, _) in decl.sizes.items()), 0)


def strategy(decl: OpDeclaration):
    from hypothesis import strategies as st

    syms = list(decl.sizes)
    return st.builds(lambda vals, seed: DeclaredCase(tuple(zip(syms, vals)), seed),
                     st.tuples(*(st.integers(lo, hi) for lo, hi in decl.sizes.values())),
                     st.integers(0, 2**32 - 1))


def _smooth(decl: OpDeclaration, inputs: dict) -> None:
    """Discard a draw the declaration says is off its smooth domain (a kink within reach)."""
    if decl.smooth is not None:
        from hypothesis import assume

        assume(bool(decl.smooth(**inputs)))


def _gradients(decl: OpDeclaration, grads, inputs: dict) -> dict:
    """The backward's outputs by input name, each checked to be an array like its input."""
    names = decl.differentiable
    assert isinstance(grads, tuple) and len(grads) == len(names), (
        f"{decl.name}: backward returned "
        f"{len(grads) if isinstance(grads, tuple) else type(grads).__name__}"
        f"{' gradients' if isinstance(grads, tuple) else ''}, expected a tuple of one per "
        f"differentiable input {list(names)}")
    for name, g in zip(names, grads):
        x = inputs[name]
        assert isinstance(g, np.ndarray) and g.shape == x.shape and g.dtype == x.dtype, (
            f"{decl.name}: d{name} is {type(g).__name__} {getattr(g, 'shape', '')} "
            f"{getattr(g, 'dtype', '')}, expected {x.shape} {x.dtype}")
    return dict(zip(names, grads))


def _run(decl: OpDeclaration, case: DeclaredCase, dtype=np.float64):
    inputs = case.inputs(decl, dtype)
    _smooth(decl, inputs)
    out, cache = decl.forward(**inputs, **decl.fixed)
    dout = case.dout(out, dtype)
    return inputs, out, dout, cache


# --------------------------------------------------------------------------- the checks
def fd(impl, decl: OpDeclaration, case: DeclaredCase) -> None:
    """Every gradient of the backward equals central differences of sum(out * dout) in
    float64, along random directions, then element by element where a direction disagrees."""
    inputs, _, dout, cache = _run(decl, case)
    grads = _gradients(decl, decl.backward(dout, cache), inputs)

    def f(**kw):
        return objective(decl.forward, kw, decl.fixed, dout)

    assert_all_passed(check_gradients(f, inputs, grads, rng=case.rng(2), op=decl.name))


def oracle(impl, decl: OpDeclaration, dtype, part: str, case: DeclaredCase) -> None:
    """The forward (part "forward"), or every gradient of the backward, equals the torch twin's
    on the same inputs and upstream gradient."""
    import torch

    inputs, out, dout, cache = _run(decl, case, dtype)
    wrt = decl.differentiable

    def twin(**kw):
        return decl.torch(torch, torch.nn.functional, **kw)

    t_out, t_grads = to.vjp(twin, {**inputs, **decl.fixed}, dout, wrt)
    s_in = to.inputs_scale(inputs, dout)
    if part == "forward":
        to.assert_oracle(f"{decl.name} forward", out, t_out, dtype, inputs_scale=s_in)
        return
    grads = _gradients(decl, decl.backward(dout, cache), inputs)
    scale = to.grad_scale(t_grads.values())
    for name in wrt:
        to.assert_oracle(f"{decl.name} d{name}", grads[name], t_grads[name], dtype, scale, s_in)


def _first_change(before: np.ndarray, after: np.ndarray) -> str:
    idx = tuple(int(i) for i in np.argwhere(~((before == after) | (before != before)))[0])
    return f"at index {idx}: {before[idx]!r} became {after[idx]!r}"


def invariant(impl, decl: OpDeclaration, prop: str, case: DeclaredCase) -> None:
    """inputs_untouched: the forward and backward leave their inputs as they were;
    float32_kept: float32 in, float32 out and gradients; finite: the output and the gradients
    of finite inputs are finite."""
    dtype = np.float32 if prop == "float32_kept" else np.float64
    before = {n: v.copy() for n, v in case.inputs(decl, dtype).items()}
    inputs, out, dout, cache = _run(decl, case, dtype)
    grads = decl.backward(dout, cache)
    if prop == "inputs_untouched":
        for n, v in inputs.items():
            assert np.array_equal(v, before[n], equal_nan=v.dtype.kind == "f"), (
                f"{decl.name}: the forward or backward wrote into its input {n} "
                f"{_first_change(before[n], v)}")
        return
    grads = _gradients(decl, grads, inputs) if prop == "finite" else dict(
        zip(decl.differentiable, grads if isinstance(grads, tuple) else (grads,)))
    if prop == "float32_kept":
        for what, v in (("out", out), *((f"d{n}", g) for n, g in grads.items())):
            got = getattr(v, "dtype", type(v).__name__)
            assert got == np.float32, (f"{decl.name}: float32 in -> float32 {what} (got {got})"
                                       " -- a silent cast")
        return
    for what, v in (("out", out), *((f"d{n}", g) for n, g in grads.items())):
        assert_finite(v, np.zeros(np.shape(v)), f"{decl.name} {what}", want_name="finite")


def _wrong_shape(decl: OpDeclaration) -> tuple[str, int] | None:
    """(argument, axis) whose size a validating forward must check: a literal size, a multiple
    of a symbol, or a symbol another array argument shares; None when nothing constrains one."""
    arrays = {n: a for n, a in decl.args.items() if a.kind != "scalar"}
    for name, arg in arrays.items():
        for axis, s in enumerate(arg.shape):
            shared = any(s2 == s or (isinstance(s2, str) and isinstance(s, str)
                                     and s2.split("*")[-1] == s.split("*")[-1])
                         for n2, a2 in arrays.items() if n2 != name for s2 in a2.shape)
            if isinstance(s, int) or "*" in s or shared:
                return name, axis
    return None


def bad(decl: OpDeclaration, what: str, inputs: dict) -> tuple[str, dict]:
    """(the argument named, the inputs with it made bad) for the bad input ``what``."""
    from minibert_spec.suite.checks.bad_input import with_nan

    if what == "shape":
        found = _wrong_shape(decl)
        if found is None:
            raise NotApplicable(f"not applicable: {decl.name} declares no size that one argument "
                                "fixes for another (nothing to mismatch)")
        name, axis = found
        x = inputs[name]
        pad = [(0, 0)] * x.ndim
        pad[axis] = (0, 1)
        return name, {**inputs, name: np.pad(x, pad)}
    name = decl.differentiable[0]
    x = inputs[name]
    made = {"rank": lambda: x[..., None], "dtype": lambda: np.round(x).astype(np.int64),
            "nan": lambda: with_nan(x)}[what]()
    return name, {**inputs, name: made}


def bad_input(impl, decl: OpDeclaration, what: str) -> None:
    """The forward refuses a bad argument with a ValueError whose message starts with its
    name: one axis too many, integers for floats, a NaN, a size that disagrees."""
    from minibert_spec.suite.checks.bad_input import raises

    inputs = smallest(decl).inputs(decl)
    name, given = bad(decl, what, inputs)
    with raises(name):
        decl.forward(**given, **decl.fixed)


# --------------------------------------------------------------------------- building them
def declared_checks(decl: OpDeclaration) -> tuple[Check, ...]:
    """The checks of one declared op, in report order (FD, oracle, invariants, bad input)."""
    given = {"case": strategy(decl)}

    def examples(caps):
        return [{"case": smallest(decl)}]

    def make(kind, label, func, **kw):
        return Check(f"{kind}[{label}]", kind, (decl.name,), (), func, {"decl": decl, **kw},
                     given, examples=examples)

    out = [make("fd", decl.name, fd)]
    if decl.torch is not None:
        out += [Check(f"oracle.{part}[{decl.name}-{label}]", f"oracle.{part}", (decl.name,), (),
                      oracle, {"decl": decl, "dtype": dtype, "part": part}, given, TORCH,
                      examples=examples)
                for part in ("forward", "backward") for label, dtype in DTYPES]
    out += [make("invariant", f"{decl.name}.{p}", invariant, prop=p) for p in INVARIANTS]
    out += [Check(f"bad_input[{decl.name}.{w}]", "bad_input", (decl.name,), (),
                  bad_input, {"decl": decl, "what": w}, quick=True)
            for w in BAD_INPUTS]
    return tuple(out)


def checks_of(impl) -> tuple[Check, ...]:
    """The checks of every op ``impl`` declares (``OPS``; () without one).  A DeclarationError
    (one line) for a malformed ``OPS`` or an op whose ids would be a built-in check's."""
    from minibert_spec.suite.registry import all_checks
    from minibert_spec.suite.strategies import FAMILIES

    families = {f.name for f in FAMILIES}
    out = []
    for decl in declared_ops(impl):
        if decl.name in families:
            raise DeclarationError(f"OPS[{decl.name!r}].name: expected a name that is not a "
                                   f"built-in case family's (its check ids are taken), got "
                                   f"{decl.name!r}")
        out += declared_checks(decl)
    taken = {c.id for c in all_checks()} & {c.id for c in out}
    if taken:
        raise DeclarationError(f"OPS: the check ids {sorted(taken)} are built-in checks'")
    return tuple(out)
