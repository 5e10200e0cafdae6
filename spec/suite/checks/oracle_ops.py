"""Every op pair against PyTorch: the forward output (kind ``oracle.forward``) and every output
of the backward (``oracle.backward``), given the same random upstream gradient, against torch's
op and ``torch.autograd`` (spec/suite/torch_oracle.py), within ORACLE_RTOL_F64 / ORACLE_RTOL_F32
of the magnitude of the result (torch_oracle.allowed_error says why that, and not entry by
entry).

Shapes and values come from Hypothesis (small sides, bounded values); the weights and the
upstream gradient from a NumPy generator seeded by Hypothesis (Gaussian: mixed signs, never
all ones).  torch is imported when a check runs (the ``oracle`` extra), not when the suite is
loaded.
"""

from __future__ import annotations

import hypothesis.extra.numpy as hnp
import numpy as np
from hypothesis import assume
from hypothesis import strategies as st

from spec.protocol import IGNORE_INDEX, OPS, capabilities
from spec.protocol.capabilities import declared_guards as declared
from spec.protocol.guards import cross_entropy_adjustment
from spec.suite.registry import check, grid, lazy_module
from spec.suite.strategies import ce_labels, layernorm_eps, variant_kwargs
from spec.tolerances import KINK_MARGIN

to = lazy_module("spec.suite.torch_oracle")
torch = lazy_module("torch")
TORCH = ("torch",)


def oracle(name, ops, axes=None, given=None, kinds="oracle.forward|oracle.backward",
           needs=None, omit=(), fixed=None):
    """Register an oracle check of the op ``ops[0]`` (its verdict; the other rows it runs
    through count as evidence for their equations), one per case of the ``axes`` grid, the
    forward and the backward each a check of its own.  ``needs`` (a mapping or a callable of
    the case): what the implementation must declare (decided before drawing); ``omit``:
    equation IDs (or last components) of the op the check does not exercise; ``fixed``:
    keywords added to every case (the variant a registration is about)."""
    cases = [(label, {**kw, **(fixed or {})}) for label, kw in grid(**(axes or {}))]
    eqs = tuple(e for op in ops for e in OPS[op].equations
                if e not in omit and e.rsplit(".", 1)[-1] not in omit)
    return check(kinds, name, cases=cases, ops=ops[:1], equations=eqs, given=given,
                 requires=TORCH, kinds_arg="part", needs=needs)


def variant(impl, op: str, *resolve: str, **fixed) -> dict:
    """The variant keywords of one oracle case: ``fixed`` ("W_o": False) and the ``resolve``d
    options at the value the implementation declares (spec.suite.strategies.variant_kwargs)."""
    return variant_kwargs(op, {f"{op}.{k}": v for k, v in fixed.items()}, resolve,
                          capabilities(impl))


DTYPES = [np.float64, np.float32]
DTYPE_AXIS = [("f64", np.float64), ("f32", np.float32)]

seeds = st.integers(0, 2**32 - 1)
# LayerNorm inputs are kept away from (nearly) constant rows: x_hat is then 0/0, and its
# rounding error grows like 1/std in any implementation (a data condition, not a tolerance).
LN_MIN_STD = 0.1
side = st.integers(1, 4)


def values(shape, lo=-2.0, hi=2.0):
    """A float64 array of ``shape`` with bounded, finite entries."""
    return hnp.arrays(np.float64, shape,
                      elements=st.floats(lo, hi, allow_nan=False, allow_infinity=False))


def away_from_zero(shape, margin=KINK_MARGIN, hi=2.0):
    """Entries in [-hi, -margin] U [margin, hi]: a kink at 0 is never on the sample."""
    return hnp.arrays(np.float64, shape, elements=st.one_of(
        st.floats(-hi, -margin), st.floats(margin, hi)))


def gaussian(rng, shape, dtype, scale=1.0):
    return (scale * rng.standard_normal(shape)).astype(dtype)


def upstream(rng, shape, dtype):
    """A random upstream gradient (mixed signs, never all ones); a scalar for losses."""
    g = rng.standard_normal(shape)
    return g.astype(dtype) if shape else dtype(g)


def compare_forward(prefix, ours_out, theirs_out, dtype, inputs_scale):
    """The forward output against torch's (the check of part "forward": the backward is not
    called, so a failing backward cannot turn the forward column red)."""
    to.assert_close(f"{prefix} forward", ours_out, theirs_out, dtype,
                    inputs_scale=inputs_scale)


def compare(part, prefix, ours_out, ours_grads, theirs_out, theirs_grads, names, dtype,
            inputs_scale, allowance=0.0):
    """Each named gradient (ours in the backward's order) against torch's."""
    assert part == "backward", part
    assert len(ours_grads) == len(names), (
        f"{prefix} backward: {len(ours_grads)} outputs, expected {len(names)} ({names})")
    scale = to.grad_scale(theirs_grads.values())
    for name, g in zip(names, ours_grads):
        if name is None:
            continue
        to.assert_close(f"{prefix} d{name}", g, theirs_grads[name], dtype, scale, inputs_scale,
                        allowance=allowance)


