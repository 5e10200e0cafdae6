"""Every op pair against PyTorch: one check over every case family that names its torch twin
(``@cases(..., torch="name")`` in spec/suite/strategies/), drawing from the same cases as the
finite-difference check, in float64 and float32.  The forward output (kind ``oracle.forward``)
and every output of the backward (``oracle.backward``), given the same random upstream
gradient, against the twin and ``torch.autograd`` (spec/suite/torch_oracle.py), within
ORACLE_RTOL_F64 / ORACLE_RTOL_F32 of the magnitude of the result (torch_oracle.allowed_error
says why that, and not entry by entry) and a family's own rules: a declared guard of its row
(spec/protocol/guards.adjustment: the guarded formula's shift and allowance), the LayerNorm
backward's rounding floor (minibert_spec.tolerances.layernorm_backward_scale), torch in float64
where its float32 is the inaccurate side (GELU).

torch is imported when a check runs (the ``oracle`` extra), not when the suite is loaded.
The hand-written oracles left are the ones no case family can state: the sinusoidal table
below (a function of (T, d), not an op pair), the whole model (oracle_model.py), the BERT
checkpoints (oracle_bert.py) and the optimizer (oracle_optim.py).
"""

from __future__ import annotations

import numpy as np
from hypothesis import assume
from hypothesis import strategies as st

from minibert_spec.protocol.capabilities import declared_guards
from minibert_spec.protocol.guards import adjustment
from minibert_spec.suite import strategies as S
from minibert_spec.suite.checks.invariants import cast_case
from minibert_spec.suite.registry import check, grid, lazy_module

to = lazy_module("minibert_spec.suite.torch_oracle")
torch = lazy_module("torch")
TORCH = ("torch",)
DTYPE_AXIS = [("f64", np.float64), ("f32", np.float32)]


def _or_zero(allowance):
    return 0.0 if allowance is None else allowance


def compare_with_torch(impl, family: S.CaseFamily, case: S.OpCase, part: str, dtype,
                       backward_scale: float | None = None) -> None:
    """The family's forward (part "forward") or every gradient of its backward (part
    "backward", the forward's output never compared there) on ``case`` cast to ``dtype``,
    against the family's torch twin.  ``backward_scale``: the magnitude of the terms the
    backward sums, for its rounding floor (default: the family's rule, else the inputs')."""
    case = cast_case(case, dtype)
    forward, backward = family.bind(impl)
    out, cache = forward(**case.inputs, **case.fixed)
    t_case = cast_case(case, np.float64) if family.torch_float64 else case
    wrt = tuple(n for n, v in case.inputs.items() if v is not None)
    t_out, t_grads = to.vjp(family.twin(), {**t_case.inputs, **t_case.fixed}, t_case.dout, wrt,
                            backward=part != "forward")  # a forward check reads no gradient
    if family.torch_float64:
        t_out, t_grads = t_out.astype(dtype), {k: v.astype(dtype) for k, v in t_grads.items()}
    s_in = to.inputs_scale(case.inputs, case.dout)
    guarded = adjustment(family.op, declared_guards(impl), case.inputs, case.fixed, case.dout)
    shift, allow = (0.0, {}) if guarded is None else (guarded.shift, guarded.allowance)
    if part == "forward":
        to.assert_oracle(f"{family.name} forward", out, t_out + shift, dtype, inputs_scale=s_in)
        return
    grads = backward(case.dout, cache)
    names = list(case.inputs)
    assert isinstance(grads, tuple) and len(grads) == len(names), (
        f"{family.name} backward: {len(grads) if isinstance(grads, tuple) else grads!r} "
        f"outputs, expected a tuple of one per differentiable input {names}")
    absent = [n for n, g in zip(names, grads) if case.inputs[n] is None and g is not None]
    assert not absent, (f"{family.name} backward: expected None for the absent {absent}, got "
                        "arrays")
    if backward_scale is None:
        backward_scale = 0.0 if family.backward_scale is None else family.backward_scale(case)
    scale = to.grad_scale(t_grads.values())
    for name, g in zip(names, grads):
        if case.inputs[name] is not None:
            to.assert_oracle(f"{family.name} d{name}", g, t_grads[name], dtype, scale,
                            max(s_in, backward_scale), allowance=_or_zero(allow.get(name)))


@check("oracle.forward|oracle.backward", "", kinds_arg="part",
       requires=lambda c: TORCH + c["family"].torch_requires,
       cases=[(f"{f.name}-{label}", {"family": f, "dtype": dtype}) for f in S.families()
              if f.torch for label, dtype in DTYPE_AXIS],
       equations=lambda c: c["family"].equations, ops=lambda c: (c["family"].op,),
       given=lambda c: c["family"].given, examples=lambda c: c["family"].explicit,
       needs=lambda c: dict(c["family"].needs))
def against_torch(impl, family, dtype, part, case):
    """The forward, or every gradient of the backward, equals the torch twin's (float32 on the
    cases a float32 comparison can resolve: the family's ``f32_ok``)."""
    if dtype == np.float32 and family.f32_ok is not None:
        assume(family.f32_ok(case))
    compare_with_torch(impl, family, case, part, dtype)


# the table alone: sinusoidal_encoding is a function of (T, d), not an op pair with inputs to
# draw -- no case family can state it (its forward, x + PE, is the family's)
@check("oracle.forward", "", requires=TORCH, equations=("position.sinusoidal",),
       cases=[(f"sinusoidal_position.encoding-{label}", kw) for label, kw in
              grid(dtype=DTYPE_AXIS)],
       given={"T": st.integers(1, 64), "d": st.integers(1, 16)})
def sinusoidal_table(impl, dtype, T, d):
    """sinusoidal_encoding(T, d, dtype) equals the table written as the PyTorch tutorials write
    it."""
    ours = impl.sinusoidal_encoding(T, d, dtype)
    theirs = to.sinusoidal_table(T, d, torch.float64).numpy().astype(dtype)
    to.assert_oracle(f"sinusoidal_encoding[T={T}, d={d}]", ours, theirs, dtype)
