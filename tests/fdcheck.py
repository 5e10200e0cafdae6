"""The op table shared by the finite-difference and invariant tests, and the op-level FD check.

Each :class:`OpSpec` is a case family registered with ``@cases`` in tests/strategies.py: a row
of ``spec.protocol.OPS`` (which gives its protocol names and equation IDs), the strategy drawing
its cases, and, for composite ops whose smoothness depends on the forward itself (the block), a
filter run on the implementation's own protocol ops.  The table is derived: adding an op's
strategy with ``@cases`` adds its tests.
``fd_check`` compares every output of the backward with central finite
differences of ``sum(out * dout)`` in float64 (``spec.gradcheck``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from hypothesis import strategies as st

from spec.gradcheck import assert_all_passed, directional_check, elementwise_check
from spec.protocol import OPS as PROTOCOL_OPS
from spec.tolerances import F32_VS_F64_ATOL, F32_VS_F64_RTOL
from tests import strategies as S

# Tensors up to this many elements are checked element by element (localises a failure to an
# index); larger ones along random directions (two evaluations per direction).
ELEMENTWISE_MAX_SIZE = 32
N_DIRECTIONS = 3


@dataclass(frozen=True)
class OpSpec:
    """One FD case family: a row of spec.protocol.OPS (its protocol names and equation IDs)
    with the strategy, adapter and filters registered next to the strategy
    (``@cases`` in tests/strategies.py)."""

    name: str  # the test id: the op, or the op and its variant (linear_nobias)
    op: str  # the row of spec.protocol.OPS
    cases: Callable[[], st.SearchStrategy[S.OpCase]]
    # last components of the op's equation IDs this variant does not exercise ("db" without a
    # bias, "sum" for the mean reduction), and further rows realised inside it (attention
    # splits and merges heads)
    omit: tuple[str, ...] = ()
    also: tuple[str, ...] = ()
    adapter: Callable | None = None  # impl -> (forward, backward) for non-standard signatures
    smooth: Callable | None = None  # (impl, case) -> bool: the case is away from non-smooth points
    elementwise_max: int = ELEMENTWISE_MAX_SIZE
    n_dirs: int = N_DIRECTIONS
    # (case) -> bool: the case is well-conditioned enough to compare float32 with float64
    f32_ok: Callable | None = None

    @classmethod
    def of(cls, family: S.CaseFamily) -> OpSpec:
        defaults = {k: v for k, v in (("elementwise_max", family.elementwise_max),
                                      ("n_dirs", family.n_dirs)) if v is not None}
        return cls(family.name, family.op, family.cases, family.omit, family.also,
                   family.adapter, family.smooth, f32_ok=family.f32_ok, **defaults)

    @property
    def equations(self) -> tuple[str, ...]:
        ids = (e for row in (self.op, *self.also) for e in PROTOCOL_OPS[row].equations)
        return tuple(e for e in ids if e.rsplit(".", 1)[-1] not in self.omit)

    def bind(self, impl):
        if self.adapter is not None:
            return self.adapter(impl)
        forward, backward = PROTOCOL_OPS[self.op].pair
        return getattr(impl, forward), getattr(impl, backward)


block_smooth = S.block_smooth  # registered with the block's case families


# --------------------------------------------------------------------------- the op table
def _ops() -> list[OpSpec]:
    """Every case family registered in tests/strategies.py, in the order of the protocol's op
    table (spec.protocol.OPS), then of registration."""
    unknown = sorted({f.op for f in S.FAMILIES} - set(PROTOCOL_OPS))
    if unknown:
        raise ValueError(f"tests/strategies.py: case families of unknown ops {unknown}")
    return [OpSpec.of(f) for op in PROTOCOL_OPS for f in S.FAMILIES if f.op == op]


OP_SPECS: list[OpSpec] = _ops()


def ops_without_cases() -> list[str]:
    """Op pairs of spec.protocol.OPS with no registered case family (forgotten strategies)."""
    covered = {f.op for f in S.FAMILIES}
    return [name for name, row in PROTOCOL_OPS.items() if row.pair and name not in covered]


def op_params(ops=None):
    """pytest.param per op, id = op name, tagged with the op's equation IDs."""
    import pytest

    return [pytest.param(op, id=op.name, marks=pytest.mark.equation(*op.equations))
            for op in (OP_SPECS if ops is None else ops)]


# --------------------------------------------------------------------------- running an op
def run_op(impl, op: OpSpec, case: S.OpCase, inputs=None, dout=None):
    """forward + backward; returns (out, grads tuple aligned with the differentiable inputs)."""
    forward, backward = op.bind(impl)
    inputs = case.inputs if inputs is None else inputs
    out, cache = forward(**inputs, **case.fixed)
    grads = backward(case.dout if dout is None else dout, cache)
    return out, grads


def objective(forward, inputs, fixed, dout) -> float:
    """sum(out * dout): its gradient w.r.t. each input is what the backward returns for dout."""
    out, _ = forward(**inputs, **fixed)
    return float(np.sum(np.asarray(out) * dout))


def fd_check(impl, op: OpSpec, case: S.OpCase) -> dict:
    """FD check of every output of the backward; returns {input name: gradient}."""
    forward, _ = op.bind(impl)
    out, grads = run_op(impl, op, case)
    names = list(case.inputs)
    assert isinstance(grads, tuple) and len(grads) == len(names), (
        f"{op.name}: backward returned {len(grads)} gradients, expected one per "
        f"differentiable input {names}")
    assert np.shape(out) == np.shape(case.dout), f"{op.name}: output shape {np.shape(out)}"
    rng = np.random.default_rng(case.seed)
    results = []
    for name, g in zip(names, grads):
        x = case.inputs[name]
        if x is None:
            assert g is None, f"{op.name}: gradient for absent input {name} should be None"
            continue
        assert isinstance(g, np.ndarray) and g.shape == x.shape and g.dtype == x.dtype, (
            f"{op.name}: d{name} is {type(g).__name__} {getattr(g, 'shape', '')} "
            f"{getattr(g, 'dtype', '')}, expected {x.shape} {x.dtype}")

        def f(v, _name=name):
            return objective(forward, {**case.inputs, _name: v}, case.fixed, case.dout)

        if x.size <= op.elementwise_max:
            results.append(elementwise_check(f, x, g, op=op.name, tensor=name))
        else:
            results.append(directional_check(f, x, g, rng=rng, n_dirs=op.n_dirs,
                                             op=op.name, tensor=name))
    assert_all_passed(results)
    return dict(zip(names, grads))


def assert_f32_close(x32, x64, scale: float, what: str) -> None:
    """A float32 result against the float64 run of the same code on the same (float32-rounded)
    inputs: F32_VS_F64_RTOL relative, and an absolute floor F32_VS_F64_ATOL times ``scale``, the
    largest magnitude among the results it is compared with (an entry near 0 because terms of
    that size cancelled carries float32 rounding of that size, not of its own)."""
    x32 = np.asarray(x32)
    # a scalar loss promoted to float64 is a documented convention (spec/protocol.py), not a
    # silent cast; every other result must stay float32
    convention = x32.ndim == 0 and x32.dtype == np.float64
    assert x32.dtype == np.float32 or convention, (
        f"{what}: float32 inputs gave {x32.dtype} (a silent cast)")
    np.testing.assert_allclose(x32, x64, rtol=F32_VS_F64_RTOL,
                               atol=F32_VS_F64_ATOL * max(1.0, scale), err_msg=what)


def max_abs(*arrays) -> float:
    return max(float(np.max(np.abs(a))) for a in arrays if a is not None)
