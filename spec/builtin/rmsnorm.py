"""RMSNorm, gamma * x / sqrt(mean(x^2) + eps): LLaMA's norm, no mean, no beta (its SymPy
derivation: spec/equations/rmsnorm.py; its reference pair: minibert_reference.ops.norms)."""

from __future__ import annotations

import numpy as np
from hypothesis import assume

from minibert_spec.builtin import Family, Identity, Mutant, OpDeclaration
from minibert_spec.tolerances import LN_MIN_VAR


def _draw(draw, k, gain: bool = True, eps: bool | float = True):
    """Rows whose mean square is >= LN_MIN_VAR (RMSNorm is smooth away from x = 0), eps from
    1e-12 to 1e-3, a gamma that varies across features.  ``gain`` False: gamma = None (the
    form without a gain); ``eps`` False: eps = 0; a number: that eps, the one the code fixes
    (minibert_spec.protocol.variants.eps_of)."""
    lead = draw(k._lead_shapes())
    N = draw(k.sizes(1, 6))
    x = draw(k.arrays(lead + (N,)))
    assume(np.min((x * x).mean(axis=-1)) >= LN_MIN_VAR)
    fixed = k.eps_of(eps, None)
    return k.OpCase({"x": x, "gamma": draw(k.gammas(N)) if gain else None},
                    {"eps": draw(k.layernorm_eps()) if fixed is None else fixed},
                    draw(k.upstream(lead + (N,))), draw(k._seed()))


def _example(rng, k, gain: bool = True, eps: bool | float = True):
    x = rng.standard_normal((2, 3, 6)) * 2 + 1
    return k.OpCase({"x": x, "gamma": k._gamma_beta(rng, 6)[0] if gain else None},
                    {"eps": k.eps_of(eps, 1e-6)}, k.upstream_like(rng, (2, 3, 6)))


def _backward_scale(case) -> float:
    """dx sums terms of |gamma dy| / rms (the LayerNorm rule, minibert_spec.tolerances.
    layernorm_backward_scale, without the mean): they cancel for N = 1, where x_hat = +-1.
    No gain: gamma = 1."""
    x = np.asarray(case.inputs["x"], np.float64)
    rms = float(np.sqrt((x * x).mean(axis=-1) + case.fixed["eps"]).min())
    gamma = case.inputs["gamma"]
    g = 1.0 if gamma is None else float(np.abs(gamma).max())
    return 2.0 * float(np.abs(case.dout).max()) * g / rms


# torch's rms_norm takes weight=None: the form without a gain
_RMS = dict(resolve=("rmsnorm.eps",), backward_scale=_backward_scale,
            f32_ok=lambda case: case.inputs["x"].shape[-1] >= 2)  # N = 1: dx is eps-sized


def _torch(to):
    return lambda x, gamma, eps: to.F.rms_norm(x, (x.shape[-1],), gamma, eps)


def _rmsnorm_scale_identities(impl, case, h, scale):
    """At eps = 0 RMSNorm(c x) = RMSNorm(x) for c > 0 (the rms scales with the row), so dx is
    orthogonal to x per row (the scale direction changes nothing).  Code that fixes its eps e
    (``rmsnorm.eps`` a number) is run at e, where both identities keep a term of e (with m the
    row's mean square): RMSNorm(c x) sqrt(c^2 m + e) / c = RMSNorm(x) sqrt(m + e) (both are
    gamma x), and dx . x = e / (m + e) sum(dy * y) (d/dc of RMSNorm(c x) at c = 1)."""
    x, gamma = case.inputs["x"], case.inputs["gamma"]
    e = h.pinned_eps(impl, "rmsnorm") or 0.0
    y, cache = impl.rmsnorm_forward(x, gamma, e)
    (dx, _) = impl.rmsnorm_backward(case.dout, cache)
    m = (x * x).mean(-1, keepdims=True)
    g = 1.0 if gamma is None else gamma  # no gain: gamma = 1
    # the terms dx sums are ~ gamma dy / rms (dx itself may be ~0 by cancellation: N = 1)
    terms = float(np.abs(g * case.dout).max() / np.sqrt(m).min())
    y_c = impl.rmsnorm_forward(scale * x, gamma, e)[0]
    h.require([h.close("rmsnorm", "invariant to c x per row",
                       y_c * np.sqrt(scale * scale * m + e) / scale, y * np.sqrt(m + e)),
               h.close("rmsnorm", "dx is orthogonal to x per row", (dx * x).sum(-1),
                       (e / (m + e))[..., 0] * (case.dout * y).sum(-1),
                       terms * float(np.abs(x).max()) * x.shape[-1])])