def against_torch(impl, part, dtype, op, args, torch_fn, inputs, dout, names, *, label=None,
                  kwargs=None, check=None, backward_scale=0.0):
    """The body the oracles share.  Part "forward": ``impl.<op>_forward(*args, **kwargs)``
    against ``torch_fn(**inputs)``; part "backward": ``impl.<op>_backward(dout, cache)``
    against torch's gradients of ``names`` (in the backward's order; None: an output that is
    not compared), after ``check(grads)`` -- a variant's assertion on the backward's outputs.
    ``label`` names the op in a red (default ``op``); ``backward_scale``: the magnitude of the
    terms the backward sums when it exceeds the inputs' (its rounding floor's scale)."""
    label = label or op
    out, cache = getattr(impl, f"{op}_forward")(*args, **(kwargs or {}))
    t_out, t_grads = to.vjp(torch_fn, inputs, dout, tuple(n for n in names if n))
    s_in = to.inputs_scale(inputs, dout)
    if part == "forward":
        return compare_forward(label, out, t_out, dtype, s_in)
    grads = getattr(impl, f"{op}_backward")(dout, cache)
    if check is not None:
        check(grads)
    compare(part, label, out, grads, t_out, t_grads, names, dtype, max(s_in, backward_scale))


# --------------------------------------------------------------------------- embeddings
@oracle("embedding", ("embedding",), dict(dtype=DTYPE_AXIS),
        dict(B=side, T=side, V=st.integers(1, 6), H=side, seed=seeds, data=st.data()))
def embedding(impl, part, dtype, B, T, V, H, seed, data):
    ids = data.draw(hnp.arrays(np.int64, (B, T), elements=st.integers(0, V - 1)))
    if ids.size > 1:
        ids.flat[-1] = ids.flat[0]  # at least one repeated id: np.add.at territory
    rng = np.random.default_rng(seed)
    W = gaussian(rng, (V, H), dtype)
    dout = upstream(rng, (B, T, H), dtype)
    return against_torch(impl, part, dtype, "embedding", (ids, W), to.embedding,
                         dict(ids=ids, W=W), dout, ("W",))


@oracle("position_embedding", ("position_embedding",), dict(dtype=DTYPE_AXIS),
        dict(B=side, T=side, extra=st.integers(0, 3), H=side, seed=seeds, data=st.data()))
def learned_position(impl, part, dtype, B, T, extra, H, seed, data):
    x = data.draw(values((B, T, H))).astype(dtype)
    rng = np.random.default_rng(seed)
    W_pos = gaussian(rng, (T + extra, H), dtype)  # unused rows must get exactly zero gradient
    dout = upstream(rng, (B, T, H), dtype)
    return against_torch(impl, part, dtype, "position_embedding", (x, W_pos), to.learned_position,
                         dict(x=x, W_pos=W_pos), dout, ("x", "W_pos"))


@oracle("sinusoidal_encoding", ("sinusoidal_position",), dict(dtype=DTYPE_AXIS),
        dict(T=st.integers(1, 64), d=st.integers(1, 16)), kinds="oracle.forward")
def sinusoidal_table(impl, part, dtype, T, d):
    ours = impl.sinusoidal_encoding(T, d, dtype)
    theirs = to.sinusoidal_table(T, d, torch.float64).numpy().astype(dtype)
    to.assert_close(f"sinusoidal_encoding[T={T}, d={d}]", ours, theirs, dtype)


@oracle("sinusoidal_position", ("sinusoidal_position",), dict(dtype=DTYPE_AXIS),
        dict(B=side, T=st.integers(1, 8), H=st.integers(1, 7), seed=seeds, data=st.data()))
def sinusoidal_position(impl, part, dtype, B, T, H, seed, data):
    x = data.draw(values((B, T, H))).astype(dtype)
    dout = upstream(np.random.default_rng(seed), (B, T, H), dtype)
    return against_torch(impl, part, dtype, "sinusoidal_position", (x,),
                         to.sinusoidal_position, dict(x=x), dout, ("x",))


# --------------------------------------------------------------------------- linear
@oracle("linear", ("linear",), dict(dtype=DTYPE_AXIS,
             bias=[("bias", True), ("nobias", False)]),
        dict(lead=st.lists(side, min_size=1, max_size=3), n_in=side, n_out=side, seed=seeds,
             data=st.data()))
def linear(impl, part, dtype, bias, lead, n_in, n_out, seed, data):
    x = data.draw(values(tuple(lead) + (n_in,))).astype(dtype)
    return _weight_bias(impl, part, dtype, "linear", "x", x, n_in, n_out, tuple(lead), bias,
                        seed)


def _weight_bias(impl, part, dtype, op, x_name, x, n_in, n_out, lead_out, bias, seed):
    """linear and pooler: ``op``(x, W, b) with a random W [n_in, n_out] and b [n_out] (None
    without a bias) against torch; the upstream gradient is [*lead_out, n_out]."""
    rng = np.random.default_rng(seed)
    W = gaussian(rng, (n_in, n_out), dtype)
    b = gaussian(rng, (n_out,), dtype) if bias else None
    dy = upstream(rng, lead_out + (n_out,), dtype)

    def check(grads):
        dx, dW, db = grads
        if not bias:
            assert db is None, f"{op}_backward: expected db None without a bias"

    return against_torch(impl, part, dtype, op, (x, W, b), getattr(to, op),
                         {x_name: x, "W": W, "b": b}, dy, (x_name, "W", "b" if bias else None),
                         check=check)


# --------------------------------------------------------------------------- layernorm
_LN_GIVEN = dict(B=side, T=side, N=st.integers(2, 8), eps=layernorm_eps(), seed=seeds,
                 data=st.data())


@oracle("layernorm_plain", ("layernorm",), dict(dtype=DTYPE_AXIS), _LN_GIVEN,
        needs={"layernorm.affine": False}, omit=("dgamma", "dbeta"), fixed={"affine": False})
@oracle("layernorm", ("layernorm",), dict(dtype=DTYPE_AXIS), _LN_GIVEN,
        needs={"layernorm.affine": True})
