"""A catalog of realistic backpropagation and optimizer bugs, applied to the reference in memory.

Each mutant names the equation it breaks (an ID the reference's ``@implements`` tags carry, or one
of the fixed optimizer IDs), says in one line what is wrong, and builds the mutated function(s)
from the original(s).  :func:`applied` swaps them into ``reference.ops`` / ``reference.model`` /
``reference.optim`` *and* every other ``reference*`` module namespace that holds the same function
object (the ``reference`` package re-exports the ops), so op-level tests and model-level tests
both see the bug; leaving the context restores the very same objects.  Nothing on disk changes.

A mutant whose target does not exist (``reference.optim`` before the optimizer lands) or whose
probe cannot read the target's conventions is *not applicable*, never counted as killed.
The mutated functions rely on the reference's cache layouts: they are mutants of the reference,
not of arbitrary implementations.  Each one still runs the original's input validation (most call
the original first), so a bad-input test cannot "kill" a mutant for a reason unrelated to its bug.
"""

from __future__ import annotations

import copy
import importlib
import inspect
import sys
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np

MODULES = {"ops": "reference.ops", "model": "reference.model", "optim": "reference.optim"}
OPTIMIZER_EQUATIONS = ("optim.adam", "optim.adamw", "schedule.warmup_linear",
                       "clip.global_norm", "accum.grad_mean")


class NotApplicable(Exception):
    """The mutant's target is missing or does not follow the conventions the mutant needs."""


@dataclass(frozen=True)
class Mutant:
    name: str
    equation: str
    description: str
    targets: tuple[str, ...]  # "ops.layernorm_backward": module alias . function
    factory: Callable  # (*originals) -> replacement, or a tuple of replacements
    fast: bool = False  # part of ``minibert mutate --fast``
    probe: Callable | None = None  # (modules) -> None; raises NotApplicable


CATALOG: dict[str, Mutant] = {}


def mutant(name: str, equation: str, description: str, *targets: str, fast: bool = False,
           probe: Callable | None = None):
    """Register the decorated factory as a mutant of ``targets``."""

    def register(factory):
        if name in CATALOG:
            raise ValueError(f"name: mutant {name!r} is already in the catalog")
        CATALOG[name] = Mutant(name, equation, description, targets, factory, fast, probe)
        return factory

    return register


# --------------------------------------------------------------------------- application
def _modules(overrides=None) -> dict:
    """Alias -> module; an alias whose module cannot be imported maps to None."""
    out = {}
    for alias, modname in MODULES.items():
        if overrides and alias in overrides:
            out[alias] = overrides[alias]
            continue
        try:
            out[alias] = importlib.import_module(modname)
        except ModuleNotFoundError as e:
            if e.name != modname:  # the module exists but is broken: not ours to hide
                raise
            out[alias] = None
    return out


def _originals(m: Mutant, mods: dict) -> list:
    originals = []
    for target in m.targets:
        alias, fn = target.split(".", 1)
        module = mods.get(alias)
        if module is None:
            raise NotApplicable(f"{MODULES[alias]} does not exist yet")
        if not hasattr(module, fn):
            raise NotApplicable(f"{MODULES[alias]} has no {fn}")
        originals.append(getattr(module, fn))
    return originals


def applicability(m: Mutant, modules=None) -> str | None:
    """None when the mutant applies, else the reason it does not."""
    mods = _modules(modules)
    try:
        _originals(m, mods)
        if m.probe is not None:
            m.probe(mods)
    except NotApplicable as e:
        return str(e)
    return None


def _namespaces(mods: dict) -> list:
    """Every loaded module of the reference package, plus the (possibly overridden) targets."""
    seen, out = set(), []
    candidates = [mod for name, mod in list(sys.modules.items())
                  if mod is not None and (name == "reference" or name.startswith("reference."))]
    for mod in candidates + [m for m in mods.values() if m is not None]:
        if id(mod) not in seen:
            seen.add(id(mod))
            out.append(mod)
    return out


