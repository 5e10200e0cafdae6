"""Optimizer maths: Adam / AdamW, the warmup + linear-decay schedule and global-norm clipping
(gradient accumulation lives beside the model, in ``minibert_reference.accumulation``).  NumPy only,
pure functions (new dicts out, inputs untouched).

Parameters, gradients and moments are flat ``dict[str, ndarray]`` with the model's dotted names.

Conventions (the Mini-BERT derivation §5, §7.3, §8 leaves these open or gets them wrong):

* Adam state: ``{"step": t, "m": {...}, "v": {...}}`` where ``t`` counts the updates already
  applied; the next update uses bias corrections ``1 - beta^(t+1)``.  eps is added to
  ``sqrt(v_hat)`` (§5.1, and torch.optim.Adam).
* AdamW (``weight_decay > 0``): decoupled decay ``theta -= lr * weight_decay * theta`` applied
  alongside the Adam step (Loshchilov & Hutter; torch.optim.AdamW), never added to the gradient.
  Excluded by default from biases, LayerNorm gamma/beta and the embedding tables.
* Schedule: the learning rate of 0-based step ``s`` is ``peak * (s + 1) / warmup`` during warmup,
  then ``peak * (total - s) / (total - warmup)``.  The derivation's §8.1 (like HuggingFace's
  ``get_linear_schedule_with_warmup``) uses ``peak * s / warmup`` and so gives lr = 0 at step 0:
  a wasted step that still feeds g_0 into the moments.  Our shift by one makes step 0 non-zero
  and reaches the peak at the last warmup step; the decay part is the derivation's.
* Clipping (§7.3): ``g *= max_norm / ||g||`` when ``||g|| > max_norm`` (``||g||`` over every
  tensor together).  torch's clip_grad_norm_ divides by ``||g|| + 1e-6`` instead; pass
  ``eps=1e-6`` to reproduce it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

import numpy as np

from minibert_reference import parallel
from minibert_reference.registry import implements
from minibert_reference.validate import check_all_finite

__all__ = [
    "adam_init",
    "adam_step",
    "adam_step_inplace",
    "adam_step_textbook",
    "default_no_decay",
    "warmup_linear_lr",
    "global_grad_norm",
    "clip_by_global_norm",
]

# Elements per chunk of the fused Adam update: the temporaries of one chunk (a few x 4-8 bytes
# x 64K) stay in L2, so each array is read/written from main memory once per step.  With
# several workers a chunk is larger: every NumPy call takes the GIL for its set-up, and fewer,
# longer calls contend less.  Measured on Mini-BERT's 4.5M float32 parameters, in place,
# alternating (ms): 1 worker 32K 13.3, 64K 13.5, 128K 14.4, 256K 15.7; 2 workers 32K 13.4,
# 64K 11.1, 128K 10.5, 256K 9.8.  Elementwise: the chunking never changes a result.  Both are
# read at call time (also by the gradient norm's ``_sum_squares``): tests shrink them to reach
# every chunk boundary with small arrays (tests/reference/test_chunk_boundaries.py).
_CHUNK = 1 << 16
_CHUNK_PARALLEL = 1 << 18


def default_no_decay(name: str) -> bool:
    """Parameters AdamW leaves undecayed: biases (``*.b``, ``*.b_q``, ``ffn.b_1``, ...), LayerNorm
    gamma/beta, and the embedding tables (BERT's convention: decay only the weight matrices)."""
    leaf = name.rsplit(".", 1)[-1]
    return (name.startswith("embeddings.") or leaf in ("gamma", "beta") or leaf == "b"
            or leaf.startswith("b_"))


def _no_decay_predicate(no_decay) -> Callable[[str], bool]:
    if callable(no_decay):
        return no_decay
    if isinstance(no_decay, str) or not isinstance(no_decay, Iterable):
        raise ValueError(f"no_decay: expected a predicate name -> bool or a collection of "
                         f"names, got {no_decay!r}")
    names = frozenset(no_decay)
    return names.__contains__


def _check_grads(params: Mapping, grads: Mapping, what: str = "grads", *,
                 finite: bool = True) -> None:
    """Same keys, shapes and dtypes as params (and finite values unless ``finite=False``): a
    missing gradient must never default to zero."""
    if not isinstance(params, Mapping) or not isinstance(grads, Mapping):
        raise ValueError(f"params, {what}: expected dicts of arrays, got "
                         f"{type(params).__name__}, {type(grads).__name__}")
    if set(params) != set(grads):
        raise ValueError(f"{what}: expected exactly the keys of params; missing "
                         f"{sorted(set(params) - set(grads))}, unexpected "
                         f"{sorted(set(grads) - set(params))}")
    for k, p in params.items():
        g = grads[k]
        if not isinstance(g, np.ndarray) or g.shape != p.shape or g.dtype != p.dtype:
            got = (f"shape {g.shape}, dtype {g.dtype}" if isinstance(g, np.ndarray)
                   else type(g).__name__)
            raise ValueError(f"{what}[{k!r}]: expected shape {p.shape}, dtype {p.dtype}, "
                             f"got {got}")
        _check_float_tensor(f"{what}[{k!r}]", g, finite=False)
    if finite:
        check_all_finite({f"{what}[{k!r}]": grads[k] for k in params})


_FLOAT_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


def _check_float_tensor(name: str, a, *, finite: bool = True) -> None:
    """float32/float64 and finite: a NaN or inf gradient must stop the caller, not spread into
    every parameter through the moments (or, clipped, into every gradient)."""
    if not isinstance(a, np.ndarray) or a.dtype not in _FLOAT_DTYPES:
        got = f"dtype {a.dtype}" if isinstance(a, np.ndarray) else type(a).__name__
        raise ValueError(f"{name}: expected a float32 or float64 ndarray, got {got}")
    if finite:
        check_all_finite({name: a})


def _check_hparam(name: str, value, *, low=None, high=None, low_open=False) -> float:
    try:
        x = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name}: expected a real number, got {value!r}") from None
    ok = np.isfinite(x)
    if low is not None:
        ok = ok and (x > low if low_open else x >= low)
    if high is not None:
        ok = ok and x < high
    if not ok:
        lo = "" if low is None else f"{'>' if low_open else '>='} {low}"
        hi = "" if high is None else f"< {high}"
        raise ValueError(f"{name}: expected a finite value {' and '.join(filter(None, (lo, hi)))}"
                         f", got {value!r}")
    return x