def layernorm(impl, part, dtype, B, T, N, eps, seed, data, affine=True):
    """``affine`` False: the variant without gamma and beta (None, and None gradients); an
    implementation without eps is compared with torch at eps = 0."""
    if not variant(impl, "layernorm", "layernorm.eps")["eps"]:
        eps = 0.0
    x = data.draw(values((B, T, N), -3.0, 3.0))
    assume(np.all(x.std(axis=-1) > LN_MIN_STD))
    # N = 2: x_hat = +-sqrt(1 - eps / sigma^2), so dx is eps-sized (0 at eps = 0); float32
    # would compare rounding noise (~u * rstd * |dy|) with torch's near 0 -- float64 checks it
    assume(N >= 3 or dtype == np.float64)
    x = x.astype(dtype)
    rng = np.random.default_rng(seed)
    gamma = (1.0 + 0.5 * rng.standard_normal(N)).astype(dtype)  # random, never all ones
    beta = gaussian(rng, (N,), dtype, 0.5)
    if not affine:
        gamma = beta = None
    names = ("x", "gamma", "beta") if affine else ("x", None, None)
    dy = upstream(rng, (B, T, N), dtype)

    def check(grads):
        if not affine:
            assert grads[1] is None and grads[2] is None, (
                "layernorm_backward: expected dgamma, dbeta None without gamma and beta, got "
                f"{type(grads[1]).__name__}, {type(grads[2]).__name__}")

    return against_torch(impl, part, dtype, "layernorm", (x, gamma, beta, eps), to.layernorm,
                         dict(x=x, gamma=gamma, beta=beta, eps=eps), dy, names, check=check,
                         backward_scale=layernorm_backward_scale(x, gamma, dy, eps))


def layernorm_backward_scale(x, gamma, dy, eps) -> float:
    """The magnitude of the terms LayerNorm's dx sums, for its rounding floor:
    dx = (g - mean(g) - x_hat mean(g x_hat)) / sigma with g = gamma dy, so terms of |g| / sigma
    (x_hat^2 <= 1 for N = 2), up to 10x the inputs at sigma >= LN_MIN_STD.  They cancel when
    x_hat^2 -> 1 (N = 2: dx is eps-sized), and both sides carry the rounding of those terms
    (found by the deep profile: 4.8e-14 apart on dx = -8.9e-9 at eps = 1e-11)."""
    sigma_min = float(np.sqrt(np.asarray(x, np.float64).var(axis=-1) + eps).min())
    g_max = float(np.abs(dy).max()) * (1.0 if gamma is None else float(np.abs(gamma).max()))
    return 2.0 * g_max / sigma_min


# --------------------------------------------------------------------------- softmax
@oracle("softmax", ("softmax",), dict(dtype=DTYPE_AXIS,
             masked=[("nomask", False), ("mask", True)]),
        dict(B=side, T=side, n=st.integers(1, 6), seed=seeds, data=st.data()))
def softmax(impl, part, dtype, masked, B, T, n, seed, data):
    x = data.draw(values((B, T, n), -5.0, 5.0)).astype(dtype)
    mask = None
    if masked:
        mask = data.draw(hnp.arrays(np.bool_, (B, T, n)))
        keep = data.draw(hnp.arrays(np.int64, (B, T), elements=st.integers(0, n - 1)))
        np.put_along_axis(mask, keep[..., None], True, axis=-1)  # one kept entry per row
    dp = upstream(np.random.default_rng(seed), (B, T, n), dtype)
    return against_torch(impl, part, dtype, "softmax", (x, mask), to.softmax,
                         dict(x=x, mask=mask), dp, ("x",))


# --------------------------------------------------------------------------- relu / tanh
@oracle("relu", ("relu",), dict(dtype=DTYPE_AXIS),
        dict(shape=st.lists(side, min_size=1, max_size=3), seed=seeds, data=st.data()))
def relu(impl, part, dtype, shape, seed, data):
    x = data.draw(away_from_zero(tuple(shape))).astype(dtype)
    dy = upstream(np.random.default_rng(seed), tuple(shape), dtype)
    return against_torch(impl, part, dtype, "relu", (x,), to.relu, dict(x=x), dy, ("x",))


@oracle("tanh", ("tanh",), dict(dtype=DTYPE_AXIS),
        dict(shape=st.lists(side, min_size=1, max_size=3), seed=seeds, data=st.data()))
def tanh(impl, part, dtype, shape, seed, data):
    x = data.draw(values(tuple(shape), -4.0, 4.0)).astype(dtype)
    dy = upstream(np.random.default_rng(seed), tuple(shape), dtype)
    return against_torch(impl, part, dtype, "tanh", (x,), to.tanh, dict(x=x), dy, ("x",))


# --------------------------------------------------------------------------- attention
ATTN = ("W_q", "W_k", "W_v", "W_o", "b_q", "b_k", "b_v", "b_o")


def padding_mask(data, B, T):
    """[B, T] key padding mask: any pattern, at least one attendable key per sequence."""
    mask = data.draw(hnp.arrays(np.bool_, (B, T)))
    keep = data.draw(hnp.arrays(np.int64, (B,), elements=st.integers(0, T - 1)))
    mask[np.arange(B), keep] = True
    return mask


def _attention_needs(kw):
    return {"attention.W_o": True, "attention.causal": False,
            **({"attention_bias": True} if kw["bias"] else {}),
            **({"key_mask": True} if kw["masked"] else {})}


_ATTN_GIVEN = dict(B=st.integers(1, 3), T=st.integers(1, 5), A=st.integers(1, 3),
                   d_k=st.integers(1, 3), seed=seeds, data=st.data())
_FOLLOW = ("attention_bias", "key_mask")  # biases and masks as the implementation has them


@oracle("attention_noproj", ("attention", "heads"), dict(dtype=DTYPE_AXIS), _ATTN_GIVEN,
        needs={"attention.W_o": False}, omit=("dW_o", "attention.causal"),
        fixed={"W_o": False, "bias": None, "masked": None})