def activate(m: Mutant, modules=None) -> list[tuple]:
    """Swap the mutated functions in; returns the patches to hand to :func:`deactivate`."""
    mods = _modules(modules)
    originals = _originals(m, mods)
    if m.probe is not None:
        m.probe(mods)
    replacements = m.factory(*originals)
    if not isinstance(replacements, tuple):
        replacements = (replacements,)
    patches = []
    for orig, new in zip(originals, replacements, strict=True):
        for attr in ("__name__", "__qualname__", "__doc__", "__module__", "__equations__"):
            if hasattr(orig, attr):
                setattr(new, attr, getattr(orig, attr))
        new.__mutant__ = m.name
        for ns in _namespaces(mods):
            for attr, value in list(vars(ns).items()):
                if value is orig:
                    patches.append((ns, attr, orig))
                    setattr(ns, attr, new)
    return patches


def deactivate(patches: list[tuple]) -> None:
    for ns, attr, orig in reversed(patches):
        setattr(ns, attr, orig)


@contextmanager
def applied(m: Mutant | str, modules=None):
    """``with applied("layernorm_gamma_outside_means"): ...`` runs the body against the mutant."""
    m = CATALOG[m] if isinstance(m, str) else m
    patches = activate(m, modules)
    try:
        yield m
    finally:
        deactivate(patches)


def ops():
    return importlib.import_module("reference.ops")


# ===================================================================== linear
@mutant("linear_dx_no_transpose", "linear.backward.dx",
        "dx = dy @ W instead of dy @ W^T (wrong for square W, a crash otherwise)",
        "ops.linear_backward")
def _linear_dx(orig):
    def linear_backward(dy, cache):
        dx, dW, db = orig(dy, cache)
        x, W, _ = cache
        return dy @ W, dW, db  # missing .T

    return linear_backward


@mutant("linear_dW_torch_layout", "linear.backward.dW",
        "dW = dy^T x (PyTorch's [out, in] layout) for a W stored as [in, out]",
        "ops.linear_backward")
def _linear_dW(orig):
    def linear_backward(dy, cache):
        dx, _, db = orig(dy, cache)
        x, W, _ = cache
        return dx, dy.reshape(-1, W.shape[1]).T @ x.reshape(-1, W.shape[0]), db

    return linear_backward


@mutant("linear_db_mean", "linear.backward.db",
        "db averages dy over the rows instead of summing (an extra 1/N)", "ops.linear_backward")
def _linear_db_mean(orig):
    def linear_backward(dy, cache):
        dx, dW, db = orig(dy, cache)
        if db is not None:
            db = dy.reshape(-1, dy.shape[-1]).mean(axis=0)
        return dx, dW, db

    return linear_backward


@mutant("linear_db_wrong_axis", "linear.backward.db",
        "db = dy.sum(axis=0): sums the batch axis only, not every leading axis",
        "ops.linear_backward")
def _linear_db_axis(orig):
    def linear_backward(dy, cache):
        dx, dW, db = orig(dy, cache)
        return dx, dW, (dy.sum(axis=0) if db is not None else None)

    return linear_backward


# ===================================================================== layernorm
def _ln_backward(orig, bug: str):
    def layernorm_backward(dy, cache):
        orig(dy, cache)  # the original's validation
        x_hat, rstd, gamma = cache
        g = dy * gamma
        if bug == "mean":  # forgot the -mean(g) term
            dx = rstd * (g - x_hat * (g * x_hat).mean(-1, keepdims=True))
        elif bug == "xhat":  # forgot the -x_hat * mean(g x_hat) term
            dx = rstd * (g - g.mean(-1, keepdims=True))
        elif bug == "gamma":  # gamma pulled outside the feature means
            dx = rstd * gamma * (dy - dy.mean(-1, keepdims=True)
                                 - x_hat * (dy * x_hat).mean(-1, keepdims=True))
        else:
            dx = rstd * (g - g.mean(-1, keepdims=True)
                         - x_hat * (g * x_hat).mean(-1, keepdims=True))
        x_for_dgamma = x_hat / rstd if bug == "dgamma" else x_hat  # centred, not normalised
        dgamma = (dy * x_for_dgamma).reshape(-1, dy.shape[-1]).sum(0)
        dbeta = dy.reshape(-1, dy.shape[-1]).sum(0)
        return dx, dgamma, dbeta

    return layernorm_backward


@mutant("layernorm_missing_mean_term", "layernorm.backward.dx",
        "LayerNorm dx drops the -mean(dy*gamma) term", "ops.layernorm_backward")