# --------------------------------------------------------------------------- Adam / AdamW
def adam_init(params: Mapping[str, np.ndarray]) -> dict:
    """Zero first and second moments (same names, shapes and dtypes as params), step 0."""
    if not isinstance(params, Mapping):
        raise ValueError(f"params: expected a dict of arrays, got {type(params).__name__}")
    for k, p in params.items():  # integer moments would truncate every update to 0
        _check_float_tensor(f"params[{k!r}]", p, finite=False)
    return {"step": 0,
            "m": {k: np.zeros_like(p) for k, p in params.items()},
            "v": {k: np.zeros_like(p) for k, p in params.items()}}


def _adam_tensor(p, g, m, v, *, b1, b2, step_size, inv_sqrt_bc2, eps, decay, out=None):
    """One tensor's update, fused in cache-sized chunks; returns new (p, m, v) arrays, or writes
    them into ``out`` = (p, m, v) arrays (the in-place fast path: no fresh 3 x |p| allocation,
    whose page faults cost as much as the arithmetic).

    m' = b1 m + (1 - b1) g;  v' = b2 v + (1 - b2) g^2
    p' = p (1 - decay) - step_size * m' / (sqrt(v') * inv_sqrt_bc2 + eps)
    with step_size = lr / (1 - b1^t), inv_sqrt_bc2 = 1 / sqrt(1 - b2^t), decay = lr * wd.
    Computed as p (1 - decay) - (step_size / inv_sqrt_bc2) * m' / (sqrt(v') + eps / inv_sqrt_bc2)
    (the same number up to rounding, two passes fewer), every pass in place in a chunk buffer.
    """
    dt = p.dtype.type
    b1, b2, c1, c2 = dt(b1), dt(b2), dt(1 - b1), dt(1 - b2)
    step = dt(step_size / inv_sqrt_bc2)
    eps_hat = dt(eps / inv_sqrt_bc2)
    keep = dt(1 - decay)
    P, G, M, Vv = (a.reshape(-1) for a in (p, g, m, v))
    if out is None:
        P2, M2, V2 = np.empty_like(P), np.empty_like(M), np.empty_like(Vv)
    else:  # every read of chunk s happens before its write: updating in place is safe
        P2, M2, V2 = (a.reshape(-1) for a in out)
    chunk = _CHUNK if parallel.get_workers() == 1 else _CHUNK_PARALLEL
    buf = np.empty(min(chunk, P.size), dtype=p.dtype)
    for lo in range(0, P.size, chunk):
        s = slice(lo, lo + chunk)
        gs, t = G[s], buf[: G[s].size]
        mo = np.multiply(M[s], b1, out=M2[s])
        mo += np.multiply(gs, c1, out=t)
        vo = np.multiply(Vv[s], b2, out=V2[s])
        np.multiply(gs, gs, out=t)
        t *= c2
        vo += t
        np.sqrt(vo, out=t)
        t += eps_hat
        np.divide(mo, t, out=t)
        t *= step
        po = P2[s]
        if decay:
            np.multiply(P[s], keep, out=po)
            po -= t
        else:
            np.subtract(P[s], t, out=po)
    return P2.reshape(p.shape), M2.reshape(m.shape), V2.reshape(v.shape)


