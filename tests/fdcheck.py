"""The op table shared by the finite-difference and invariant tests, and the op-level FD check.

Each :class:`OpSpec` names a row of ``spec.protocol.OPS`` (which gives its protocol names and
equation IDs), the strategy drawing its cases, and, for composite ops whose smoothness depends on
the forward itself (the block), a filter run on the implementation's own protocol ops.
``check_op`` compares every output of the backward with central finite
differences of ``sum(out * dout)`` in float64 (``spec.gradcheck``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from hypothesis import strategies as st

from spec.gradcheck import assert_all_passed, directional_check, elementwise_check
from spec.protocol import OPS as PROTOCOL_OPS
from spec.tolerances import F32_VS_F64_ATOL, F32_VS_F64_RTOL, KINK_MARGIN, LN_MIN_VAR
from tests import strategies as S

# Tensors up to this many elements are checked element by element (localises a failure to an
# index); larger ones along random directions (two evaluations per direction).
ELEMENTWISE_MAX_SIZE = 32
N_DIRECTIONS = 3


@dataclass(frozen=True)
class OpSpec:
    """One FD case family: a row of spec.protocol.OPS (its protocol names and equation IDs)
    with the strategy, adapter and filters that live in the tests."""

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

    @property
    def equations(self) -> tuple[str, ...]:
        ids = (e for row in (self.op, *self.also) for e in PROTOCOL_OPS[row].equations)
        return tuple(e for e in ids if e.rsplit(".", 1)[-1] not in self.omit)

    def bind(self, impl):
        if self.adapter is not None:
            return self.adapter(impl)
        names = PROTOCOL_OPS[self.op].names
        forward = next(n for n in names if n.endswith("_forward"))
        backward = next(n for n in names if n.endswith("_backward"))
        return getattr(impl, forward), getattr(impl, backward)


# --------------------------------------------------------------------------- the block adapter
def _block_adapter(impl):
    """block_forward(x, p, ...) with p a dict -> forward(x, **p) and a tuple backward."""

    def forward(x, *, n_heads, mask=None, eps=1e-12, **p):
        out, cache = impl.block_forward(x, p, n_heads=n_heads, mask=mask, eps=eps)
        return out, (cache, tuple(p))

    def backward(dout, cache):
        cache, names = cache
        dx, grads = impl.block_backward(dout, cache)
        if set(grads) != set(names):
            raise AssertionError(f"block_backward: grads keys {sorted(grads)} != params "
                                 f"{sorted(names)}")
        return (dx, *(grads[n] for n in names))

    return forward, backward


def block_smooth(impl, case: S.OpCase) -> bool:
    """Both LayerNorm inputs have row variance >= LN_MIN_VAR and the FFN's ReLU pre-activation
    is >= KINK_MARGIN from 0 (computed with the implementation's own protocol ops)."""
    p, x = case.inputs, case.inputs["x"]
    attn = [p.get(f"attn.{n}") for n in S.ATTENTION_WEIGHTS + S.ATTENTION_BIASES]
    a, _ = impl.attention_forward(x, *attn, n_heads=case.fixed["n_heads"],
                                  mask=case.fixed["mask"])
    if np.min((x + a).var(axis=-1)) < LN_MIN_VAR:
        return False
    h1, _ = impl.layernorm_forward(x + a, p["ln1.gamma"], p["ln1.beta"])
    pre, _ = impl.linear_forward(h1, p["ffn.W_1"], p["ffn.b_1"])
    if np.min(np.abs(pre)) <= KINK_MARGIN:
        return False
    f, _ = impl.ffn_forward(h1, p["ffn.W_1"], p["ffn.b_1"], p["ffn.W_2"], p["ffn.b_2"])
    return bool(np.min((h1 + f).var(axis=-1)) >= LN_MIN_VAR)


# --------------------------------------------------------------------------- the op table
def _ops() -> list[OpSpec]:
    ops = [
        OpSpec("embedding", "embedding", S.embedding_cases),
        OpSpec("position_embedding", "position_embedding", S.position_embedding_cases),
        OpSpec("sinusoidal_position", "sinusoidal_position", S.sinusoidal_position_cases),
        OpSpec("linear_bias", "linear", lambda: S.linear_cases(bias=True)),
        OpSpec("linear_nobias", "linear", lambda: S.linear_cases(bias=False), omit=("db",)),
        OpSpec("layernorm", "layernorm", S.layernorm_cases),
        OpSpec("softmax", "softmax", lambda: S.softmax_cases(masked=False)),
        OpSpec("softmax_masked", "softmax", lambda: S.softmax_cases(masked=True)),
        OpSpec("relu", "relu", S.relu_cases),
        OpSpec("tanh", "tanh", S.tanh_cases),
    ]
    for bias in (False, True):
        for masked in (False, True):
            tag = ("_bias" if bias else "_nobias") + ("_mask" if masked else "")
            ops.append(OpSpec(
                "attention" + tag, "attention",
                lambda bias=bias, masked=masked: S.attention_cases(bias=bias, masked=masked),
                also=("heads",)))
    ops.append(OpSpec("ffn", "ffn", S.ffn_cases))
    for bias in (False, True):
        for masked in (False, True):
            tag = ("_bias" if bias else "_nobias") + ("_mask" if masked else "")
            ops.append(OpSpec(
                "block" + tag, "block",
                lambda bias=bias, masked=masked: S.block_cases(bias=bias, masked=masked),
                adapter=_block_adapter, smooth=block_smooth,
                # a LayerNorm over 2 features maps every row to gamma * (+-1, -+1) + beta:
                # its Jacobian is 0 (up to eps), so every gradient upstream of it is a pure
                # cancellation, ~0 in float64 and rounding noise of O(u * terms) in float32
                f32_ok=lambda case: case.inputs["x"].shape[-1] >= 3,
                elementwise_max=0, n_dirs=2))  # ~20 tensors through a whole block: directional only
    ops += [
        OpSpec("pooler", "pooler", S.pooler_cases),
        OpSpec("pooler_nobias", "pooler", lambda: S.pooler_cases(bias=False)),
        OpSpec("cross_entropy_mean", "cross_entropy", lambda: S.cross_entropy_cases("mean"),
               omit=("sum",)),
        OpSpec("cross_entropy_sum", "cross_entropy", lambda: S.cross_entropy_cases("sum"),
               omit=("mean",)),
        OpSpec("mse", "mse", S.mse_cases),
    ]
    return ops


OPS: list[OpSpec] = _ops()


def op_params(ops=None):
    """pytest.param per op, id = op name, tagged with the op's equation IDs."""
    import pytest

    return [pytest.param(op, id=op.name, marks=pytest.mark.equation(*op.equations))
            for op in (OPS if ops is None else ops)]


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


def check_op(impl, op: OpSpec, case: S.OpCase) -> dict:
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
    assert x32.dtype == np.float32, f"{what}: float32 inputs gave {x32.dtype} (a silent cast)"
    np.testing.assert_allclose(x32, x64, rtol=F32_VS_F64_RTOL,
                               atol=F32_VS_F64_ATOL * max(1.0, scale), err_msg=what)


def max_abs(*arrays) -> float:
    return max(float(np.max(np.abs(a))) for a in arrays if a is not None)