def _ln1(orig):
    return _ln_backward(orig, "mean")


@mutant("layernorm_missing_xhat_term", "layernorm.backward.dx",
        "LayerNorm dx drops the -x_hat * mean(dy*gamma*x_hat) term (the variance path)",
        "ops.layernorm_backward")
def _ln2(orig):
    return _ln_backward(orig, "xhat")


@mutant("layernorm_gamma_outside_means", "layernorm.backward.dx",
        "gamma multiplies outside the feature means (right only when gamma is constant)",
        "ops.layernorm_backward", fast=True)
def _ln3(orig):
    return _ln_backward(orig, "gamma")


@mutant("layernorm_dgamma_uses_centred_x", "layernorm.backward.dgamma",
        "dgamma = sum(dy * (x - mu)) instead of sum(dy * x_hat)", "ops.layernorm_backward")
def _ln4(orig):
    return _ln_backward(orig, "dgamma")


@mutant("layernorm_unbiased_variance", "layernorm.forward",
        "forward uses the unbiased 1/(N-1) variance; backward still assumes 1/N",
        "ops.layernorm_forward")
def _ln5(orig):
    def layernorm_forward(x, gamma, beta, eps: float = 1e-12):
        orig(x, gamma, beta, eps)  # same validation as the original
        mu = x.mean(axis=-1, keepdims=True)
        var = ((x - mu) ** 2).sum(axis=-1, keepdims=True) / (x.shape[-1] - 1)
        rstd = 1.0 / np.sqrt(var + x.dtype.type(eps))
        x_hat = (x - mu) * rstd
        return gamma * x_hat + beta, (x_hat, rstd, gamma)

    return layernorm_forward


# ===================================================================== softmax
@mutant("softmax_jvp_no_subtraction", "softmax.backward",
        "softmax backward dx = p * dp, without subtracting sum(p * dp)", "ops.softmax_backward",
        fast=True)
def _sm1(orig):
    def softmax_backward(dp, cache):
        orig(dp, cache)  # validation
        return (cache * dp,)

    return softmax_backward


@mutant("softmax_jvp_sum_wrong_axis", "softmax.backward",
        "softmax backward sums p * dp over axis -2 instead of the softmax axis",
        "ops.softmax_backward")
def _sm2(orig):
    def softmax_backward(dp, cache):
        orig(dp, cache)  # validation
        p = cache
        return (p * (dp - (p * dp).sum(axis=-2, keepdims=True)),)

    return softmax_backward


@mutant("softmax_no_max_subtraction", "softmax.forward",
        "softmax exponentiates raw logits (no max shift): overflows to NaN for large inputs",
        "ops.softmax_forward")
def _sm3(orig):
    def softmax_forward(x, mask=None):
        orig(x, mask)  # validation
        if mask is not None:
            x = np.where(np.asarray(mask, dtype=bool), x, -np.inf)
        with np.errstate(over="ignore", invalid="ignore"):
            e = np.exp(x)
            p = e / e.sum(axis=-1, keepdims=True)
        return p, p

    return softmax_forward


# ===================================================================== relu / tanh
@mutant("relu_backward_mask_from_output", "relu.backward",
        "ReLU backward masks with (output >= 0), which is always true",
        "ops.relu_forward", "ops.relu_backward")
def _relu(orig_fwd, orig_bwd):
    def relu_forward(x):
        y, _ = orig_fwd(x)
        return y, y  # caches the output instead of the x > 0 mask

    def relu_backward(dy, cache):
        return orig_bwd(dy, cache >= 0)  # the original, fed the always-true mask

    return relu_forward, relu_backward


@mutant("tanh_backward_missing_square", "tanh.backward",
        "tanh backward uses 1 - y instead of 1 - y^2", "ops.tanh_backward")
def _tanh(orig):
    def tanh_backward(dy, cache):
        orig(dy, cache)  # validation
        return (dy * (1 - cache),)

    return tanh_backward


