"""Optimizer maths against PyTorch (the oracle) and its own properties.

Oracles, float64, k >= 5 steps on the same tensors: torch.optim.Adam / AdamW (with parameter
groups for the no-decay set), torch's LinearLR warmup+decay pair and LambdaLR, and
torch.nn.utils.clip_grad_norm_.  The code under test is reached only through ``impl``.
"""

import warnings

import numpy as np
import pytest

from spec import invariants as I
from spec.invariants import require
from spec.protocol import capabilities
from spec.tolerances import CLIP_NORM_RTOL, ORACLE_RTOL_F64

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


def _torch_params(params):
    torch = pytest.importorskip("torch")
    torch.set_num_threads(1)
    return {k: torch.nn.Parameter(torch.tensor(v, dtype=torch.float64)) for k, v in params.items()}


def _assert_close(ours, theirs, what):
    for k in ours:
        np.testing.assert_allclose(ours[k], theirs[k], rtol=ORACLE_RTOL_F64, atol=0,
                                   err_msg=f"{what}[{k}]")


def _to_np(tp):
    return {k: v.detach().numpy() for k, v in tp.items()}


# --------------------------------------------------------------------------- Adam / AdamW
@pytest.mark.oracle
@pytest.mark.equation("optim.adam")
@pytest.mark.parametrize("betas,eps", [((0.9, 0.999), 1e-8), ((0.8, 0.95), 1e-3)])
def test_adam_matches_torch(impl, betas, eps):
    torch = pytest.importorskip("torch")
    params = _params()
    tp = _torch_params(params)
    opt = torch.optim.Adam(tp.values(), lr=3e-2, betas=betas, eps=eps, foreach=False)
    state = impl.adam_init(params)
    for step in range(K_STEPS):
        g = _grads(step)
        params, state = impl.adam_step(params, g, state, lr=3e-2, beta1=betas[0],
                                       beta2=betas[1], eps=eps)
        for k, p in tp.items():
            p.grad = torch.tensor(g[k])
        opt.step()
        _assert_close(params, _to_np(tp), f"params after step {step}")
        _assert_close(state["m"], {k: opt.state[p]["exp_avg"].numpy() for k, p in tp.items()},
                      "m")
        _assert_close(state["v"], {k: opt.state[p]["exp_avg_sq"].numpy() for k, p in tp.items()},
                      "v")
    assert state["step"] == K_STEPS