@oracle("attention_causal", ("attention", "heads"), dict(dtype=DTYPE_AXIS), _ATTN_GIVEN,
        needs={"attention.causal": True}, fixed={"causal": True, "bias": None, "masked": None})
@oracle("attention", ("attention", "heads"), dict(dtype=DTYPE_AXIS,
             bias=[("bias", True), ("nobias", False)],
             masked=[("nomask", False), ("mask", True)]), _ATTN_GIVEN,
        needs=_attention_needs, omit=("attention.causal",))
def attention(impl, part, dtype, bias, masked, B, T, A, d_k, seed, data, W_o=None,
              causal=None):
    """The variants (``W_o`` False: no output projection; ``causal``) take the biases, key
    mask, projection and causality the implementation declares where not fixed (None)."""
    fixed = {k: v for k, v in (("W_o", W_o), ("causal", causal)) if v is not None}
    v = variant(impl, "attention", *(f"attention.{k}" for k in ("W_o", "causal")
                                     if k not in fixed), *_FOLLOW, **fixed)
    bias = v["bias"] if bias is None else bias
    masked = v["masked"] if masked is None else masked
    W_o, causal = v["W_o"], v["causal"]
    H = A * d_k
    x = data.draw(values((B, T, H))).astype(dtype)
    mask = padding_mask(data, B, T) if masked else None
    if mask is not None and causal:
        mask[:, 0] = True  # the first query attends key 0 alone
    rng = np.random.default_rng(seed)
    p = {n: gaussian(rng, (H, H), dtype, 1.0 / np.sqrt(H)) for n in ATTN[:4]}
    if bias:
        p.update({n: gaussian(rng, (H,), dtype, 0.5) for n in ATTN[4:]})
    if not W_o:
        p["W_o"] = None
        p.pop("b_o", None)
    dy = upstream(rng, (B, T, H), dtype)
    names = tuple(n if p.get(n) is not None else None for n in ATTN)
    names = ("x",) + names
    kw = {"causal": True} if causal else {}

    def check(grads):
        wrong = [ATTN[i - 1] for i, (n, g) in enumerate(zip(names, grads))
                 if i and n is None and g is not None]
        assert not wrong, f"attention_backward: expected None for the absent {wrong}, got arrays"

    # (causal True is no magnitude: the inputs' scale is the same with or without it)
    return against_torch(impl, part, dtype, "attention", (x, *(p.get(n) for n in ATTN)),
                         to.attention, dict(x=x, **p, n_heads=A, mask=mask, **kw), dy, names,
                         label=f"attention[A={A}, d_k={d_k}]",
                         kwargs=dict(n_heads=A, mask=mask, **kw), check=check)


# --------------------------------------------------------------------------- ffn / block
def ffn_params(rng, H, I, dtype):
    return {"W_1": gaussian(rng, (H, I), dtype, 1.0 / np.sqrt(H)),
            "b_1": gaussian(rng, (I,), dtype, 0.5),
            "W_2": gaussian(rng, (I, H), dtype, 1.0 / np.sqrt(I)),
            "b_2": gaussian(rng, (H,), dtype, 0.5)}


_FFN_GIVEN = dict(B=side, T=side, H=st.integers(1, 6), I=st.integers(1, 8), seed=seeds,
                  data=st.data())


@oracle("ffn_nob2", ("ffn", "relu"), dict(dtype=DTYPE_AXIS), _FFN_GIVEN,
        needs={"ffn.b_2": False}, fixed={"b_2": False})
@oracle("ffn", ("ffn", "relu"), dict(dtype=DTYPE_AXIS), _FFN_GIVEN, needs={"ffn.b_2": True})
def ffn(impl, part, dtype, B, T, H, I, seed, data, b_2=True):
    """``b_2`` False: the FFN without its second bias (None, and a None gradient)."""
    x = data.draw(values((B, T, H))).astype(dtype)
    rng = np.random.default_rng(seed)
    p = ffn_params(rng, H, I, dtype)
    if not b_2:
        p["b_2"] = None
    # keep every ReLU pre-activation off its kink (computed in torch, float64)
    pre = to.linear(to.tensor(x.astype(np.float64)), to.tensor(p["W_1"].astype(np.float64)),
                    to.tensor(p["b_1"].astype(np.float64)))
    assume(float(pre.abs().min()) > KINK_MARGIN)
    dy = upstream(rng, (B, T, H), dtype)
    names = ("x", "W_1", "b_1", "W_2", "b_2" if b_2 else None)

    def check(grads):
        if not b_2:
            assert grads[4] is None, ("ffn_backward: expected db_2 None without b_2, got "
                                      f"{type(grads[4]).__name__}")

    return against_torch(impl, part, dtype, "ffn",
                         (x, *(p[n] for n in ("W_1", "b_1", "W_2", "b_2"))), to.ffn,
                         dict(x=x, **p), dy, names, check=check)


def block_params(rng, H, I, dtype, attn_bias, norm="post"):
    p = {f"attn.{n}": gaussian(rng, (H, H), dtype, 1.0 / np.sqrt(H)) for n in ATTN[:4]}
    if attn_bias:
        p.update({f"attn.{n}": gaussian(rng, (H,), dtype, 0.5) for n in ATTN[4:]})
    for ln in ("ln1", "ln2") + (("ln_f",) if norm == "pre_final" else ()):
        p[f"{ln}.gamma"] = (1.0 + 0.5 * rng.standard_normal(H)).astype(dtype)
        p[f"{ln}.beta"] = gaussian(rng, (H,), dtype, 0.5)
    p.update({f"ffn.{k}": v for k, v in ffn_params(rng, H, I, dtype).items()})
    return p