# ===================================================================== attention
def _attention_backward(bug: str):
    def attention_backward(dy, cache):
        o = ops()
        n_heads, scale, q_h, k_h, v_h, p, q_cache, k_cache, v_cache, o_cache = cache
        dctx, dW_o, db_o = o.linear_backward(dy, o_cache)
        dctx_h = o.split_heads(dctx, n_heads)  # [B, A, T, d_k]
        dv_h = (p if bug == "dv_transpose" else p.transpose(0, 1, 3, 2)) @ dctx_h
        dp = dctx_h @ v_h.transpose(0, 1, 3, 2)
        (ds,) = o.softmax_backward(dp, p)
        ds_q = ds if bug == "dq_scale" else ds * scale
        ds_k = ds if bug == "dk_scale" else ds * scale
        dq_h = ds_q @ k_h
        dk_h = (ds_k if bug == "dk_transpose" else ds_k.transpose(0, 1, 3, 2)) @ q_h

        def merge(t):
            if bug == "merge_reshape":  # [B, A, T, d_k] -> [B, T, H] without the transpose
                return t.reshape(t.shape[0], t.shape[2], -1)
            return o.merge_heads(t)

        dx_q, dW_q, db_q = o.linear_backward(merge(dq_h), q_cache)
        dx_k, dW_k, db_k = o.linear_backward(merge(dk_h), k_cache)
        dx_v, dW_v, db_v = o.linear_backward(merge(dv_h), v_cache)
        dx = dx_q + dx_k if bug == "drop_v" else dx_q + dx_k + dx_v
        return dx, dW_q, dW_k, dW_v, dW_o, db_q, db_k, db_v, db_o

    return attention_backward


@mutant("attention_dQ_missing_scale", "attention.backward.dQ",
        "dQ = dS K without the 1/sqrt(d_k) factor", "ops.attention_backward")
def _att1(orig):
    return _attention_backward("dq_scale")


@mutant("attention_dK_missing_scale", "attention.backward.dK",
        "dK = dS^T Q without the 1/sqrt(d_k) factor", "ops.attention_backward", fast=True)
def _att2(orig):
    return _attention_backward("dk_scale")


@mutant("attention_dK_missing_transpose", "attention.backward.dK",
        "dK = dS Q instead of dS^T Q", "ops.attention_backward")
def _att3(orig):
    return _attention_backward("dk_transpose")


@mutant("attention_dV_missing_transpose", "attention.backward.dV",
        "dV = P dC instead of P^T dC", "ops.attention_backward")
def _att4(orig):
    return _attention_backward("dv_transpose")


@mutant("attention_merge_without_transpose", "attention.merge_heads",
        "backward merges head gradients with a bare reshape (heads and tokens interleaved)",
        "ops.attention_backward")
def _att5(orig):
    return _attention_backward("merge_reshape")


@mutant("attention_dx_drops_value_branch", "attention.backward.dx",
        "dx sums the Q and K projection gradients but forgets the V branch",
        "ops.attention_backward")
def _att6(orig):
    return _attention_backward("drop_v")


@mutant("attention_mask_ignored_in_backward", "attention.backward.dS",
        "backward uses the unmasked softmax probabilities: padded keys get gradient",
        "ops.attention_forward")
def _att7(orig):
    def attention_forward(x, *args, n_heads, mask=None, **biases):
        y, cache = orig(x, *args, n_heads=n_heads, mask=mask, **biases)
        if mask is None:
            return y, cache
        _, scale, q_h, k_h = cache[:4]
        p_unmasked, _ = ops().softmax_forward((q_h @ k_h.transpose(0, 1, 3, 2)) * scale)
        return y, cache[:5] + (p_unmasked,) + cache[6:]

    return attention_forward


@mutant("attention_scale_sqrt_hidden", "attention.scores",
        "scores scaled by 1/sqrt(H) instead of 1/sqrt(d_k) (forward and backward agree)",
        "ops.attention_forward", "ops.attention_backward")