@pytest.mark.oracle
@pytest.mark.equation("optim.adamw")
def test_adamw_matches_torch_with_no_decay_groups(impl):
    torch = pytest.importorskip("torch")
    params = _params(1)
    tp = _torch_params(params)
    groups = [{"params": [tp[k] for k in SHAPES if k in DECAYED], "weight_decay": 0.1},
              {"params": [tp[k] for k in SHAPES if k not in DECAYED], "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=5e-2, foreach=False)
    state = impl.adam_init(params)
    for step in range(K_STEPS):
        g = _grads(step)
        params, state = impl.adam_step(params, g, state, lr=5e-2, weight_decay=0.1)
        for k, p in tp.items():
            p.grad = torch.tensor(g[k])
        opt.step()
        _assert_close(params, _to_np(tp), f"params after step {step}")


@pytest.mark.equation("optim.adamw")
def test_weight_decay_spares_biases_layernorm_and_embeddings(impl):
    """With zero gradients the Adam part is exactly 0: decayed tensors shrink by (1 - lr wd),
    the exempt ones do not move at all."""
    params = _params(2)
    require(I.adam_decoupled_decay(impl, params, DECAYED, lr=0.1, weight_decay=0.5))
    # an explicit no_decay list overrides the default: decay everything
    require(I.adam_decoupled_decay(impl, params, set(params), lr=0.1, weight_decay=0.5,
                                   no_decay=()))


@pytest.mark.equation("optim.adam")
def test_adam_step_is_pure(impl):
    params = _params(3)
    g = _grads(0)
    state = impl.adam_init(params)
    copies = [{k: v.copy() for k, v in d.items()} for d in (params, g, state["m"], state["v"])]
    new_p, new_s = impl.adam_step(params, g, state, lr=0.1, weight_decay=0.01)
    for before, after in zip(copies, (params, g, state["m"], state["v"])):
        for k in before:
            assert np.array_equal(before[k], after[k])
    assert state["step"] == 0 and new_s["step"] == 1
    assert all(new_p[k] is not params[k] for k in params)
    assert all(new_p[k].dtype == params[k].dtype for k in params)


@pytest.mark.equation("optim.adam")
def test_adam_first_step_moves_each_entry_by_lr(impl):
    """Bias correction: at t = 1, m_hat / sqrt(v_hat) = g / |g|, so every entry moves by lr
    (up to eps) against its gradient's sign, whatever the gradient's scale."""
    require(I.adam_first_step(impl, _params(4), _grads(1, scale=1e-3), lr=0.01, eps=1e-30))


@pytest.mark.bad_input
def test_adam_rejects_mismatched_grads(impl):
    params = _params()
    g = _grads(0)
    del g["mlm.b"]
    with pytest.raises(ValueError, match="grads.*missing.*mlm.b"):
        impl.adam_step(params, g, impl.adam_init(params), lr=0.1)
    g = _grads(0)
    g["mlm.b"] = g["mlm.b"].astype(np.float32)
    with pytest.raises(ValueError, match=r"grads\['mlm.b'\].*dtype"):
        impl.adam_step(params, g, impl.adam_init(params), lr=0.1)
    with pytest.raises(ValueError, match="lr"):
        impl.adam_step(params, _grads(0), impl.adam_init(params), lr=-1.0)


# --------------------------------------------------------------------------- schedule
@pytest.mark.oracle
@pytest.mark.equation("schedule.warmup_linear")
@pytest.mark.parametrize("warmup,total", [(4, 12), (1, 7), (5, 6)])
def test_schedule_matches_torch_linear_warmup_then_decay(impl, warmup, total):
    """torch's own schedulers: LinearLR from 1/warmup to 1 over warmup - 1 steps, then LinearLR
    from 1 to 0 over total - warmup steps.  The lr used by optimizer step s is compared."""
    torch = pytest.importorskip("torch")
    from torch.optim.lr_scheduler import LinearLR, SequentialLR

    peak = 2e-3
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1, dtype=torch.float64))], lr=peak)
    if "lr(0)=0" in capabilities(impl)["conventions"]:
        # the declared convention (the derivation's §8.1): Hugging Face's own schedule
        transformers = pytest.importorskip("transformers")
        sched, what = transformers.get_linear_schedule_with_warmup(opt, warmup, total), \
            " (convention lr(0)=0)"
    else:
        warm = LinearLR(opt, start_factor=1 / warmup, end_factor=1.0,
                        total_iters=max(warmup - 1, 1))
        decay = LinearLR(opt, start_factor=1.0, end_factor=0.0, total_iters=total - warmup)
        sched, what = SequentialLR(opt, [warm, decay], milestones=[warmup]), ""
    for s in range(total):
        ours = impl.warmup_linear_lr(s, peak_lr=peak, warmup_steps=warmup, total_steps=total)
        np.testing.assert_allclose(ours, opt.param_groups[0]["lr"], rtol=ORACLE_RTOL_F64,
                                   atol=0, err_msg=f"step {s}{what}")
        opt.step()
        sched.step()


@pytest.mark.equation("schedule.warmup_linear")
def test_schedule_first_step_nonzero_peak_and_end(impl):
    if "lr(0)=0" in capabilities(impl)["conventions"]:
        pytest.skip("convention lr(0)=0 declared: its schedule is compared with Hugging Face's "
                    "get_linear_schedule_with_warmup in test_schedule_matches_torch_...")
    kw = dict(peak_lr=1e-3, warmup_steps=10, total_steps=50)
    assert impl.warmup_linear_lr(0, **kw) == pytest.approx(1e-4)  # never 0 at the first step
    assert impl.warmup_linear_lr(9, **kw) == pytest.approx(1e-3)
    assert impl.warmup_linear_lr(10, **kw) == pytest.approx(1e-3)
    assert impl.warmup_linear_lr(49, **kw) == pytest.approx(1e-3 / 40)
    assert impl.warmup_linear_lr(50, **kw) == 0.0
    lrs = [impl.warmup_linear_lr(s, **kw) for s in range(50)]
    assert all(lr > 0 for lr in lrs)
    assert np.all(np.diff(lrs[:10]) > 0) and np.all(np.diff(lrs[10:]) < 0)
    assert impl.warmup_linear_lr(0, peak_lr=1e-3, warmup_steps=0, total_steps=4) == 1e-3
    with pytest.raises(ValueError, match="total_steps"):
        impl.warmup_linear_lr(0, peak_lr=1e-3, warmup_steps=5, total_steps=5)


