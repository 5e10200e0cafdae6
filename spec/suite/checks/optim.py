"""The optimizer's own properties: AdamW's decoupled decay and no-decay default, Adam's purity
and bias-corrected first step, the warmup + linear-decay schedule's shape, global-norm clipping
(exact norm, one common factor, pass-through).  The PyTorch comparisons are in oracle_optim.py.
Fixed checks (no op pair, no case family), all in the quick run.
"""

from __future__ import annotations

import numpy as np

from minibert_spec.numerics import identities as inv
from minibert_spec.numerics.asserts import assert_close, assert_rel
from minibert_spec.numerics.identities import require
from minibert_spec.protocol import capabilities
from minibert_spec.protocol.capabilities import declared_guards
from minibert_spec.protocol.guards import clip_guard, clipped_norm, undeclared_clip_message
from minibert_spec.suite.registry import check
from minibert_spec.tolerances import ORACLE_RTOL_F64

# Model-like names: which of them AdamW must leave undecayed is written out here, not derived
# from the implementation's predicate.
SHAPES = {
    "embeddings.token.W": (7, 4),
    "embeddings.position.W": (5, 4),
    "layers.0.attn.W_q": (4, 4),
    "layers.0.attn.b_q": (4,),
    "layers.0.ln1.gamma": (4,),
    "layers.0.ln1.beta": (4,),
    "layers.0.ffn.W_1": (4, 6),
    "layers.0.ffn.b_1": (6,),
    "mlm.W": (4, 7),
    "mlm.b": (7,),
}
DECAYED = {"layers.0.attn.W_q", "layers.0.ffn.W_1", "mlm.W"}
K_STEPS = 6


def _params(seed=0):
    rng = np.random.default_rng(seed)
    return {k: rng.standard_normal(s) for k, s in SHAPES.items()}


def _grads(seed, scale=1.0):
    """Random mixed-sign gradients of varied magnitude (some tensors tiny, some large)."""
    rng = np.random.default_rng(1000 + seed)
    return {k: scale * rng.standard_normal(s) * 10.0 ** rng.integers(-3, 2)
            for k, s in SHAPES.items()}


# --------------------------------------------------------------------------- Adam / AdamW
@check("invariant", "adam.decoupled_decay", equations=("optim.adamw",), quick=True)
def weight_decay_spares_biases_layernorm_and_embeddings(impl):
    """With zero gradients the Adam part is exactly 0: decayed tensors shrink by (1 - lr wd),
    the exempt ones (biases, LayerNorm, embeddings: BERT's default) do not move at all; an
    explicit no_decay=() decays everything, an explicit set of names spares those."""
    params = _params(2)
    require(inv.adam_decoupled_decay(impl, params, DECAYED, lr=0.1, weight_decay=0.5))
    require(inv.adam_decoupled_decay(impl, params, set(params), lr=0.1, weight_decay=0.5,
                                     no_decay=()))
    require(inv.adam_decoupled_decay(impl, params, DECAYED, lr=1e-2, weight_decay=0.1,
                                     no_decay=tuple(sorted(set(params) - DECAYED))))


@check("invariant", "adam.pure", equations=("optim.adam",), quick=True)
def adam_step_is_pure(impl):
    """adam_step returns new params and state and mutates none of its arguments; the step
    counter goes 0 -> 1; dtypes are kept (float32 over two steps too)."""
    require(inv.adam_contract(impl, _params(5), _grads(2), lr=1e-2, beta1=0.9, beta2=0.999,
                              eps=1e-8, weight_decay=0.0, no_decay=()))
    params = _params(3)
    g = _grads(0)
    state = impl.adam_init(params)
    copies = [{k: v.copy() for k, v in d.items()} for d in (params, g, state["m"], state["v"])]
    new_p, new_s = impl.adam_step(params, g, state, lr=0.1, weight_decay=0.01)
    for what, before, after in zip(("params", "grads", "state['m']", "state['v']"), copies,
                                   (params, g, state["m"], state["v"])):
        for k in before:
            assert np.array_equal(before[k], after[k]), f"adam_step modified {what}[{k!r}]"
    assert state["step"] == 0, f"adam_step changed the input state's step to {state['step']}"
    assert new_s["step"] == 1, f"the first step's state has step {new_s['step']}, expected 1"
    shared = [k for k in params if new_p[k] is params[k]]
    assert not shared, f"adam_step returned the input arrays for {shared}"
    changed = [k for k in params if new_p[k].dtype != params[k].dtype]
    assert not changed, f"adam_step changed the dtype of {changed}"


@check("invariant", "adam.first_step", equations=("optim.adam",), quick=True)
def adam_first_step_moves_each_entry_by_lr(impl):
    """Bias correction: at t = 1, m_hat / sqrt(v_hat) = g / |g|, so every entry moves by lr
    (up to eps) against its gradient's sign, whatever the gradient's scale; with eps = 1e-8 and
    |g| log-uniform in [1e-4, 1] (mixed signs) the placement of eps shows too (it matters
    where |g| ~ sqrt(eps))."""
    require(inv.adam_first_step(impl, _params(4), _grads(1, scale=1e-3), lr=0.01, eps=1e-30))
    rng = np.random.default_rng(0)
    params = {"w": rng.standard_normal((3, 4)), "b": rng.standard_normal(4)}
    grads = {k: rng.choice([-1.0, 1.0], v.shape) * 10.0 ** rng.uniform(-4, 0, v.shape)
             for k, v in params.items()}
    require(inv.adam_first_step(impl, params, grads, lr=1e-2, beta2=0.999, eps=1e-8))