def _att8(orig_fwd, orig_bwd):
    # Scaling Q by sqrt(d_k / H) = 1/sqrt(A) is exactly scores / sqrt(H): do it through W_q, b_q
    # and chain-rule their gradients, so forward and backward stay mutually consistent.
    def attention_forward(x, W_q, W_k, W_v, W_o, b_q=None, b_k=None, b_v=None, b_o=None, *,
                          n_heads, mask=None):
        if not (isinstance(x, np.ndarray) and isinstance(W_q, np.ndarray)
                and isinstance(n_heads, (int, np.integer)) and n_heads > 0):
            return orig_fwd(x, W_q, W_k, W_v, W_o, b_q, b_k, b_v, b_o, n_heads=n_heads,
                            mask=mask)  # bad input: the original's ValueError
        c = x.dtype.type(1.0 / np.sqrt(n_heads))
        y, cache = orig_fwd(x, W_q * c, W_k, W_v, W_o, None if b_q is None else b_q * c, b_k,
                            b_v, b_o, n_heads=n_heads, mask=mask)
        return y, ("scaled", c, cache)

    def attention_backward(dy, cache):
        if not (isinstance(cache, tuple) and cache[:1] == ("scaled",)):
            return orig_bwd(dy, cache)
        _, c, inner = cache
        g = list(orig_bwd(dy, inner))
        g[1] = g[1] * c
        g[5] = None if g[5] is None else g[5] * c
        return tuple(g)

    return attention_forward, attention_backward


# ===================================================================== ffn / block / model
@mutant("ffn_dW2_uses_preactivation", "ffn.backward",
        "dW_2 computed from the cached pre-activation h instead of ReLU(h)",
        "ops.ffn_forward")
def _ffn(orig):
    def ffn_forward(x, W_1, b_1, W_2, b_2):
        y, (c1, c_relu, _) = orig(x, W_1, b_1, W_2, b_2)
        h, _ = ops().linear_forward(x, W_1, b_1)
        _, c2_wrong = ops().linear_forward(h, W_2, b_2)  # caches h where ReLU(h) belongs
        return y, (c1, c_relu, c2_wrong)

    return ffn_forward


def _block_backward(bug: str):
    def block_backward(dout, cache):
        o = ops()
        c_attn, c_ln1, c_ffn, c_ln2, names = cache
        dr2, dg2, db2 = o.layernorm_backward(dout, c_ln2)
        dh1_ffn, *dffn = o.ffn_backward(dr2, c_ffn)
        dh1 = dh1_ffn if bug == "ffn" else dr2 + dh1_ffn
        dr1, dg1, db1 = o.layernorm_backward(dh1, c_ln1)
        dx_attn, *dattn = o.attention_backward(dr1, c_attn)
        dx = dx_attn if bug == "attn" else dr1 + dx_attn
        grads = {f"attn.{n}": g for n, g in zip(o.ATTENTION_PARAMS, dattn)}
        grads.update({f"ffn.{n}": g for n, g in zip(o.FFN_PARAMS, dffn)})
        grads.update({"ln1.gamma": dg1, "ln1.beta": db1, "ln2.gamma": dg2, "ln2.beta": db2})
        return dx, {n: grads[n] for n in names}

    return block_backward


@mutant("block_drops_attention_residual", "residual.backward",
        "block backward drops the skip branch around attention: dx = dMHA/dx only",
        "ops.block_backward")
def _blk1(orig):
    return _block_backward("attn")


@mutant("block_drops_ffn_residual", "residual.backward",
        "block backward drops the skip branch around the FFN", "ops.block_backward", fast=True)
def _blk2(orig):
    return _block_backward("ffn")


@mutant("model_backward_layer_order", "block.postln",
        "model backward walks the blocks in forward order (layer i's cache for layer L-1-i)",
        "model.backward")
def _model_order(orig):
    def backward(dout, cache):
        config, dtype, emb_cache, block_caches, *rest = cache
        return orig(dout, (config, dtype, emb_cache, block_caches[::-1], *rest))

    return backward


# ===================================================================== embeddings
@mutant("embedding_backward_fancy_index", "embedding.backward",
        "dW[ids] += dout: buffered fancy indexing keeps one of several repeated ids",
        "ops.embedding_backward", fast=True)
def _emb(orig):
    def embedding_backward(dout, cache):
        orig(dout, cache)  # validation
        ids, W_shape, dtype = cache
        dW = np.zeros(W_shape, dtype=dtype)
        dW[ids.reshape(-1)] += dout.reshape(-1, W_shape[1])
        return (dW,)

    return embedding_backward


@mutant("position_grad_batch_mean", "position.learned.backward",
        "position-embedding gradient averaged over the batch instead of summed",
        "ops.position_embedding_backward")
def _pos(orig):
    def position_embedding_backward(dout, cache):
        dx, dW = orig(dout, cache)
        return dx, dW / dout.shape[0]

    return position_embedding_backward