def _block_needs(kw):
    return {"block.norm": "post", "block.causal": False,
            **({"attention_bias": True} if kw["attn_bias"] else {}),
            **({"key_mask": True} if kw["masked"] else {})}


_BLOCK_GIVEN = dict(B=st.integers(1, 3), T=st.integers(1, 5), A=st.integers(1, 2),
                    d_k=st.integers(1, 3), I=st.integers(1, 8), eps=layernorm_eps(),
                    seed=seeds, data=st.data())
_POST = ("block.preln", "block.preln_backward")
_PRE = ("block.postln", "block.backward")
_VARIANT = {"attn_bias": None, "masked": None}


@oracle("block_preln", ("block",), dict(dtype=DTYPE_AXIS), _BLOCK_GIVEN,
        needs={"block.norm": "pre"}, omit=_PRE, fixed={"norm": "pre", **_VARIANT})
@oracle("block_preln_final", ("block",), dict(dtype=DTYPE_AXIS), _BLOCK_GIVEN,
        needs={"block.norm": "pre_final"}, omit=_PRE, fixed={"norm": "pre_final", **_VARIANT})
@oracle("block_causal", ("block",), dict(dtype=DTYPE_AXIS), _BLOCK_GIVEN,
        needs={"block.causal": True}, omit=_POST, fixed={"causal": True, **_VARIANT})
# the key mask is an axis, decided before anything is drawn: an implementation without key
# masks gets n/a for the masked cases only (it used to draw masked inside Hypothesis, and skip
# the whole check on the first masked example: 0, 1 or 2 of 4 cases ran, by chance)
@oracle("block", ("block",), dict(dtype=DTYPE_AXIS,
             attn_bias=[("bias", True), ("nobias", False)],
             masked=[("nomask", False), ("mask", True)]), _BLOCK_GIVEN,
        needs=_block_needs, omit=_POST)
def block(impl, part, dtype, attn_bias, masked, B, T, A, d_k, I, eps, seed, data, norm=None,
          causal=None):
    """The variants (``norm`` pre / pre_final, ``causal``) take the biases, key mask, norm and
    causality the implementation declares where not fixed (None)."""
    fixed = {k: v for k, v in (("norm", norm), ("causal", causal)) if v is not None}
    v = variant(impl, "block", *(f"block.{k}" for k in ("norm", "causal") if k not in fixed),
                *_FOLLOW, **fixed)
    attn_bias = v["bias"] if attn_bias is None else attn_bias
    masked = v["masked"] if masked is None else masked
    norm, causal = v["norm"], v["causal"]
    H = A * d_k
    # H = 1: a LayerNorm row is constant (output beta); H = 2: x_hat = +-1, so every
    # gradient through a LayerNorm is exactly 0 and float32 has only rounding noise to compare
    assume(H >= 3 or (H == 2 and dtype == np.float64))
    x = data.draw(values((B, T, H))).astype(dtype)
    mask = padding_mask(data, B, T) if masked else None
    if mask is not None and causal:
        mask[:, 0] = True  # the first query attends key 0 alone
    rng = np.random.default_rng(seed)
    if norm != "post":  # x enters LN1 itself: Gaussian rows (Hypothesis's are often constant)
        x = gaussian(rng, (B, T, H), dtype)
    p = block_params(rng, H, I, dtype, attn_bias, norm)
    kw = {**({"norm": norm} if norm != "post" else {}), **({"causal": True} if causal else {})}
    t_mask = None if mask is None else to.tensor(mask)
    # keep every ReLU pre-activation off its kink and every LayerNorm row from being ~constant
    with to.watch_blocks(H, A, I, eps, norm_first=norm != "post") as stats:
        t_final = to.block(to.tensor(x.astype(np.float64)),
                           {k: to.tensor(v.astype(np.float64)) for k, v in p.items()},
                           n_heads=A, mask=t_mask, eps=eps, **{**kw, "norm": "pre"}
                           if norm == "pre_final" else kw)
    assume(min(stats["relu"]) > KINK_MARGIN and min(stats["ln_std"]) > LN_MIN_STD)
    if norm == "pre_final":  # the final LayerNorm's input rows, too
        assume(float(t_final.std(dim=-1, unbiased=False).min()) > LN_MIN_STD)
    dy = upstream(rng, (B, T, H), dtype)
    out, cache = impl.block_forward(x, p, n_heads=A, mask=mask, eps=eps, **kw)

    def torch_block(x, **flat):
        return to.block(x, flat, n_heads=A, mask=t_mask, eps=eps, **kw)

    t_out, t_grads = to.vjp(torch_block, dict(x=x, **p), dy, ("x",) + tuple(p))
    s_in = to.inputs_scale(dict(x=x, **p), dy)
    names = ("x",) + tuple(sorted(p))
    label = f"block[A={A}, d_k={d_k}" + "".join(f", {k}={v}" for k, v in kw.items()) + "]"
    if part == "forward":
        return compare_forward(label, out, t_out, dtype, s_in)
    dx, grads = impl.block_backward(dy, cache)
    assert sorted(grads) == sorted(p), (f"block_backward: grads keys {sorted(grads)} differ "
                                        f"from the params' {sorted(p)}")
    compare(part, label, out, (dx,) + tuple(grads[n] for n in names[1:]),
            t_out, t_grads, names, dtype, s_in)


# --------------------------------------------------------------------------- pooler
@oracle("pooler", ("pooler", "tanh"), dict(dtype=DTYPE_AXIS,
             bias=[("bias", True), ("nobias", False)]),
        dict(B=side, T=side, H=side, seed=seeds, data=st.data()))