def rmsnorm_ignores_the_scale_of_a_row(impl, case, h, scale):
    """RMSNorm ignores the scale of a row (:func:`_rmsnorm_scale_identities`)."""
    _rmsnorm_scale_identities(impl, case, h, scale)


def rmsnorm_without_gain_ignores_the_scale_of_a_row(impl, case, h, scale):
    """The same identities without a gain (gamma = 1)."""
    _rmsnorm_scale_identities(impl, case, h, scale)


_SCALE = dict(equations=("rmsnorm.forward", "rmsnorm.backward.dx"),
              given=lambda k: {"scale": k.floats(0.25, 4.0)}, example={"scale": 1.7})

OP = OpDeclaration(
    "rmsnorm", after="layernorm", inputs=("x", "gamma"),
    equations=("rmsnorm.forward", "rmsnorm.backward.dx", "rmsnorm.backward.dgamma"),
    unguarded="eps inside the square root is its argument",
    doc="rmsnorm_forward(x [...,N], gamma [N], eps=1e-6) -> gamma * x / sqrt(mean(x^2) + eps) "
        "(LLaMA's norm: no mean, no beta)",
    families=(Family(_draw, _example, torch=_torch, options=dict(needs={"rmsnorm.gain": True},
                                                                 **_RMS)),
              # the gainless family checks dgamma too: that it comes back None
              Family(_draw, _example, "nogain", torch=_torch,
                     options=dict(needs={"rmsnorm.gain": False}, **_RMS))),
    identities=(Identity("scale_invariant", rmsnorm_ignores_the_scale_of_a_row, options=_SCALE),
                Identity("nogain_scale_invariant", rmsnorm_without_gain_ignores_the_scale_of_a_row,
                         family="rmsnorm_nogain", options=_SCALE)),
    mutants=(
        Mutant("rmsnorm_subtracts_the_mean", "rmsnorm.forward",
               "RMSNorm computed as LayerNorm without beta: the row mean subtracted before the rms",
               "ops._rmsnorm_forward",
               (("rstd = 1.0 / np.sqrt((x * x).mean(axis=-1, keepdims=True)",
                 "x = x - x.mean(axis=-1, keepdims=True)\n    "
                 "rstd = 1.0 / np.sqrt((x * x).mean(axis=-1, keepdims=True)"),)),
        Mutant("rmsnorm_eps_outside_sqrt", "rmsnorm.forward",
               "RMSNorm divides by sqrt(mean(x^2)) + eps instead of sqrt(mean(x^2) + eps)",
               "ops._rmsnorm_forward",
               (("np.sqrt((x * x).mean(axis=-1, keepdims=True) + x.dtype.type(eps))",
                 "(np.sqrt((x * x).mean(axis=-1, keepdims=True)) + x.dtype.type(eps))"),)),
        Mutant("rmsnorm_dx_missing_xhat_term", "rmsnorm.backward.dx",
               "RMSNorm dx drops the x_hat mean(g x_hat) term: the rms treated as a constant",
               "ops._rmsnorm_backward",
               (("dx = g - x_hat * (g * x_hat).mean(axis=-1, keepdims=True)", "dx = g.copy()"),)),
        Mutant("rmsnorm_dgamma_unnormalised", "rmsnorm.backward.dgamma",
               "RMSNorm dgamma sums dy * x instead of dy * x_hat",
               "ops._rmsnorm_backward",
               (("_sum_to_last(dy * x_hat)", "_sum_to_last(dy * x_hat / rstd)"),)),
    ),
    probe=dict(params=("gamma",), shapes={"x": (2, 3, 6), "gamma": (6,)}, sizes=(6,)),
    options={
        "gain": dict(values=(True, False), meaning={
            True: "with a gain gamma",
            False: "without a gain (microgpt: x / rms(x)): the suite passes gamma=None and "
                   "expects a None dgamma; compared with gamma = 1"}, pieces=("gamma",)),
        "eps": dict(values=(True, False), meaning={
            True: "with eps inside the square root",
            False: "without eps: the suite passes eps=0 (rows are kept away from 0)"},
            pieces=("eps",), absent=(None, 0), absent_ok=True, convert="fixed_eps",
            number="eps fixed at {value:g} by the declaration"),
    },
    # microgpt's x / rms(x): no gain
    variant_probe=dict(params=(), shapes={"x": (2, 3, 6)}, sizes=(6,),
                       declares={"rmsnorm": {"gain": False}}),
    aliases=("rmsnorm", "rms_norm"),
)