@mutant("sinusoidal_concatenated", "position.sinusoidal",
        "sinusoidal table [sin | cos] concatenated instead of interleaved on even/odd features",
        "ops.sinusoidal_encoding")
def _sin(orig):
    def sinusoidal_encoding(T, d, dtype=np.float64):
        pe = orig(T, d, np.float64)
        return np.concatenate([pe[:, 0::2], pe[:, 1::2]], axis=1).astype(dtype)

    return sinusoidal_encoding


# ===================================================================== pooler / losses
@mutant("pooler_grad_to_last_token", "pooler.forward",
        "pooler backward sends the gradient to the last token instead of [CLS]",
        "ops.pooler_backward")
def _pool(orig):
    def pooler_backward(dy, cache):
        dh, dW, db = orig(dy, cache)
        return np.roll(dh, -1, axis=1), dW, db  # position 0's row lands on position T-1

    return pooler_backward


@mutant("ce_grad_leaks_unmasked", "loss.ce.backward.mean",
        "cross-entropy gradient not zeroed at ignore_index positions", "ops.cross_entropy_backward",
        fast=True)
def _ce1(orig):
    def cross_entropy_backward(dloss, cache):
        logp, safe, valid, denom = cache
        return orig(dloss, (logp, safe, np.ones_like(valid), denom))

    return cross_entropy_backward


@mutant("ce_backward_divides_by_all_positions", "loss.ce.backward.mean",
        "mean cross-entropy backward divides by B*T instead of the number of predicted tokens",
        "ops.cross_entropy_backward")
def _ce2(orig):
    def cross_entropy_backward(dloss, cache):
        logp, safe, valid, denom = cache
        return orig(dloss, (logp, safe, valid, valid.size if denom != 1 else 1))

    return cross_entropy_backward


@mutant("ce_mean_over_all_positions", "loss.ce.mean",
        "the 'mean' loss divides by B*T instead of N_masked (forward and backward agree)",
        "ops.cross_entropy_forward")
def _ce3(orig):
    def cross_entropy_forward(logits, labels, *, ignore_index=-100, reduction="mean"):
        loss, (logp, safe, valid, denom) = orig(logits, labels, ignore_index=ignore_index,
                                                reduction=reduction)
        if reduction != "mean":
            return loss, (logp, safe, valid, denom)
        return (logits.dtype.type(loss * denom / valid.size), (logp, safe, valid, valid.size))

    return cross_entropy_forward


@mutant("mse_missing_factor_2", "loss.mse.backward",
        "MSE backward (y_hat - y) / N, missing the factor 2", "ops.mse_backward")
def _mse(orig):
    def mse_backward(dloss, cache):
        dy_hat, dy = orig(dloss, cache)
        return dy_hat / 2, dy / 2

    return mse_backward


# ===================================================================== optimizer
_M_KEYS = ("m", "exp_avg", "m1", "first_moment", "moment1", "mean")
_V_KEYS = ("v", "exp_avg_sq", "v1", "second_moment", "moment2", "var")
_T_KEYS = ("t", "step", "steps", "count", "timestep")


def _as_dict(obj):
    if isinstance(obj, dict):
        return obj
    try:
        return vars(obj)
    except TypeError:
        return {}


def _first_key(d, keys):
    return next((k for k in keys if k in d), None)


def _moments(state, name):
    """(m, v, t) of parameter ``name`` in an Adam state of a common layout: {"m": {name: ..},
    "v": {..}, "t": int} or {name: {"m": .., "v": .., "t": ..}} (other common key names too)."""
    d = _as_dict(state)
    mk, vk, tk = _first_key(d, _M_KEYS), _first_key(d, _V_KEYS), _first_key(d, _T_KEYS)
    if mk and vk:
        m, v, t = _as_dict(d[mk]).get(name), _as_dict(d[vk]).get(name), d.get(tk)
    elif name in d:
        sub = _as_dict(d[name])
        m, v = sub.get(_first_key(sub, _M_KEYS)), sub.get(_first_key(sub, _V_KEYS))
        t = sub.get(_first_key(sub, _T_KEYS), d.get(tk))
    else:
        raise NotApplicable("cannot find the Adam moments in the optimizer state")
    if isinstance(t, dict):
        t = t.get(name)
    if m is None or v is None or t is None:
        raise NotApplicable("cannot find m, v and the step count t in the optimizer state")
    return np.asarray(m), np.asarray(v), int(t)