# --------------------------------------------------------------------------- schedule
@check("invariant", "schedule.shape", equations=("schedule.warmup_linear",), quick=True)
def schedule_first_step_nonzero_peak_and_end(impl):
    """Linear warmup from > 0 to the peak, then linear decay to ~0 (lr(0) = 0 a convention only
    when declared); without that convention exactly: lr(0) = peak / warmup, peak at the end of
    warmup, linear decay to 0 at total_steps, increasing then decreasing."""
    require(inv.schedule_shape(impl, peak=1e-3, warmup=10, total=50))
    if "lr(0)=0" in capabilities(impl)["conventions"]:
        return  # its exact values: oracle.forward[schedule-*] (Hugging Face's schedule)
    kw = dict(peak_lr=1e-3, warmup_steps=10, total_steps=50)
    for step, want in ((0, 1e-4), (9, 1e-3), (10, 1e-3), (49, 1e-3 / 40)):
        assert_rel(impl.warmup_linear_lr(step, **kw), want, 1e-12, f"lr({step})")
    assert impl.warmup_linear_lr(50, **kw) == 0.0, (
        f"lr(total_steps) = {impl.warmup_linear_lr(50, **kw)!r}, expected 0")
    lrs = [impl.warmup_linear_lr(s, **kw) for s in range(50)]
    assert all(lr > 0 for lr in lrs), f"a zero learning rate inside the run: {lrs}"
    assert np.all(np.diff(lrs[:10]) > 0), f"warmup is not increasing: {lrs[:10]}"
    assert np.all(np.diff(lrs[10:]) < 0), f"decay is not decreasing: {lrs[10:]}"
    no_warmup = impl.warmup_linear_lr(0, peak_lr=1e-3, warmup_steps=0, total_steps=4)
    assert no_warmup == 1e-3, f"lr(0) without warmup = {no_warmup!r}, expected the peak 1e-3"


# --------------------------------------------------------------------------- clipping
@check("invariant", "clip.exact_norm_and_passthrough", equations=("clip.global_norm",),
       quick=True)
def clip_exact_norm_and_passthrough(impl):
    """global_grad_norm is the 2-norm over every tensor; clipping scales every tensor by one
    factor to max_norm (to max_norm * norm / (norm + eps) under a declared divisor guard,
    spec/protocol/guards.py), leaving its input untouched and float32 float32; a norm below
    max_norm passes through as copies."""
    rng = np.random.default_rng(0)
    small = {"a": rng.standard_normal((3, 4)), "b": 10 * rng.standard_normal(5)}
    norm = np.sqrt(sum(float((v * v).sum()) for v in small.values()))
    require(inv.clip_global_norm(impl, small, norm / 4) + inv.clip_global_norm(impl, small,
                                                                               2 * norm))
    g = _grads(0)
    eps = clip_guard(declared_guards(impl))
    norm = impl.global_grad_norm(g)
    expected = np.sqrt(sum(float(np.sum(v * v)) for v in g.values()))
    assert_rel(norm, expected, ORACLE_RTOL_F64, "global_grad_norm")
    clipped, n = impl.clip_by_global_norm(g, norm / 4)
    assert_rel(n, norm, ORACLE_RTOL_F64, "the norm clip_by_global_norm returns")
    got = impl.global_grad_norm(clipped)
    want = clipped_norm(norm, norm / 4, eps)
    if not abs(got - want) <= ORACLE_RTOL_F64 * want:
        raise AssertionError(undeclared_clip_message(norm, norm / 4, got, eps)
                             if 0 < got < norm / 4 else
                             f"clipped norm {got!r}, expected {want!r} (max_norm {norm / 4!r}"
                             f"{f', declared guard {eps:g}' if eps else ''})")
    for k in g:  # one common scale: directions unchanged
        assert_close(clipped[k], g[k] * (want / norm), rtol=ORACLE_RTOL_F64,
                     what=f"clipped[{k!r}] (one common factor)")
    same, _ = impl.clip_by_global_norm(g, norm * 2)
    for k in g:
        assert np.array_equal(same[k], g[k]), f"clipping below max_norm changed {k!r}"
        assert same[k] is not g[k], f"clip_by_global_norm returned the input array {k!r}"


@check("invariant", "clip.model_sized_tensors", equations=("clip.global_norm",), quick=True)
def clip_model_sized_tensors(impl):
    """The global norm (both functions') on tensors of a real model's sizes: Mini-BERT's
    word embeddings [8192, 192] (1.57M entries), a tensor of an odd size beside it, a bias.
    Code that sums squares in chunks or blocks (to bound memory, or over threads) is reached
    past its first chunk only on such sizes: the small tensors of the other checks never
    leave it, and a stale or skipped last chunk passes them all."""
    rng = np.random.default_rng(7)
    g = {"word_embeddings": rng.standard_normal((8192, 192)),
         "odd": rng.standard_normal((1031, 67)), "bias": rng.standard_normal(192)}
    want = float(np.sqrt(sum(float(np.sum(v * v, dtype=np.float64)) for v in g.values())))
    assert_rel(impl.global_grad_norm(g), want, ORACLE_RTOL_F64,
               "global_grad_norm of model-sized tensors")
    # above the norm: the gradients pass through whatever divisor guard is declared (the
    # factor's formula is clip.exact_norm_and_passthrough's), so a red here is the sums alone
    same, norm = impl.clip_by_global_norm(g, 2 * want)
    assert_rel(norm, want, ORACLE_RTOL_F64, "the norm clip_by_global_norm returns (model-sized)")
    for k in g:
        assert np.array_equal(same[k], g[k]), (
            f"clip_by_global_norm below max_norm changed {k!r} (model-sized tensors)")