def pooler(impl, part, dtype, bias, B, T, H, seed, data):
    h = data.draw(values((B, T, H))).astype(dtype)
    return _weight_bias(impl, part, dtype, "pooler", "h", h, H, H, (B,), bias, seed)


# --------------------------------------------------------------------------- losses
_CE_PROBS = ("probs", "probs_dp", "probs_dlogits")


@oracle("cross_entropy", ("cross_entropy",), dict(dtype=DTYPE_AXIS,
             reduction=["mean", "sum"]),
        dict(lead=st.lists(side, min_size=1, max_size=2), V=st.integers(1, 8), seed=seeds,
             data=st.data()), needs={"cross_entropy.ignore_index": True}, omit=_CE_PROBS)
def cross_entropy(impl, part, dtype, reduction, lead, V, seed, data):
    shape = tuple(lead)
    logits = data.draw(values(shape + (V,), -6.0, 6.0)).astype(dtype)
    labels = data.draw(hnp.arrays(np.int64, shape, elements=st.integers(-1, V - 1)))
    # ignored positions: about 1 in V + 1, marked -100 (the default) or -1 (an ignore_index
    # a loss that masks with the default would score)
    ignore_index = data.draw(st.sampled_from([IGNORE_INDEX, -1]), label="ignore_index")
    labels[labels < 0] = ignore_index
    if reduction == "mean":  # the mean over zero predicted positions is undefined
        labels.flat[data.draw(st.integers(0, labels.size - 1))] = data.draw(
            st.integers(0, V - 1))
    dloss = upstream(np.random.default_rng(seed), (), dtype)
    out, cache = impl.cross_entropy_forward(logits, labels, ignore_index=ignore_index,
                                            reduction=reduction)
    t_out, t_grads = to.vjp(to.cross_entropy,
                            dict(logits=logits, labels=labels, reduction=reduction,
                                 ignore_index=ignore_index), dloss,
                            ("logits",))
    s_in = to.inputs_scale(dict(logits=logits, labels=labels, reduction=reduction,
                                 ignore_index=ignore_index), dloss)
    # a declared loss guard (spec/protocol/guards.py): torch's loss plus the guard's exact
    # shift, and dlogits within |guarded - unguarded gradient|
    shift, allow, _ = cross_entropy_adjustment(declared(impl), logits, labels, ignore_index,
                                               reduction, dloss)
    if part == "forward":
        return compare_forward(f"cross_entropy[{reduction}]", out, t_out + shift, dtype,
                               s_in)
    grads = impl.cross_entropy_backward(dloss, cache)
    compare(part, f"cross_entropy[{reduction}]", out, grads, t_out, t_grads, ("logits",), dtype,
            s_in, allowance=allow)


@oracle("cross_entropy_gathered", ("cross_entropy",), dict(dtype=DTYPE_AXIS,
             reduction=["mean", "sum"], layout=[("rows", "rows"), ("batch", "batch")]),
        dict(N=st.integers(1, 6), V=st.integers(1, 8), seed=seeds, data=st.data()),
        omit=_CE_PROBS)
def cross_entropy_gathered(impl, part, dtype, reduction, layout, N, V, seed, data):
    """The predicted rows gathered, every label predicted and no ignore_index passed, in both
    layouts a loss without ignore_index is handed: [N, V] ("rows") and [1, N, V] ("batch"):
    a loss dividing by shape[0] is right in one and wrong in the other."""
    lead = (N,) if layout == "rows" else (1, N)
    logits = data.draw(values(lead + (V,), -6.0, 6.0)).astype(dtype)
    labels = data.draw(hnp.arrays(np.int64, lead, elements=st.integers(0, V - 1)))
    dloss = upstream(np.random.default_rng(seed), (), dtype)
    out, cache = impl.cross_entropy_forward(logits, labels, reduction=reduction)
    t_out, t_grads = to.vjp(to.cross_entropy, dict(logits=logits, labels=labels,
                                                   reduction=reduction), dloss, ("logits",))
    s_in = to.inputs_scale(dict(logits=logits), dloss)
    what = f"cross_entropy[{reduction}, {layout} {list(logits.shape)}]"
    # a declared loss guard, as in the standard check (spec/protocol/guards.py); no label is ignored
    shift, allow, _ = cross_entropy_adjustment(declared(impl), logits, labels, IGNORE_INDEX,
                                               reduction, dloss)
    if part == "forward":
        return compare_forward(what, out, t_out + shift, dtype, s_in)
    grads = impl.cross_entropy_backward(dloss, cache)
    compare(part, what, out, grads, t_out, t_grads, ("logits",), dtype, s_in, allowance=allow)


_CE_PROBS_GIVEN = dict(lead=st.lists(side, min_size=1, max_size=2), V=st.integers(1, 8),
                       seed=seeds, data=st.data())


@oracle("cross_entropy_probs", ("cross_entropy",), dict(dtype=DTYPE_AXIS,
             reduction=["mean", "sum"]), _CE_PROBS_GIVEN,
        needs={"cross_entropy.input": "probabilities"},
        omit=("mean", "sum", "probs_dlogits"), fixed={"form": "probabilities"})
@oracle("cross_entropy_probs_dlogits", ("cross_entropy",), dict(dtype=DTYPE_AXIS,
             reduction=["mean", "sum"]), _CE_PROBS_GIVEN,
        needs={"cross_entropy.input": "probabilities_dlogits"},
        omit=("mean", "sum", "probs_dp"), fixed={"form": "probabilities_dlogits"})