def _adam_defaults(fn) -> dict:
    return {k: p.default for k, p in inspect.signature(fn).parameters.items()
            if p.default is not inspect.Parameter.empty}


def _probe_adam(mods):
    optim = mods["optim"]
    params = {"w": np.array([0.5, -1.0, 2.0])}
    try:
        state = optim.adam_init(copy.deepcopy(params))
        _, state = optim.adam_step(copy.deepcopy(params), {"w": np.array([0.1, -0.2, 0.3])},
                                   state, lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8,
                                   weight_decay=0.0, no_decay=())
    except NotApplicable:
        raise
    except Exception as e:
        raise NotApplicable(f"adam_step does not follow the protocol: "
                            f"{type(e).__name__}: {e}") from e
    if _moments(state, "w")[2] != 1:
        raise NotApplicable("the optimizer state's step count is not 1 after one step")


def _adam_term_swap(orig, wrong_term):
    """adam_step whose update term lr * m_hat / (sqrt(v_hat) + eps) is replaced by
    lr * wrong_term(m, v, t, beta1, beta2, eps): the original's result plus the difference, so
    weight decay and no_decay keep the original's handling."""

    def adam_step(params, grads, state, **kw):
        new_params, new_state = orig(params, grads, state, **kw)
        k = {**_adam_defaults(orig), **kw}
        lr, b1, b2, eps = k["lr"], k["beta1"], k["beta2"], k["eps"]
        for name in grads:
            m, v, t = _moments(new_state, name)
            right = (m / (1 - b1 ** t)) / (np.sqrt(v / (1 - b2 ** t)) + eps)
            arr = new_params[name]
            arr -= (lr * (wrong_term(m, v, t, b1, b2, eps) - right)).astype(arr.dtype)
        return new_params, new_state

    return adam_step


@mutant("adam_no_bias_correction", "optim.adam",
        "Adam update uses m / (sqrt(v) + eps) without the 1 - beta^t bias corrections",
        "optim.adam_step", probe=_probe_adam)
def _adam1(orig):
    return _adam_term_swap(orig, lambda m, v, t, b1, b2, eps: m / (np.sqrt(v) + eps))


@mutant("adam_eps_inside_sqrt", "optim.adam",
        "Adam divides by sqrt(v_hat + eps) instead of sqrt(v_hat) + eps",
        "optim.adam_step", probe=_probe_adam)
def _adam2(orig):
    return _adam_term_swap(
        orig, lambda m, v, t, b1, b2, eps: (m / (1 - b1 ** t)) / np.sqrt(v / (1 - b2 ** t) + eps))


@mutant("adamw_coupled_l2", "optim.adamw",
        "weight decay added to the gradient (Adam + L2) instead of decoupled from the moments",
        "optim.adam_step", probe=_probe_adam)
def _adamw1(orig):
    def adam_step(params, grads, state, **kw):
        wd = {**_adam_defaults(orig), **kw}.get("weight_decay", 0.0)
        if not wd:
            return orig(params, grads, state, **kw)
        # which tensors does the original decay?  compare runs with and without decay
        p_wd, _ = orig(copy.deepcopy(params), grads, copy.deepcopy(state), **kw)
        p_0, _ = orig(copy.deepcopy(params), grads, copy.deepcopy(state),
                      **{**kw, "weight_decay": 0.0})
        decayed = {n for n in grads if not np.array_equal(p_wd[n], p_0[n])}
        coupled = {n: (g + wd * params[n] if n in decayed else g) for n, g in grads.items()}
        return orig(params, coupled, state, **{**kw, "weight_decay": 0.0})

    return adam_step


@mutant("adamw_decays_no_decay_params", "optim.adamw",
        "weight decay also applied to the no_decay tensors (biases, LayerNorm gamma/beta)",
        "optim.adam_step", probe=_probe_adam)
def _adamw2(orig):
    def adam_step(params, grads, state, **kw):
        no_decay = kw.get("no_decay")
        if isinstance(no_decay, (tuple, list, set, frozenset)):
            kw["no_decay"] = type(no_decay)()
        elif callable(no_decay):
            kw["no_decay"] = lambda name: False
        return orig(params, grads, state, **kw)

    return adam_step