def _check_out(params, out) -> tuple[dict, dict, dict]:
    """``out`` = (params_out, state_out): arrays to overwrite with the result -- shape, dtype
    and contiguity as the parameters', each either the very input array (in place) or sharing
    no memory with any input.  Returns (p, m, v) dicts of them."""
    if not (isinstance(out, tuple) and len(out) == 2 and isinstance(out[0], Mapping)
            and isinstance(out[1], Mapping) and {"m", "v"} <= set(out[1])):
        raise ValueError("out: expected (params, state) arrays from an earlier step, got "
                         f"{type(out).__name__}")
    p_out, m_out, v_out = out[0], out[1]["m"], out[1]["v"]
    for what, d in (("out params", p_out), ("out state['m']", m_out),
                    ("out state['v']", v_out)):
        _check_grads(params, d, what, finite=False)
        for k, a in d.items():
            if not a.flags.c_contiguous:  # reshape(-1) would copy: the update would be lost
                raise ValueError(f"{what}[{k!r}]: expected a C-contiguous array to write the "
                                 f"update into")
    return p_out, m_out, v_out


@implements("optim.adam", "optim.adamw")
def _adam(params, grads, state, *, lr, beta1, beta2, eps, weight_decay, no_decay, out=None):
    """The fused Adam / AdamW update behind ``adam_step`` (new arrays, or the arrays of ``out``)
    and ``adam_step_inplace`` (out = the inputs).  Written into given arrays, the parameters and
    moments -- the optimizer's own state -- are checked by shape and dtype only, not value by
    value; new arrays are made only from finite inputs."""
    _check_grads(params, grads)
    trusted = out is not None
    for k, p in params.items():
        _check_float_tensor(f"params[{k!r}]", p, finite=not trusted)
    if not isinstance(state, Mapping) or set(state) != {"step", "m", "v"}:
        raise ValueError("state: expected the dict adam_init returns (keys 'step', 'm', 'v'), "
                         f"got {sorted(state) if isinstance(state, Mapping) else state!r}")
    _check_grads(params, state["m"], "state['m']", finite=not trusted)
    _check_grads(params, state["v"], "state['v']", finite=not trusted)
    if not trusted:  # sqrt(v') of a negative v is NaN in every later step
        for k, v in state["v"].items():
            if v.min() < 0:
                i = tuple(int(j) for j in np.argwhere(v < 0)[0])
                raise ValueError(f"state['v'][{k!r}]: expected values >= 0 (a second moment), "
                                 f"got {v[i]} at index {i}")
    if trusted:
        p_out, m_out, v_out = _check_out(params, out)
        for k in params:  # an element read after another element's write: partial overlap
            for a, b in ((params[k], p_out[k]), (state["m"][k], m_out[k]),
                         (state["v"][k], v_out[k])):
                others = [x for x in (params[k], grads[k], state["m"][k], state["v"][k])
                          if x is not a]
                if any(np.may_share_memory(b, x) for x in others) or (
                        a is not b and np.may_share_memory(a, b)):
                    raise ValueError(f"out[{k!r}]: expected the input array itself or memory "
                                     f"shared with no input, got an overlapping array")
    step = state["step"]
    if not isinstance(step, (int, np.integer)) or isinstance(step, bool) or step < 0:
        raise ValueError(f"state['step']: expected an integer >= 0, got {step!r}")
    lr = _check_hparam("lr", lr, low=0.0)
    beta1 = _check_hparam("beta1", beta1, low=0.0, high=1.0)
    beta2 = _check_hparam("beta2", beta2, low=0.0, high=1.0)
    eps = _check_hparam("eps", eps, low=0.0, low_open=True)  # eps = 0: 0/0 where g = 0
    weight_decay = _check_hparam("weight_decay", weight_decay, low=0.0)
    exempt = _no_decay_predicate(no_decay)

    t = int(step) + 1
    bc1 = 1.0 - beta1 ** t
    bc2 = 1.0 - beta2 ** t
    step_size = lr / bc1
    inv_sqrt_bc2 = 1.0 / np.sqrt(bc2)
    def update(k):  # one tensor; the tensors are independent (split among the workers)
        wd = 0.0 if (weight_decay == 0.0 or exempt(k)) else weight_decay
        # decoupled (AdamW): the decay shrinks p directly and never enters the moments
        return _adam_tensor(params[k], grads[k], state["m"][k], state["v"][k], b1=beta1,
                            b2=beta2, step_size=step_size, inv_sqrt_bc2=inv_sqrt_bc2, eps=eps,
                            decay=lr * wd,
                            out=(p_out[k], m_out[k], v_out[k]) if trusted else None)

    new = parallel.map_keys(update, params)  # k -> (p, m, v)
    if trusted:  # the very arrays the caller handed in
        return p_out, {"step": t, "m": m_out, "v": v_out}
    return ({k: pmv[0] for k, pmv in new.items()},
            {"step": t, "m": {k: pmv[1] for k, pmv in new.items()},
             "v": {k: pmv[2] for k, pmv in new.items()}})


