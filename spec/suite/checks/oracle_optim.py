"""The optimizer against PyTorch, float64, k >= 5 steps on the same tensors: torch.optim.Adam /
AdamW (with parameter groups for the no-decay set), torch's LinearLR warmup+decay pair and
LambdaLR (Hugging Face's schedule under the declared lr(0)=0 convention), and
torch.nn.utils.clip_grad_norm_.  torch is imported inside each check (the ``oracle`` extra)."""

from __future__ import annotations

from minibert_spec.numerics.asserts import assert_close
from minibert_spec.protocol import capabilities
from minibert_spec.protocol.guards import adam_update_shift, clip_guard, declared_on
from minibert_spec.protocol.optim_contract import accepts
from minibert_spec.suite.checks.optim import DECAYED, K_STEPS, SHAPES, _grads, _params
from minibert_spec.suite.registry import check, grid
from minibert_spec.tolerances import ORACLE_RTOL_F64

# torch.nn.utils.clip_grad_norm_'s divisor guard: max_norm / (norm + 1e-6)
TORCH_CLIP_EPS = 1e-6

TORCH = ("torch",)


def _torch_params(params):
    import torch

    torch.set_num_threads(1)
    return {k: torch.nn.Parameter(torch.tensor(v, dtype=torch.float64)) for k, v in params.items()}


def _assert_each_close(ours, theirs, what):
    for k in theirs:
        assert k in ours, f"{what}: no entry {k!r}"
        assert_close(ours[k], theirs[k], rtol=ORACLE_RTOL_F64, what=f"{what}[{k!r}] vs torch")


def _to_np(tp):
    return {k: v.detach().numpy() for k, v in tp.items()}


def _shifted(theirs, shift):
    """torch's parameters moved by a declared guard's exact effect (``shift``; {}: none)."""
    return {k: v + shift[k] if k in shift else v for k, v in theirs.items()}


def _guard_shift(impl, shift, opt, tp, step, *, lr, betas=(0.9, 0.999), eps=1e-8,
                 decay=None):
    """The declared Adam guard's effect on the parameters after ``step`` (1-based), carried
    from the previous step's ``shift`` (ours - torch's): each update changes by
    spec/protocol/guards.adam_update_shift, computed from torch's own moments, and a decoupled
    decay (``decay``: name -> lr * wd) shrinks the difference as it shrinks the parameters.
    {} without a guard."""
    guards = declared_on("adam", capabilities(impl)["guards"])
    if not guards:
        return {}
    out = {}
    for k, p in tp.items():
        du = adam_update_shift(opt.state[p]["exp_avg"].numpy(), opt.state[p]["exp_avg_sq"].numpy(),
                               step, beta1=betas[0], beta2=betas[1], eps=eps, guards=guards)
        out[k] = shift.get(k, 0.0) * (1 - (decay or {}).get(k, 0.0)) - lr * du
    return out


def _groups(tp, weight_decay):
    return [{"params": [tp[k] for k in SHAPES if k in DECAYED], "weight_decay": weight_decay},
            {"params": [tp[k] for k in SHAPES if k not in DECAYED], "weight_decay": 0.0}]


# hand-written, not case families' oracles: the optimizer is a state machine over steps (state,
# parameter groups, schedules) compared with torch.optim, not an op pair with a backward
@check("oracle.forward", "adam", equations=("optim.adam",), requires=TORCH,
       cases=[("default", {"betas": (0.9, 0.999), "eps": 1e-8}),
              ("b0.8-eps1e-3", {"betas": (0.8, 0.95), "eps": 1e-3})])
def adam_matches_torch(impl, betas, eps):
    """Parameters, m and v after each of K steps equal torch.optim.Adam's."""
    import torch

    params = _params()
    tp = _torch_params(params)
    opt = torch.optim.Adam(tp.values(), lr=3e-2, betas=betas, eps=eps, foreach=False)
    state, shift = impl.adam_init(params), {}
    for step in range(K_STEPS):
        g = _grads(step)
        params, state = impl.adam_step(params, g, state, lr=3e-2, beta1=betas[0],
                                       beta2=betas[1], eps=eps)
        for k, p in tp.items():
            p.grad = torch.tensor(g[k])
        opt.step()
        shift = _guard_shift(impl, shift, opt, tp, step + 1, lr=3e-2, betas=betas, eps=eps)
        _assert_each_close(params, _shifted(_to_np(tp), shift), f"params after step {step}")
        for moment, torch_name in (("m", "exp_avg"), ("v", "exp_avg_sq")):
            _assert_each_close(state[moment], {k: opt.state[p][torch_name].numpy()
                                               for k, p in tp.items()},
                               f"state[{moment!r}] after step {step}")
    assert state["step"] == K_STEPS, f"state['step'] = {state['step']}, expected {K_STEPS}"