@mutant("clip_per_tensor", "clip.global_norm",
        "each gradient tensor clipped to max_norm on its own instead of by the global norm",
        "optim.clip_by_global_norm")
def _clip1(orig):
    def clip_by_global_norm(grads, max_norm):
        _, norm = orig(copy.deepcopy(grads), max_norm)
        out = {}
        for k, g in grads.items():
            n = float(np.sqrt((g * g).sum()))
            out[k] = g * (max_norm / n) if n > max_norm else g
        return out, norm

    return clip_by_global_norm


@mutant("clip_scales_up_small_gradients", "clip.global_norm",
        "gradients always rescaled to max_norm, also when their norm is already below it",
        "optim.clip_by_global_norm")
def _clip2(orig):
    def clip_by_global_norm(grads, max_norm):
        _, norm = orig(copy.deepcopy(grads), max_norm)
        return {k: g * (max_norm / norm) for k, g in grads.items()}, norm

    return clip_by_global_norm


@mutant("global_norm_missing_sqrt", "clip.global_norm",
        "global gradient norm returns the sum of squares (no square root)",
        "optim.global_grad_norm")
def _clip3(orig):
    def global_grad_norm(grads):
        return orig(grads) ** 2

    return global_grad_norm


@mutant("warmup_zero_lr_at_step0", "schedule.warmup_linear",
        "warmup lr = peak * step / warmup_steps: the first update (step 0) has lr 0",
        "optim.warmup_linear_lr", fast=True)
def _sched1(orig):
    def warmup_linear_lr(step, *, peak_lr, warmup_steps, total_steps):
        lr = orig(step, peak_lr=peak_lr, warmup_steps=warmup_steps, total_steps=total_steps)
        return peak_lr * step / warmup_steps if step < warmup_steps else lr

    return warmup_linear_lr


@mutant("warmup_never_decays", "schedule.warmup_linear",
        "after warmup the lr stays at its peak (the linear decay is missing)",
        "optim.warmup_linear_lr")
def _sched2(orig):
    def warmup_linear_lr(step, *, peak_lr, warmup_steps, total_steps):
        lr = orig(step, peak_lr=peak_lr, warmup_steps=warmup_steps, total_steps=total_steps)
        return lr if step < warmup_steps else peak_lr

    return warmup_linear_lr


def _batches_param(fn) -> str:
    """The argument holding the micro-batches (or their per-batch results): named like
    ``micro_batches``, ``batches``, ``microbatch_grads``."""
    for name in inspect.signature(fn).parameters:
        if "batch" in name.lower() or "micro" in name.lower():
            return name
    raise NotApplicable("accumulate_gradients has no argument named like *batch* or *micro*")


def _probe_accum(mods):
    _batches_param(mods["optim"].accumulate_gradients)


def _average(results):
    """Element-wise mean of structurally equal results (tuples, dicts, arrays, floats); integer
    counts are summed (they add up over micro-batches)."""
    first = results[0]
    if isinstance(first, (tuple, list)):
        return type(first)(_average([r[i] for r in results]) for i in range(len(first)))
    if isinstance(first, dict):
        return {k: _average([r[k] for r in results]) for k in first}
    if isinstance(first, (bool, np.bool_)) or first is None or isinstance(first, str):
        return first
    if isinstance(first, (int, np.integer)):
        return sum(results)
    if isinstance(first, (float, np.floating, np.ndarray)):
        return sum(results[1:], start=first) / len(results)
    return first


@mutant("accum_mean_of_micro_batch_means", "accum.grad_mean",
        "accumulation averages per-micro-batch mean gradients instead of weighting by tokens",
        "optim.accumulate_gradients", probe=_probe_accum)
def _accum(orig):
    name = _batches_param(orig)
    sig = inspect.signature(orig)

    def accumulate_gradients(*args, **kwargs):
        bound = sig.bind(*args, **kwargs)
        batches = list(bound.arguments[name])
        if len(batches) < 2:  # one micro-batch (or bad input): nothing to average
            return orig(*args, **kwargs)
        results = []
        for mb in batches:
            bound.arguments[name] = [mb]
            results.append(orig(*bound.args, **bound.kwargs))
        return _average(results)

    return accumulate_gradients