def cross_entropy_probs(impl, part, dtype, reduction, form, lead, V, seed, data):
    """The loss on probabilities alone: p = softmax(z) in, compared with F.nll_loss(log p);
    the backward with torch's dL/dp ("probabilities") or, for the composed form, with torch's
    gradient of F.cross_entropy w.r.t. logits log p (softmax(log p) = p): p - onehot."""
    shape = tuple(lead)
    ignoring = variant(impl, "cross_entropy", "cross_entropy.ignore_index")["ignore_index"]
    z = data.draw(values(shape + (V,), -3.0, 3.0))
    p = np.exp(z - z.max(axis=-1, keepdims=True))
    p = (p / p.sum(axis=-1, keepdims=True)).astype(dtype)
    labels = (data.draw(ce_labels(shape, V), label="labels") if ignoring else
              data.draw(hnp.arrays(np.int64, shape, elements=st.integers(0, V - 1))))
    dloss = upstream(np.random.default_rng(seed), (), dtype)
    out, cache = impl.cross_entropy_forward(p, labels, reduction=reduction, input=form)
    if form == "probabilities":
        t_out, t_grads = to.vjp(to.cross_entropy_of_probabilities,
                                dict(p=p, labels=labels, reduction=reduction), dloss, ("p",))
    else:  # torch's logit gradient at logits log p
        t_out, t_grads = to.vjp(to.cross_entropy, dict(logits=np.log(p), labels=labels,
                                                       reduction=reduction), dloss, ("logits",))
        t_grads = {"p": t_grads["logits"]}
    s_in = to.inputs_scale(dict(p=p), dloss)
    what = f"cross_entropy[{reduction}, input={form}]"
    if part == "forward":
        return compare_forward(what, out, t_out, dtype, s_in)
    grads = impl.cross_entropy_backward(dloss, cache)
    compare(part, what, out, grads, t_out, t_grads, ("p",), dtype, s_in)


def _torch_linear_cross_entropy(x, W, b, labels, *, ignore_index, reduction):
    """F.linear then F.cross_entropy: the fused op's unfused torch counterpart."""
    return to.cross_entropy(to.linear(x, W, b), labels, ignore_index=ignore_index,
                            reduction=reduction)


@oracle("linear_cross_entropy", ("linear_cross_entropy",),
        dict(dtype=DTYPE_AXIS, reduction=["mean", "sum"],
             bias=[("bias", True), ("nobias", False)]),
        dict(lead=st.lists(side, min_size=1, max_size=2), n_in=side, V=st.integers(1, 8),
             seed=seeds, data=st.data()))
def linear_cross_entropy(impl, part, dtype, reduction, bias, lead, n_in, V, seed, data):
    shape = tuple(lead)
    x = data.draw(values(shape + (n_in,))).astype(dtype)
    # ignored positions marked -100 (the default) or -1 (an ignore_index a loss that masks with
    # the default would score); at least one predicted position (the mean needs it)
    ignore_index = data.draw(st.sampled_from([IGNORE_INDEX, -1]), label="ignore_index")
    labels = data.draw(ce_labels(shape, V, ignore_index), label="labels")
    rng = np.random.default_rng(seed)
    W = gaussian(rng, (n_in, V), dtype)
    b = gaussian(rng, (V,), dtype) if bias else None
    dloss = upstream(rng, (), dtype)
    out, cache = impl.linear_cross_entropy_forward(x, W, b, labels, ignore_index=ignore_index,
                                                   reduction=reduction)
    wrt = ("x", "W", "b") if bias else ("x", "W")
    t_out, t_grads = to.vjp(_torch_linear_cross_entropy,
                            dict(x=x, W=W, b=b, labels=labels, ignore_index=ignore_index,
                                 reduction=reduction), dloss, wrt)
    s_in = to.inputs_scale(x, W, b, dloss)
    if part == "forward":
        return compare_forward(f"linear_cross_entropy[{reduction}]", out, t_out, dtype, s_in)
    grads = impl.linear_cross_entropy_backward(dloss, cache)
    if not bias:
        assert grads[2] is None, "linear_cross_entropy_backward: expected db None without a bias"
    compare(part, f"linear_cross_entropy[{reduction}]", out, grads, t_out, t_grads,
            ("x", "W", "b" if bias else None), dtype, s_in)


@oracle("mse", ("mse",), dict(dtype=DTYPE_AXIS),
        dict(shape=st.lists(side, min_size=1, max_size=3), seed=seeds, data=st.data()))
def mse(impl, part, dtype, shape, seed, data):
    y_hat = data.draw(values(tuple(shape))).astype(dtype)
    y = data.draw(values(tuple(shape))).astype(dtype)
    dloss = upstream(np.random.default_rng(seed), (), dtype)
    return against_torch(impl, part, dtype, "mse", (y_hat, y), to.mse, dict(y_hat=y_hat, y=y),
                         dloss, ("y_hat", "y"))


# --------------------------------------------------------------------------- BERT ops
@oracle("gelu", ("gelu",), dict(dtype=DTYPE_AXIS,
             approximate=["none", "tanh"]),
        dict(shape=st.lists(side, min_size=1, max_size=3), seed=seeds, data=st.data()))
def gelu(impl, part, dtype, approximate, shape, seed, data):
    x = data.draw(values(tuple(shape), -6.0, 6.0)).astype(dtype)
    dy = upstream(np.random.default_rng(seed), tuple(shape), dtype)
    out, cache = impl.gelu_forward(x, approximate)
    t_out, t_grads = to.vjp(to.gelu, dict(x=x.astype(np.float64), approximate=approximate),
                            dy.astype(np.float64), ("x",))
    s_in = to.inputs_scale(x, dy)
    t_out, t_grads = t_out.astype(dtype), {k: v.astype(dtype) for k, v in t_grads.items()}
    if part == "forward":
        return compare_forward(f"gelu[{approximate}]", out, t_out, dtype, s_in)
    grads = impl.gelu_backward(dy, cache)
    # The oracle is torch in float64 on the same (float32-rounded) inputs, cast back: torch's
    # own float32 GELU forms 1 + erf(x / sqrt 2) in float32, which cancels for x << 0 (relative
    # error ~ u / Phi(x), 3e-4 at x = -4), where the reference evaluates Phi in float64 -- on a
    # tensor whose entries are all that small, torch float32 is the inaccurate side.
    compare(part, f"gelu[{approximate}]", out, grads, t_out, t_grads, ("x",), dtype, s_in)