@check("oracle.forward", "adam.no_decay_groups", equations=("optim.adamw",), requires=TORCH)
def adamw_matches_torch_with_no_decay_groups(impl):
    """AdamW with BERT's default no-decay rule equals torch.optim.AdamW with two parameter
    groups (decayed weights; biases, LayerNorm and embeddings undecayed)."""
    import torch

    params = _params(1)
    tp = _torch_params(params)
    opt = torch.optim.AdamW(_groups(tp, 0.1), lr=5e-2, foreach=False)
    state, shift = impl.adam_init(params), {}
    decay = {k: 5e-2 * 0.1 for k in DECAYED}
    for step in range(K_STEPS):
        g = _grads(step)
        params, state = impl.adam_step(params, g, state, lr=5e-2, weight_decay=0.1)
        for k, p in tp.items():
            p.grad = torch.tensor(g[k])
        opt.step()
        shift = _guard_shift(impl, shift, opt, tp, step + 1, lr=5e-2, decay=decay)
        _assert_each_close(params, _shifted(_to_np(tp), shift), f"params after step {step}")


@check("oracle.forward", "schedule", equations=("schedule.warmup_linear",), requires=TORCH,
       cases=[(f"w{w}-t{t}", {"warmup": w, "total": t}) for w, t in ((4, 12), (1, 7), (5, 6))])
def schedule_matches_torch_linear_warmup_then_decay(impl, warmup, total):
    """torch's own schedulers: LinearLR from 1/warmup to 1 over warmup - 1 steps, then LinearLR
    from 1 to 0 over total - warmup steps.  The lr used by optimizer step s is compared.  Under
    the declared lr(0)=0 convention: Hugging Face's get_linear_schedule_with_warmup."""
    import torch
    from torch.optim.lr_scheduler import LinearLR, SequentialLR

    peak = 2e-3
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1, dtype=torch.float64))], lr=peak)
    if "lr(0)=0" in capabilities(impl)["conventions"]:
        import transformers

        sched = transformers.get_linear_schedule_with_warmup(opt, warmup, total)
        what = " (convention lr(0)=0)"
    else:
        warm = LinearLR(opt, start_factor=1 / warmup, end_factor=1.0,
                        total_iters=max(warmup - 1, 1))
        decay = LinearLR(opt, start_factor=1.0, end_factor=0.0, total_iters=total - warmup)
        sched, what = SequentialLR(opt, [warm, decay], milestones=[warmup]), ""
    for s in range(total):
        ours = impl.warmup_linear_lr(s, peak_lr=peak, warmup_steps=warmup, total_steps=total)
        assert_close(ours, opt.param_groups[0]["lr"], rtol=ORACLE_RTOL_F64,
                     what=f"lr at step {s}{what} vs torch")
        opt.step()
        sched.step()


def clip_call(impl):
    """How the oracle calls ``clip_by_global_norm`` and the guard torch then runs with:
    ``eps=1e-6`` (torch's own) when the signature takes it; else no ``eps`` and the declared
    ``clip_eps`` (default 0, the protocol's), with a convention line saying so."""
    if accepts(impl.clip_by_global_norm, "eps"):
        return {"eps": TORCH_CLIP_EPS}, TORCH_CLIP_EPS
    import warnings

    from minibert_spec.protocol.capabilities import ConventionWarning, declared_guards

    eps = clip_guard(declared_guards(impl))
    warnings.warn(ConventionWarning(
        f"clip_by_global_norm has no eps keyword: torch's clipping is run with its declared "
        f"guard norm + {eps:g} (CAPABILITIES['guards']['clip_eps']; torch's own is 1e-6)"),
        stacklevel=2)
    return {}, eps


def torch_clip(tensors, max_norm, eps):
    """torch.nn.utils.clip_grad_norm_ (its own 1e-6 guard), or the same two steps with another
    guard: get_total_norm, then every gradient times min(1, max_norm / (norm + eps))."""
    import torch

    if eps == TORCH_CLIP_EPS:
        return torch.nn.utils.clip_grad_norm_(tensors, max_norm)
    grads = [p.grad for p in tensors]
    norm = torch.nn.utils.get_total_norm(grads)
    coef = torch.clamp(max_norm / (norm + eps), max=1.0)
    torch._foreach_mul_(grads, coef)
    return norm


@check("oracle.forward", "clip", equations=("clip.global_norm",), requires=TORCH,
       cases=grid(max_norm=[0.5, 3.0, 1e6]))
def clip_matches_torch(impl, max_norm):
    """clip_by_global_norm(eps=1e-6) equals torch.nn.utils.clip_grad_norm_ (its 1e-6 guard),
    norm and clipped gradients, on five gradient sets; an implementation without the eps
    keyword is compared with torch run with its declared guard (spec/protocol/guards.py)."""
    import torch

    kw, eps = clip_call(impl)
    for seed in range(5):
        g = _grads(seed)
        tp = _torch_params(_params())
        for k, p in tp.items():
            p.grad = torch.tensor(g[k])
        norm_t = torch_clip(list(tp.values()), max_norm, eps)
        clipped, norm = impl.clip_by_global_norm(g, max_norm, **kw)
        assert_close(norm, float(norm_t), rtol=ORACLE_RTOL_F64,
                     what=f"global norm (gradient set {seed}) vs torch")
        _assert_each_close(clipped, {k: p.grad.numpy() for k, p in tp.items()},
                      f"clipped (gradient set {seed}, guard norm + {eps:g})")