def adam_step(params, grads, state, *, lr: float = 1e-4, beta1: float = 0.9, beta2: float = 0.999,
              eps: float = 1e-8, weight_decay: float = 0.0,
              no_decay: Callable[[str], bool] | Iterable[str] = default_no_decay, out=None):
    """One Adam update (Mini-BERT derivation §5.1); AdamW when ``weight_decay > 0``.

    Returns ``(new_params, new_state)``; nothing passed in is modified.  Defaults: the
    derivation's betas and eps (its lr 1e-4 is the caller's ``lr``, usually from the schedule).
    ``no_decay``: names (or a predicate on names) exempt from weight decay.

    ``out``: ``(params, state)`` of an earlier step that the caller no longer needs; the result
    is written into their arrays and returned (double buffering: no fresh 3 x |params|
    allocation, and ``params``/``state`` stay intact until the caller swaps them, unlike
    ``adam_step_inplace``).
    """
    return _adam(params, grads, state, lr=lr, beta1=beta1, beta2=beta2, eps=eps,
                 weight_decay=weight_decay, no_decay=no_decay, out=out)


def adam_step_textbook(params, grads, state, *, lr: float = 1e-4, beta1: float = 0.9,
                       beta2: float = 0.999, eps: float = 1e-8, weight_decay: float = 0.0,
                       no_decay: Callable[[str], bool] | Iterable[str] = default_no_decay):
    """The readable Adam / AdamW of the Mini-BERT derivation §5.1, line by line, with no fusing
    or chunking: the specification the fast paths (``adam_step``, ``adam_step_inplace``) are
    held equal to by tests.  Same arguments and result as ``adam_step``."""
    exempt = _no_decay_predicate(no_decay)
    t = int(state["step"]) + 1
    new_p, new_m, new_v = {}, {}, {}
    for k, p in params.items():
        dt = p.dtype.type
        g = grads[k]
        m = dt(beta1) * state["m"][k] + dt(1 - beta1) * g  # first moment
        v = dt(beta2) * state["v"][k] + dt(1 - beta2) * g * g  # second moment
        m_hat = m / dt(1 - beta1 ** t)  # bias corrections
        v_hat = v / dt(1 - beta2 ** t)
        wd = 0.0 if (weight_decay == 0.0 or exempt(k)) else weight_decay
        decayed = p - dt(lr * wd) * p  # decoupled: never enters the moments
        new_p[k] = decayed - dt(lr) * m_hat / (np.sqrt(v_hat) + dt(eps))
        new_m[k], new_v[k] = m, v
    return new_p, {"step": t, "m": new_m, "v": new_v}