@oracle("token_type", ("token_type",), dict(dtype=DTYPE_AXIS),
        dict(B=side, T=side, n_types=st.integers(1, 3), H=side, seed=seeds, data=st.data()))
def token_type(impl, part, dtype, B, T, n_types, H, seed, data):
    type_ids = data.draw(hnp.arrays(np.int64, (B, T), elements=st.integers(0, n_types - 1)))
    x = data.draw(values((B, T, H))).astype(dtype)
    rng = np.random.default_rng(seed)
    W_type = gaussian(rng, (n_types, H), dtype)
    dout = upstream(rng, (B, T, H), dtype)
    return against_torch(impl, part, dtype, "token_type_embedding", (x, type_ids, W_type),
                         to.token_type, dict(x=x, type_ids=type_ids, W_type=W_type), dout,
                         ("x", "W_type"), label="token_type")


@oracle("embedding_ln", ("embedding_ln",), dict(dtype=DTYPE_AXIS),
        dict(B=side, T=side, V=st.integers(1, 6), n_types=st.integers(1, 3), H=st.integers(3, 6),
             eps=st.sampled_from([1e-12, 1e-5]), seed=seeds, data=st.data()))
def embedding_ln(impl, part, dtype, B, T, V, n_types, H, eps, seed, data):
    ids = data.draw(hnp.arrays(np.int64, (B, T), elements=st.integers(0, V - 1)))
    type_ids = data.draw(hnp.arrays(np.int64, (B, T), elements=st.integers(0, n_types - 1)))
    rng = np.random.default_rng(seed)
    p = {"W_word": gaussian(rng, (V, H), dtype), "W_pos": gaussian(rng, (T + 1, H), dtype),
         "W_type": gaussian(rng, (n_types, H), dtype),
         "gamma": (1.0 + 0.5 * rng.standard_normal(H)).astype(dtype),
         "beta": gaussian(rng, (H,), dtype, 0.5)}
    e = p["W_word"][ids] + p["W_pos"][:T] + p["W_type"][type_ids]
    assume(np.all(e.astype(np.float64).std(axis=-1) > LN_MIN_STD))
    dy = upstream(rng, (B, T, H), dtype)
    names = ("W_word", "W_pos", "W_type", "gamma", "beta")
    return against_torch(impl, part, dtype, "embedding_ln",
                         (ids, type_ids, *(p[n] for n in names), eps), to.embedding_ln,
                         dict(ids=ids, type_ids=type_ids, **p, eps=eps), dy, names)


@oracle("mlm_head", ("mlm_head", "gelu"), dict(dtype=DTYPE_AXIS,
             activation=["gelu", "gelu_tanh"]),
        dict(lead=st.lists(side, min_size=1, max_size=2), H=st.integers(3, 6), V=st.integers(1, 8),
             seed=seeds, data=st.data()))
def mlm_head(impl, part, dtype, activation, lead, H, V, seed, data):
    h = data.draw(values(tuple(lead) + (H,))).astype(dtype)
    rng = np.random.default_rng(seed)
    p = {"W_t": gaussian(rng, (H, H), dtype, 1.0 / np.sqrt(H)),
         "b_t": gaussian(rng, (H,), dtype, 0.5),
         "gamma": (1.0 + 0.5 * rng.standard_normal(H)).astype(dtype),
         "beta": gaussian(rng, (H,), dtype, 0.5), "W_word": gaussian(rng, (V, H), dtype),
         "b_dec": gaussian(rng, (V,), dtype, 0.5)}
    # the head's LayerNorm rows must not be ~constant (computed in torch, float64)
    a = to.gelu(to.linear(to.tensor(h.astype(np.float64)), to.tensor(p["W_t"].astype(np.float64)),
                          to.tensor(p["b_t"].astype(np.float64))))
    assume(float(a.std(dim=-1, unbiased=False).min()) > LN_MIN_STD)
    dl = upstream(rng, tuple(lead) + (V,), dtype)
    names = ("h", "W_t", "b_t", "gamma", "beta", "W_word", "b_dec")
    return against_torch(impl, part, dtype, "mlm_head", (h, *(p[n] for n in names[1:])),
                         lambda **kw: to.mlm_head(**kw, activation=activation),
                         dict(h=h, **p), dl, names, label=f"mlm_head[{activation}]",
                         kwargs=dict(activation=activation))


@oracle("classifier", ("classifier", "pooler"), dict(dtype=DTYPE_AXIS),
        dict(B=side, T=side, H=side, C=st.integers(1, 4), seed=seeds, data=st.data()))
def classifier(impl, part, dtype, B, T, H, C, seed, data):
    h = data.draw(values((B, T, H))).astype(dtype)
    rng = np.random.default_rng(seed)
    p = {"W_p": gaussian(rng, (H, H), dtype), "b_p": gaussian(rng, (H,), dtype),
         "W_c": gaussian(rng, (H, C), dtype), "b_c": gaussian(rng, (C,), dtype)}
    dl = upstream(rng, (B, C), dtype)
    names = ("h", "W_p", "b_p", "W_c", "b_c")
    return against_torch(impl, part, dtype, "classifier", (h, *(p[n] for n in names[1:])),
                         to.classifier, dict(h=h, **p), dl, names)