PIPELINE = ("adam", "schedule", "clip")
# each op of the pipeline: the protocol names it is made of
_PIPELINE_NAMES = {"adam": ("adam_init", "adam_step"), "schedule": ("warmup_linear_lr",),
                   "clip": ("clip_by_global_norm",)}


def _pipeline(ns, convention: bool) -> None:
    """clip -> AdamW (no-decay groups) -> warmup + linear decay, step by step, ``ns``'s
    functions against torch: clip_grad_norm_, torch.optim.AdamW and a LambdaLR of the true
    schedule (the reference's, or Hugging Face's under the declared lr(0)=0 convention,
    ``convention``).  Raises AssertionError at the first step whose parameters differ."""
    import torch

    import minibert_reference

    peak, warmup, total = 0.05, 3, 8
    params = _params(5)
    tp = _torch_params(params)
    opt = torch.optim.AdamW(_groups(tp, 0.01), lr=peak, foreach=False)
    if convention:
        import transformers

        sched = transformers.get_linear_schedule_with_warmup(opt, warmup, total)
    else:
        sched = torch.optim.lr_scheduler.LambdaLR(
            opt, lambda s: minibert_reference.warmup_linear_lr(s, peak_lr=1.0, warmup_steps=warmup,
                                                      total_steps=total))
    state = ns.adam_init(params)
    kw, eps = clip_call(ns)
    for step in range(total):
        g = _grads(step, scale=3.0)
        clipped, _ = ns.clip_by_global_norm(g, 1.0, **kw)
        lr = ns.warmup_linear_lr(step, peak_lr=peak, warmup_steps=warmup, total_steps=total)
        # lr(0) = 0 only under the declared convention (the derivation's §8.1)
        assert lr > 0 or (step == 0 and convention), f"lr({step}) = {lr!r}, expected > 0"
        params, state = ns.adam_step(params, clipped, state, lr=lr, weight_decay=0.01)
        for k, p in tp.items():
            p.grad = torch.tensor(g[k])
        torch_clip(list(tp.values()), 1.0, eps)
        expected_lr = opt.param_groups[0]["lr"]
        opt.step()
        sched.step()
        _assert_each_close(params, _to_np(tp), f"params after step {step} (lr {lr!r}, "
                                               f"expected {expected_lr!r})")


class _Mixed:
    """The implementation's functions for the ops of ``own``, the reference's for the others
    (the suite's own proxy of the reference: the same conventions apply)."""

    def __init__(self, impl, own):
        import minibert_reference
        from minibert_spec.protocol import ImplProxy

        ref = ImplProxy(minibert_reference, "reference")
        self.CAPABILITIES = capabilities(impl)  # the implementation's guards for its clip
        for op, names in _PIPELINE_NAMES.items():
            for name in names:
                object.__setattr__(self, name, getattr(impl if op in own else ref, name))


@check("oracle.forward", "adam.pipeline", requires=TORCH,
       equations=("optim.adamw", "schedule.warmup_linear", "clip.global_norm"))
def clip_schedule_adamw_pipeline_matches_torch(impl):
    """clip_grad_norm_ -> AdamW (no-decay groups) -> LambdaLR, step by step, vs ours.  LambdaLR
    applies lambda(k) at optimizer step k (0-based): the same indexing as warmup_linear_lr.  A
    red blames the ops at fault: each op is run alone with the reference's other two (the
    pipeline of one's own op and the reference's others fails exactly when that op does); an
    op that passes alone is not credited with another's fault."""
    from minibert_spec.suite.registry import Blame

    convention = "lr(0)=0" in capabilities(impl)["conventions"]
    try:
        _pipeline(impl, convention)
        return
    except AssertionError as e:
        failure = e
    blamed, alone = [], {}
    for op in PIPELINE:
        try:
            _pipeline(_Mixed(impl, {op}), convention and op == "schedule")
        except AssertionError as e:
            blamed.append(op)
            alone[op] = str(e).splitlines()[0]
    if not blamed:  # no op fails alone: the fault is in how they combine
        raise Blame(PIPELINE, f"{failure} (each op passes alone with the reference's others: "
                              "the fault is in how they combine)")
    cleared = [op for op in PIPELINE if op not in blamed]
    raise Blame(tuple(blamed), "; ".join(f"{op} (with the reference's other ops): {alone[op]}"
                                         for op in blamed)
                + (f" -- {' and '.join(cleared)} pass with the reference's others: not at "
                   "fault" if cleared else ""))