def adam_step_inplace(params, grads, state, *, lr: float = 1e-4, beta1: float = 0.9,
                      beta2: float = 0.999, eps: float = 1e-8, weight_decay: float = 0.0,
                      no_decay: Callable[[str], bool] | Iterable[str] = default_no_decay):
    """``adam_step`` that overwrites ``params`` and the moments of ``state`` in place (as
    torch.optim does) and returns the new state dict; the fast path for a caller that owns its
    parameters (no fresh 3 x |params| allocation).  The gradient is validated (shape, dtype,
    finite); the parameters and moments by shape, dtype and contiguity -- they are this
    optimizer's own state."""
    return _adam(params, grads, state, lr=lr, beta1=beta1, beta2=beta2, eps=eps,
                 weight_decay=weight_decay, no_decay=no_decay, out=(params, state))[1]


# --------------------------------------------------------------------------- schedule
@implements("schedule.warmup_linear")
def warmup_linear_lr(step: int, *, peak_lr: float, warmup_steps: int, total_steps: int) -> float:
    """Learning rate of 0-based optimizer step ``step``:

    step < warmup:  peak * (step + 1) / warmup        (never 0 at step 0; peak at warmup - 1)
    otherwise:      peak * (total - step) / (total - warmup), 0 from step = total on.
    """
    for name, value in (("step", step), ("warmup_steps", warmup_steps),
                        ("total_steps", total_steps)):
        if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 0:
            raise ValueError(f"{name}: expected an integer >= 0, got {value!r}")
    if not total_steps > warmup_steps:
        raise ValueError(f"total_steps: expected > warmup_steps={warmup_steps}, "
                         f"got {total_steps}")
    peak_lr = _check_hparam("peak_lr", peak_lr, low=0.0)
    if step < warmup_steps:
        return peak_lr * (step + 1) / warmup_steps
    return peak_lr * max(0, total_steps - step) / (total_steps - warmup_steps)


# --------------------------------------------------------------------------- clipping
def _sum_squares(g: np.ndarray) -> float:
    """sum(g^2) accumulated in float64, a cache-sized chunk at a time (no float64 copy of the
    whole tensor: 36 MB for Mini-BERT's gradients)."""
    flat = g.reshape(-1)
    buf = np.empty(min(_CHUNK, flat.size), dtype=np.float64)
    total = 0.0
    for lo in range(0, flat.size, _CHUNK):
        chunk = buf[: min(_CHUNK, flat.size - lo)]
        chunk[...] = flat[lo:lo + _CHUNK]  # exact: float32 -> float64
        total += float(chunk @ chunk)
    return total


@implements("clip.global_norm")
def global_grad_norm(grads: Mapping[str, np.ndarray]) -> float:
    """sqrt(sum over every tensor of sum(g^2)), accumulated in float64 (each tensor's sum, then
    the sums in the dict's order: the same number whatever the worker count)."""
    if not isinstance(grads, Mapping) or not grads:
        raise ValueError(f"grads: expected a non-empty dict of arrays, got {grads!r:.60}")
    for k, g in grads.items():
        # dtype only: the norm of a non-finite gradient is inf/NaN, which is the caller's signal
        _check_float_tensor(f"grads[{k!r}]", g, finite=False)
    total = 0.0
    for sum_sq in parallel.map_keys(lambda k: _sum_squares(grads[k]), grads).values():
        total += sum_sq
    return float(np.sqrt(total))


@implements("clip.global_norm")
def clip_by_global_norm(grads: Mapping[str, np.ndarray], max_norm: float, *, eps: float = 0.0):
    """Global-norm clipping (Mini-BERT derivation §7.3).  Returns ``(clipped, norm)`` where
    ``norm`` is the norm *before* clipping; tensors are scaled by ``max_norm / (norm + eps)``
    when that is < 1 and returned unchanged (new arrays) otherwise."""
    max_norm = _check_hparam("max_norm", max_norm, low=0.0, low_open=True)
    eps = _check_hparam("eps", eps, low=0.0)
    if isinstance(grads, Mapping):  # one inf would turn every clipped gradient into NaN
        for k, g in grads.items():
            _check_float_tensor(f"grads[{k!r}]", g, finite=False)
        check_all_finite({f"grads[{k!r}]": g for k, g in grads.items()})
    norm = global_grad_norm(grads)
    scale = max_norm / (norm + eps) if norm > 0 else 1.0
    if scale >= 1.0:
        return parallel.map_keys(lambda k: grads[k].copy(), grads), norm
    return parallel.map_keys(lambda k: grads[k] * grads[k].dtype.type(scale), grads), norm