# --------------------------------------------------------------------------- clipping
@pytest.mark.oracle
@pytest.mark.equation("clip.global_norm")
@pytest.mark.parametrize("max_norm", [0.5, 3.0, 1e6])
def test_clip_matches_torch(impl, max_norm):
    torch = pytest.importorskip("torch")
    torch.set_num_threads(1)
    for seed in range(5):
        g = _grads(seed)
        tp = _torch_params(_params())
        for k, p in tp.items():
            p.grad = torch.tensor(g[k])
        norm_t = torch.nn.utils.clip_grad_norm_(list(tp.values()), max_norm)
        clipped, norm = impl.clip_by_global_norm(g, max_norm, eps=1e-6)  # torch's 1e-6
        np.testing.assert_allclose(norm, float(norm_t), rtol=ORACLE_RTOL_F64)
        _assert_close(clipped, {k: p.grad.numpy() for k, p in tp.items()}, "clipped")


@pytest.mark.equation("clip.global_norm")
def test_clip_exact_norm_and_passthrough(impl):
    g = _grads(0)
    norm = impl.global_grad_norm(g)
    expected = np.sqrt(sum(float(np.sum(v * v)) for v in g.values()))
    assert norm == pytest.approx(expected, rel=ORACLE_RTOL_F64)
    clipped, n = impl.clip_by_global_norm(g, norm / 4)
    assert n == pytest.approx(norm, rel=ORACLE_RTOL_F64)
    shrink = impl.global_grad_norm(clipped) / (norm / 4) - 1
    if abs(shrink) > ORACLE_RTOL_F64:
        # a divisor guard (torch divides by norm + 1e-6) is a convention, reported with the
        # number it changes; anything beyond CLIP_NORM_RTOL is a wrong clip
        assert abs(shrink) <= CLIP_NORM_RTOL, f"clipped norm / max_norm - 1 = {shrink:.2e}"
        warnings.warn(f"convention: clipping with a divisor guard changes the clipped norm by "
                      f"{shrink:.1e} relative", stacklevel=1)
    for k in g:  # one common scale: directions unchanged
        np.testing.assert_allclose(clipped[k], g[k] * (1 + shrink) / 4, rtol=ORACLE_RTOL_F64)
    same, _ = impl.clip_by_global_norm(g, norm * 2)
    assert all(np.array_equal(same[k], g[k]) and same[k] is not g[k] for k in g)


@pytest.mark.bad_input
def test_clip_rejects_a_zero_max_norm(impl):
    with pytest.raises(ValueError, match="max_norm"):
        impl.clip_by_global_norm(_grads(0), 0.0)


# --------------------------------------------------------------------------- the full pipeline
@pytest.mark.oracle
@pytest.mark.equation("optim.adamw", "schedule.warmup_linear", "clip.global_norm")
def test_clip_schedule_adamw_pipeline_matches_torch(impl):
    """clip_grad_norm_ -> AdamW (no-decay groups) -> LambdaLR, step by step, vs ours.  LambdaLR
    applies lambda(k) at optimizer step k (0-based): the same indexing as warmup_linear_lr."""
    torch = pytest.importorskip("torch")
    peak, warmup, total = 0.05, 3, 8
    params = _params(5)
    tp = _torch_params(params)
    groups = [{"params": [tp[k] for k in SHAPES if k in DECAYED], "weight_decay": 0.01},
              {"params": [tp[k] for k in SHAPES if k not in DECAYED], "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=peak, foreach=False)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: impl.warmup_linear_lr(s, peak_lr=1.0, warmup_steps=warmup,
                                             total_steps=total))
    state = impl.adam_init(params)
    for step in range(total):
        g = _grads(step, scale=3.0)
        clipped, _ = impl.clip_by_global_norm(g, 1.0, eps=1e-6)
        lr = impl.warmup_linear_lr(step, peak_lr=peak, warmup_steps=warmup, total_steps=total)
        # lr(0) = 0 only under the declared convention (the derivation's §8.1)
        assert lr > 0 or (step == 0 and "lr(0)=0" in capabilities(impl)["conventions"])
        params, state = impl.adam_step(params, clipped, state, lr=lr, weight_decay=0.01)
        for k, p in tp.items():
            p.grad = torch.tensor(g[k])
        torch.nn.utils.clip_grad_norm_(list(tp.values()), 1.0)
        opt.step()
        sched.step()
        _assert_close(params, _to_np(tp), f"params after step {step}")
