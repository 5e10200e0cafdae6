"""The op table shared by the finite-difference and invariant tests, and the op-level FD check.

Each :class:`OpSpec` names an op pair of the implementation protocol (reached through ``impl``),
the strategy drawing its cases, the equation IDs it realises, and, for composite ops whose
smoothness depends on the forward itself (the block), a filter run on the implementation's own
protocol ops.  ``check_op`` compares every output of the backward with central finite
differences of ``sum(out * dout)`` in float64 (``spec.gradcheck``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from hypothesis import strategies as st

from spec.gradcheck import assert_all_passed, directional_check, elementwise_check
from spec.tolerances import F32_VS_F64_ATOL, F32_VS_F64_RTOL, KINK_MARGIN, LN_MIN_VAR
from tests import strategies as S

# Tensors up to this many elements are checked element by element (localises a failure to an
# index); larger ones along random directions (two evaluations per direction).
ELEMENTWISE_MAX_SIZE = 32
N_DIRECTIONS = 3


@dataclass(frozen=True)
class OpSpec:
    name: str
    cases: Callable[[], st.SearchStrategy[S.OpCase]]
    equations: tuple[str, ...]
    forward: str = ""  # impl attribute names; empty for adapted ops (see ``bind``)
    backward: str = ""
    adapter: Callable | None = None  # impl -> (forward, backward) for non-standard signatures
    smooth: Callable | None = None  # (impl, case) -> bool: the case is away from non-smooth points
    elementwise_max: int = ELEMENTWISE_MAX_SIZE
    n_dirs: int = N_DIRECTIONS
    # (case) -> bool: the case is well-conditioned enough to compare float32 with float64
    f32_ok: Callable | None = None

    def bind(self, impl):
        if self.adapter is not None:
            return self.adapter(impl)
        return getattr(impl, self.forward), getattr(impl, self.backward)


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
    att_ids = ("attention.qkv", "attention.scores", "attention.context", "attention.output",
               "attention.split_heads", "attention.merge_heads", "attention.backward.dW_o",
               "attention.backward.dV", "attention.backward.dP", "attention.backward.dS",
               "attention.backward.dQ", "attention.backward.dK", "attention.backward.dx")
    ops = [
        OpSpec("embedding", S.embedding_cases, ("embedding.forward", "embedding.backward"),
               "embedding_forward", "embedding_backward"),
        OpSpec("position_embedding", S.position_embedding_cases,
               ("position.learned.forward", "position.learned.backward"),
               "position_embedding_forward", "position_embedding_backward"),
        OpSpec("sinusoidal_position", S.sinusoidal_position_cases, ("position.sinusoidal",),
               "sinusoidal_position_forward", "sinusoidal_position_backward"),
        OpSpec("linear_bias", lambda: S.linear_cases(bias=True),
               ("linear.forward", "linear.backward.dx", "linear.backward.dW",
                "linear.backward.db"), "linear_forward", "linear_backward"),
        OpSpec("linear_nobias", lambda: S.linear_cases(bias=False),
               ("linear.forward", "linear.backward.dx", "linear.backward.dW"),
               "linear_forward", "linear_backward"),
        OpSpec("layernorm", S.layernorm_cases,
               ("layernorm.forward", "layernorm.backward.dx", "layernorm.backward.dgamma",
                "layernorm.backward.dbeta"), "layernorm_forward", "layernorm_backward"),
        OpSpec("softmax", lambda: S.softmax_cases(masked=False),
               ("softmax.forward", "softmax.backward"), "softmax_forward", "softmax_backward"),
        OpSpec("softmax_masked", lambda: S.softmax_cases(masked=True),
               ("softmax.forward", "softmax.backward"), "softmax_forward", "softmax_backward"),
        OpSpec("relu", S.relu_cases, ("relu.forward", "relu.backward"),
               "relu_forward", "relu_backward"),
        OpSpec("tanh", S.tanh_cases, ("tanh.forward", "tanh.backward"),
               "tanh_forward", "tanh_backward"),
    ]
    for bias in (False, True):
        for masked in (False, True):
            tag = ("_bias" if bias else "_nobias") + ("_mask" if masked else "")
            ops.append(OpSpec(
                "attention" + tag,
                lambda bias=bias, masked=masked: S.attention_cases(bias=bias, masked=masked),
                att_ids, "attention_forward", "attention_backward"))
    ops.append(OpSpec("ffn", S.ffn_cases, ("ffn.forward", "ffn.backward"),
                      "ffn_forward", "ffn_backward"))
    for bias in (False, True):
        for masked in (False, True):
            tag = ("_bias" if bias else "_nobias") + ("_mask" if masked else "")
            ops.append(OpSpec(
                "block" + tag,
                lambda bias=bias, masked=masked: S.block_cases(bias=bias, masked=masked),
                ("block.postln", "residual.forward", "residual.backward"),
                adapter=_block_adapter, smooth=block_smooth,
                # a LayerNorm over 2 features maps every row to gamma * (+-1, -+1) + beta:
                # its Jacobian is 0 (up to eps), so every gradient upstream of it is a pure
                # cancellation, ~0 in float64 and rounding noise of O(u * terms) in float32
                f32_ok=lambda case: case.inputs["x"].shape[-1] >= 3,
                elementwise_max=0, n_dirs=2))  # ~20 tensors through a whole block: directional only
    ops += [
        OpSpec("pooler", S.pooler_cases, ("pooler.forward",), "pooler_forward",
               "pooler_backward"),
        OpSpec("pooler_nobias", lambda: S.pooler_cases(bias=False), ("pooler.forward",),
               "pooler_forward", "pooler_backward"),
        OpSpec("cross_entropy_mean", lambda: S.cross_entropy_cases("mean"),
               ("loss.ce.mean", "loss.ce.backward.mean"),
               "cross_entropy_forward", "cross_entropy_backward"),
        OpSpec("cross_entropy_sum", lambda: S.cross_entropy_cases("sum"),
               ("loss.ce.sum", "loss.ce.backward.sum"),
               "cross_entropy_forward", "cross_entropy_backward"),
        OpSpec("mse", S.mse_cases, ("loss.mse", "loss.mse.backward"), "mse_forward",
               "mse_backward"),
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
