"""Identities every correct implementation satisfies, each written once (NumPy only).

One function per identity family, ``f(impl, <inputs>) -> list[Finding]``, in the manner of
JAX's ``check_grads``: a library function that callers feed inputs.  The judging suite's checks
(spec/suite/checks/invariants.py and friends) call them on the cases of a case family -- its
fixed-seed cases first, then Hypothesis's -- and assert with :func:`require`.  Every comparison
uses the one tolerance of its identity from :mod:`minibert_spec.tolerances`; exact identities (a
masked entry, an ignored position, an unused row) are compared with ``==``.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, replace

import numpy as np

from minibert_spec.protocol import IGNORE_INDEX, capabilities
from minibert_spec.protocol.capabilities import ConventionWarning
from minibert_spec.protocol.guards import (
    adam_denominator,
    declare_hint,
    declared_on,
    loss_floor,
    mean_divisor,
    softmax_adjustment,
    softmax_terms,
)
from minibert_spec.protocol.variants import fixed_eps_hint
from minibert_spec.tolerances import F64_IDENTITY_RTOL


@dataclass(frozen=True)
class Finding:
    op: str
    name: str
    ok: bool
    detail: str = ""
    # a documented convention the implementation follows (lr(0) = 0, a float64 loss, a divisor
    # guard): ok, reported with the number it changes, never a failure
    convention: bool = False


def require(findings: list[Finding]) -> None:
    """Raise AssertionError listing every identity that does not hold; warn
    (:class:`ConventionWarning`) for each convention the implementation follows."""
    import warnings

    failed = [f for f in findings if not f.ok]
    if failed:
        raise AssertionError("; ".join(f"{f.op}: {f.name}" + (f" ({f.detail})" if f.detail
                                                                   else "") for f in failed))
    for f in findings:
        if f.convention:
            warnings.warn(ConventionWarning(f"{f.op}: {f.name}: {f.detail}"), stacklevel=2)


# --------------------------------------------------------------------------- comparisons
def _mag(*arrays) -> float:
    return max((float(np.max(np.abs(np.asarray(a, dtype=np.float64)), initial=0.0))
                for a in arrays), default=0.0)


def close(op: str, name: str, got, want, scale: float = 0.0,
          rtol: float = F64_IDENTITY_RTOL) -> Finding:
    """|got - want| <= rtol * max(max|want|, max|got|, scale), entry by entry.

    Relative to the magnitude of the whole tensor (``scale``: of the terms that cancelled into
    it), not entry by entry: an entry's rounding error is ~u times the magnitudes summed into
    it, not times its own value (spec/suite/torch_oracle.allowed_error gives the same rule).
    A failure names the worst index and both values (minibert_spec.numerics.asserts.worst)."""
    from minibert_spec.numerics.asserts import worst

    a = np.asarray(got, dtype=np.float64)
    b = np.asarray(want, dtype=np.float64)
    if a.shape != b.shape:
        return Finding(op, name, False, f"shapes {a.shape} vs {b.shape}")
    err = _mag(a - b)
    bound = rtol * max(_mag(a), _mag(b), scale)
    ok = err <= bound  # NaN fails
    return Finding(op, name, bool(ok), "" if ok else worst(a, b, bound, got_name="got",
                                                           want_name="expected"))


def holds(op: str, name: str, condition, detail: str = "") -> Finding:
    """``condition`` holds everywhere; a failure says where first (an array's index) and how
    often, after ``detail``."""
    ok = bool(np.all(condition))
    if ok:
        return Finding(op, name, True)
    c = np.asarray(condition)
    if c.ndim:
        bad = np.argwhere(~c.astype(bool))
        where = (f"first at index {tuple(int(i) for i in bad[0])}, {len(bad)} of {c.size} "
                 "entries")
        detail = f"{detail}; {where}" if detail else where
    return Finding(op, name, False, detail or "does not hold")


def exact(op: str, name: str, got, want) -> Finding:
    """``got == want`` entry by entry (an identity that holds exactly: a masked entry, an
    ignored position); a failure names the worst index and both values."""
    from minibert_spec.numerics.asserts import worst

    a = np.asarray(got, dtype=np.float64)
    b = np.broadcast_to(np.asarray(want, dtype=np.float64), a.shape)
    ok = bool(np.all(a == b))
    return Finding(op, name, ok, "" if ok else worst(a, b, 0.0))


def _to32(v):
    if isinstance(v, np.ndarray) and v.dtype == np.float64:
        return v.astype(np.float32)
    if isinstance(v, dict):
        return {k: _to32(x) for k, x in v.items()}
    return v


def _snapshot(values) -> list:
    """Bit patterns of every array in ``values`` (nested dicts / tuples / lists)."""
    if isinstance(values, np.ndarray):
        return [(values.dtype, values.shape, values.tobytes())]
    if isinstance(values, dict):
        return [x for k in values for x in _snapshot(values[k])]
    if isinstance(values, (tuple, list)):
        return [x for v in values for x in _snapshot(v)]
    return []


def _mutated(before: list, values) -> bool:
    return _snapshot(values) != before


# --------------------------------------------------------------------------- embeddings
def embedding_scatter_adds(impl, ids, W, dout) -> list[Finding]:
    """Rows are W[ids]; dW[v] accumulates dout of every position holding id v (repeated ids
    included); rows of ids that never occur get exactly 0."""
    out, cache = impl.embedding_forward(ids, W)
    (dW,) = impl.embedding_backward(dout, cache)
    expected = np.zeros(W.shape)
    np.add.at(expected, np.asarray(ids), dout)
    unused = np.setdiff1d(np.arange(W.shape[0]), ids)
    return [close("embedding", "rows are W[ids]", out, W[ids]),
            close("embedding", "dW sums dout over repeated ids", dW, expected, _mag(dout)),
            holds("embedding", "rows of unused ids are exactly 0", dW[unused] == 0)]


def position_embedding_identities(impl, x, W_pos, dout) -> list[Finding]:
    """dx = dout; dW_pos[t] = sum_b dout[b, t]; positions >= T never enter: exactly 0."""
    T = x.shape[1]
    _, cache = impl.position_embedding_forward(x, W_pos)
    dx, dW = impl.position_embedding_backward(dout, cache)
    return [close("position_embedding", "dx equals dout", dx, dout),
            close("position_embedding", "dW_pos[:T] sums dout over the batch", dW[:T],
                  dout.sum(0)),
            holds("position_embedding", "positions beyond T get exactly 0", dW[T:] == 0)]


def sinusoidal_identities(impl, x) -> list[Finding]:
    """The table at position 0 is sin(0)=0 / cos(0)=1, feature 0 is sin(position), values in
    [-1, 1], and the forward adds it."""
    op, (_, T, d) = "sinusoidal_position", x.shape
    pe = np.asarray(impl.sinusoidal_encoding(T, d, np.float64))
    if pe.shape != (T, d):
        return [holds(op, "shape [T, d]", False, f"got {pe.shape}")]
    out, _ = impl.sinusoidal_position_forward(x)
    return [close(op, "position 0: 0 on even features, 1 on odd", pe[0], np.arange(d) % 2, 1.0),
            close(op, "feature 0 is sin(position)", pe[:, 0], np.sin(np.arange(T)), 1.0),
            holds(op, "values in [-1, 1]", np.abs(pe) <= 1.0),
            close(op, "forward adds the table", out - x, np.broadcast_to(pe, x.shape),
                  _mag(x))]


# --------------------------------------------------------------------------- linear / LN
def linear_identities(impl, x, W, b, dout) -> list[Finding]:
    """x W + b, and db is None without a bias."""
    out, _ = impl.linear_forward(x, W, b)
    grads = impl.linear_backward(dout, impl.linear_forward(x, W, None)[1])
    return [close("linear", "forward is x @ W + b", out, x @ W + b, _mag(x @ W)),
            holds("linear", "db is None without a bias", len(grads) == 3 and grads[2] is None)]


def layernorm_normalises(impl, x, gamma, beta, scale: float, shift: float) -> list[Finding]:
    """With eps = 0: x_hat = (y - beta) / gamma has mean 0 and (biased) variance 1 per row, and
    LN(c x + s) = LN(x) for c > 0 (rows of x must not be constant)."""
    y, _ = impl.layernorm_forward(x, gamma, beta, 0.0)
    x_hat = y if gamma is None else (y - beta) / gamma  # no affine map: y is x_hat
    y2, _ = impl.layernorm_forward(scale * x + shift, gamma, beta, 0.0)
    unit = close("layernorm", "x_hat has (biased) variance 1 per row", x_hat.var(-1),
                 np.ones(x.shape[:-1]))
    if not unit.ok:  # var / (var + c) on every row: eps ignored, a constant of the code's own?
        unit = replace(unit, detail=unit.detail + fixed_eps_hint(x.var(-1), x_hat.var(-1)))
    return [close("layernorm", "x_hat has mean 0 per row", x_hat.mean(-1),
                  np.zeros(x.shape[:-1]), _mag(x_hat)),
            unit,
            close("layernorm", "invariant to c x + s per row", y2, y)]


def layernorm_backward_invariances(impl, x, gamma, beta, dy) -> list[Finding]:
    """With eps = 0, LN is invariant to x + s and c x per row, so dx sums to 0 and is orthogonal
    to x - mean(x) per row."""
    _, cache = impl.layernorm_forward(x, gamma, beta, 0.0)
    dx, _, _ = impl.layernorm_backward(dy, cache)
    centred = x - x.mean(-1, keepdims=True)
    std = np.sqrt(x.var(-1, keepdims=True))
    # the terms summed into dx are ~ gamma dy / std (dx itself may be 0 by cancellation: N = 2)
    terms = _mag((dy if gamma is None else gamma * dy) / std) * x.shape[-1]
    return [close("layernorm", "dx sums to 0 per row (shift invariance)", dx.sum(-1),
                  np.zeros(x.shape[:-1]), terms * x.shape[-1]),
            close("layernorm", "dx is orthogonal to x - mean (scale invariance)",
                  (dx * centred).sum(-1), np.zeros(x.shape[:-1]),
                  terms * _mag(centred) * x.shape[-1])]


# --------------------------------------------------------------------------- softmax
def softmax_identities(impl, x, mask, dout) -> list[Finding]:
    """Rows sum to 1; masked entries get probability and gradient exactly 0, the others > 0;
    dx sums to 0 per row (softmax is shift-invariant)."""
    p, cache = impl.softmax_forward(x, mask)
    (dx,) = impl.softmax_backward(dout, cache)
    keep = np.ones(x.shape, bool) if mask is None else np.asarray(mask, bool)
    # a declared softmax_eps: rows sum to s / (s + eps), s the kept entries' sum of e (the
    # guarded formula, spec/protocol/guards.softmax_adjustment)
    guards = declared_on("softmax", capabilities(impl)["guards"])
    total, allow = np.ones(x.shape[:-1]), 0.0
    if guards:  # the sums move by the guard's shift; dx's by at most its allowance
        shift, allow, _ = softmax_adjustment(guards, x, mask, dout)
        total, allow = total + shift.sum(-1), float(np.max(allow.sum(-1)))
    sums = close("softmax", "rows sum to 1" if not guards else "rows sum to s / (s + "
                 f"softmax_eps) (declared guard {guards['softmax_eps']:g})", p.sum(-1), total)
    if not sums.ok and not guards:  # a divisor guard? e / (s + eps) sums to s / (s + eps)
        s = softmax_terms(x, mask)[3][..., 0]
        sums = replace(sums, detail=sums.detail + declare_hint("softmax_eps", float(np.median(
            s / np.asarray(p.sum(-1), dtype=np.float64) - s))))
    return [sums,
            holds("softmax", "masked entries get probability exactly 0", p[~keep] == 0),
            holds("softmax", "kept entries get probability > 0", p[keep] > 0),
            close("softmax", "dx sums to 0 per row", np.sign(dx.sum(-1)) * np.maximum(
                np.abs(dx.sum(-1)) - allow, 0.0), np.zeros(x.shape[:-1]),
                  _mag(p) * _mag(dout) * x.shape[-1]),
            holds("softmax", "masked entries get gradient exactly 0", dx[~keep] == 0)]


def softmax_shift_invariant(impl, x, mask, shift: float) -> list[Finding]:
    """softmax(x + s) = softmax(x), also for |s| ~ 1000 where exp over/underflows unless the
    row maximum is subtracted; x + s rounds x by half an ulp of |s| (~1e-13 at 1000)."""
    p, _ = impl.softmax_forward(x, mask)
    p_s, _ = impl.softmax_forward(x + shift, mask)
    return [holds("softmax", f"softmax(x + {shift:g}) is finite", np.isfinite(p_s)),
            close("softmax", f"softmax(x + {shift:g}) = softmax(x)", p_s, p, 1.0)]


def softmax_jacobian_identities(impl, p) -> list[Finding]:
    """diag(p) - p p^T: symmetric, columns sum to 0, diagonal p (1 - p)."""
    op, J = "softmax_jacobian", np.asarray(impl.softmax_jacobian(p))
    n = p.shape[-1]
    if J.shape != p.shape + (n,):
        return [holds(op, "shape [..., N, N]", False, f"got {J.shape}")]
    return [close(op, "every column sums to 0", J.sum(-2), np.zeros(p.shape), _mag(J) * n),
            close(op, "symmetric", J, np.swapaxes(J, -1, -2)),
            close(op, "diagonal is p (1 - p)", np.diagonal(J, axis1=-2, axis2=-1), p * (1 - p))]


# --------------------------------------------------------------------------- elementwise
def relu_identities(impl, x, dout) -> list[Finding]:
    out, cache = impl.relu_forward(x)
    (dx,) = impl.relu_backward(dout, cache)
    return [holds("relu", "output >= 0", out >= 0),
            holds("relu", "dx is exactly 0 where x < 0", dx[x < 0] == 0)]


def tanh_identities(impl, x) -> list[Finding]:
    out, _ = impl.tanh_forward(x)
    return [holds("tanh", "|output| <= 1", np.abs(out) <= 1),
            close("tanh", "odd function", impl.tanh_forward(-x)[0], -out)]


# --------------------------------------------------------------------------- attention
def heads_identities(impl, x, y, n_heads: int) -> list[Finding]:
    """split_heads is a reshape/transpose: head a holds features a d_k:(a+1) d_k,
    merge_heads inverts it and is its adjoint (<split x, y> = <x, merge y>)."""
    op, (B, T, H) = "heads", x.shape
    d_k = H // n_heads
    s = np.asarray(impl.split_heads(x, n_heads))
    if s.shape != (B, n_heads, T, d_k):
        return [holds(op, "split_heads shape [B, A, T, d_k]", False, f"got {s.shape}")]
    a = n_heads - 1
    xc, yc = x.copy(), y.copy()
    impl.merge_heads(impl.split_heads(xc, n_heads) * 1.0)
    impl.merge_heads(yc)
    s32 = np.asarray(impl.split_heads(x.astype(np.float32), n_heads))
    m32 = np.asarray(impl.merge_heads(y.astype(np.float32)))
    lhs, rhs = np.vdot(s, y), np.vdot(x, impl.merge_heads(y))
    return [holds(op, "split_heads / merge_heads leave their inputs untouched",
                  np.array_equal(xc, x) and np.array_equal(yc, y), "modified in place"),
            holds(op, "float32 in -> float32 out", s32.dtype == m32.dtype == np.float32,
                  f"got {s32.dtype}, {m32.dtype}"),
            holds(op, "head a holds features a*d_k:(a+1)*d_k",
                  s[:, a] == x[:, :, a * d_k:(a + 1) * d_k]),
            holds(op, "merge_heads inverts split_heads", impl.merge_heads(s) == x),
            close(op, "merge_heads is the adjoint of split_heads", lhs, rhs,
                  _mag(x) * _mag(y) * x.size)]


def _attn(impl, inputs: dict, causal: bool = False, **kw):
    """The attention's output; ``causal`` passed only when True (the standard form has no
    such argument)."""
    return impl.attention_forward(*inputs.values(), **kw,
                                  **({"causal": True} if causal else {}))[0]


def attention_permutation_equivariant(impl, inputs: dict, n_heads: int, mask, perm
                                      ) -> list[Finding]:
    """Without positions, permuting the tokens (and the key mask) permutes the output."""
    y = _attn(impl, inputs, n_heads=n_heads, mask=mask)
    y_p = _attn(impl, {**inputs, "x": inputs["x"][:, perm]}, n_heads=n_heads,
                mask=None if mask is None else np.asarray(mask)[:, perm])
    return [close("attention", "permuting tokens permutes the output", y_p, y[:, perm])]


def attention_is_causal(impl, inputs: dict, n_heads: int, mask, noise) -> list[Finding]:
    """Causal attention: changing the tokens after position t leaves the outputs at positions
    <= t unchanged (no position sees a later one), for every t."""
    return _later_tokens_ignored(
        "attention", lambda x: _attn(impl, {**inputs, "x": x}, causal=True, n_heads=n_heads,
                                     mask=mask), inputs["x"], noise)


def _later_tokens_ignored(op: str, forward, x, noise) -> list[Finding]:
    """``forward(x)`` (outputs [B, T, ...]) against ``forward`` of x with ``noise`` added after
    position t: the outputs at positions <= t unchanged, one finding per t < T - 1."""
    y = forward(x)
    found = []
    for t in range(x.shape[1] - 1):
        x2 = x.copy()
        x2[:, t + 1:] += noise[:, t + 1:]
        found.append(close(op, f"outputs at positions <= {t} ignore later tokens",
                           forward(x2)[:, :t + 1], y[:, :t + 1], _mag(y)))
    return found


def attention_ignores_key_bias(impl, inputs: dict, n_heads: int, mask, other_b_k, dout,
                               causal: bool = False) -> list[Finding]:
    """b_k adds q_i . b_k to every score of row i, which softmax ignores: the output does not
    depend on b_k, and d b_k is 0 (relative to the other gradients of the same call)."""
    y, cache = impl.attention_forward(*inputs.values(), n_heads=n_heads, mask=mask,
                                      **({"causal": True} if causal else {}))
    grads = impl.attention_backward(dout, cache)
    db_k = grads[list(inputs).index("b_k")]
    y_k = _attn(impl, {**inputs, "b_k": other_b_k}, causal, n_heads=n_heads, mask=mask)
    return [close("attention", "the output does not depend on b_k", y_k, y),
            close("attention", "db_k is 0 (softmax is shift-invariant per row)", db_k,
                  np.zeros_like(db_k), _mag(*(g for g in grads if g is not None)))]


def attention_padding_ignored(impl, inputs: dict, n_heads: int, mask, noise,
                              causal: bool = False) -> list[Finding]:
    """Changing the tokens at masked key positions leaves every output row that is not itself
    masked unchanged (a padded token is never attended to)."""
    keep = np.asarray(mask, bool)
    x2 = np.where(keep[..., None], inputs["x"], inputs["x"] + noise)
    y = _attn(impl, inputs, causal, n_heads=n_heads, mask=mask)
    y2 = _attn(impl, {**inputs, "x": x2}, causal, n_heads=n_heads, mask=mask)
    return [close("attention", "padded keys do not affect unpadded positions", y2[keep], y[keep],
                  _mag(y))]


def attention_scaled_by_sqrt_d_k(impl, inputs: dict, causal: bool = False) -> list[Finding]:
    """The scores are scaled by 1/sqrt(d_k), not 1/sqrt(H): keep only head 0's features in Q,
    K, V (head 1 then attends uniformly to zero values); that is single-head attention (d_k =
    H) whose W_q, b_q carry the factor sqrt(H / d_k) = sqrt(2).  Needs H even, two heads."""
    H = inputs["x"].shape[-1]
    head0 = np.r_[np.ones(H // 2), np.zeros(H - H // 2)]
    qkv = {n: None if inputs[n] is None else inputs[n] * head0
           for n in ("W_q", "W_k", "W_v", "b_q", "b_k", "b_v")}

    def args(c):
        return {**inputs, **qkv, "W_q": qkv["W_q"] * c,
                "b_q": None if qkv["b_q"] is None else qkv["b_q"] * c}

    return [close("attention", "scores are scaled by 1/sqrt(d_k)",
                  _attn(impl, args(1.0), causal, n_heads=2),
                  _attn(impl, args(np.sqrt(2.0)), causal, n_heads=1))]


def block_identities(impl, x, p: dict, n_heads: int, mask, dout, noise, **variant
                     ) -> list[Finding]:
    """grads are keyed like p; padded tokens do not affect the unpadded positions
    (``variant``: the block's norm= / causal= keywords, when not the standard form)."""
    out, cache = impl.block_forward(x, p, n_heads=n_heads, mask=mask, **variant)
    _, grads = impl.block_backward(dout, cache)
    keep = np.asarray(mask, bool)
    x2 = np.where(keep[..., None], x, x + noise)
    out2, _ = impl.block_forward(x2, p, n_heads=n_heads, mask=mask, **variant)
    return [holds("block", "grads has the keys of p", set(grads) == set(p),
                  f"missing {sorted(set(p) - set(grads))}, extra {sorted(set(grads) - set(p))}"),
            close("block", "padded keys do not affect unpadded positions", out2[keep], out[keep],
                  _mag(out))]


def block_is_causal(impl, x, p: dict, n_heads: int, mask, noise, **variant) -> list[Finding]:
    """A causal block: changing the tokens after position t leaves its outputs at positions
    <= t unchanged, for every t (``variant``: the block's keywords, causal=True among them)."""
    return _later_tokens_ignored(
        "block", lambda x_: impl.block_forward(x_, p, n_heads=n_heads, mask=mask, **variant)[0],
        x, noise)


def pooler_gradient_only_at_cls(impl, h, W, b, dout) -> list[Finding]:
    """Only h[:, 0] enters the pooler: dh is exactly 0 at every other position."""
    _, cache = impl.pooler_forward(h, W, b)
    dh = impl.pooler_backward(dout, cache)[0]
    return [holds("pooler", "only the first ([CLS]) token gets a gradient", dh[:, 1:] == 0)]


# --------------------------------------------------------------------------- BERT ops
def gelu_identities(impl, x, approximate: str, dout) -> list[Finding]:
    """GELU(x) - GELU(-x) = x (Phi(x) + Phi(-x) = 1, and likewise tanh's odd symmetry); the
    backward is linear in dout and its derivative at 0 is 1/2."""
    op = "gelu"
    y, _ = impl.gelu_forward(x, approximate)
    y_neg, _ = impl.gelu_forward(-x, approximate)
    _, cache = impl.gelu_forward(x, approximate)
    (dx,) = impl.gelu_backward(dout, cache)
    (dx1,) = impl.gelu_backward(np.ones_like(x), cache)
    _, c0 = impl.gelu_forward(np.zeros(3), approximate)
    (d0,) = impl.gelu_backward(np.ones(3), c0)
    return [close(op, "GELU(x) - GELU(-x) = x", y - y_neg, x),
            close(op, "backward is dout times the derivative", dx, dout * dx1, _mag(dout)),
            close(op, "derivative at 0 is 1/2", d0, np.full(3, 0.5))]


def token_type_identities(impl, x, type_ids, W_type, dout) -> list[Finding]:
    """dx = dout; dW_type[s] sums dout over the positions of segment s; unused segments 0."""
    op = "token_type"
    out, cache = impl.token_type_embedding_forward(x, type_ids, W_type)
    dx, dW = impl.token_type_embedding_backward(dout, cache)
    expected = np.zeros(W_type.shape)
    np.add.at(expected, np.asarray(type_ids), dout)
    unused = np.setdiff1d(np.arange(W_type.shape[0]), type_ids)
    return [close(op, "adds W_type[type_ids]", out - x, W_type[type_ids], _mag(x)),
            close(op, "dx equals dout", dx, dout),
            close(op, "dW_type sums dout per segment", dW, expected, _mag(dout)),
            holds(op, "unused segments get exactly 0", dW[unused] == 0)]


def embedding_ln_identities(impl, inputs: dict, ids, type_ids, dy, **eps) -> list[Finding]:
    """Every position feeds one row of each table, so the three table gradients have the same
    column sums (the total of dE); each table's rows of unused ids get exactly 0.  ``eps``: the
    case's, where it passes one (a LayerNorm eps fixed in the code)."""
    op = "embedding_ln"
    names = ("W_word", "W_pos", "W_type", "gamma", "beta")
    _, cache = impl.embedding_ln_forward(ids, type_ids, *(inputs[n] for n in names), **eps)
    dW, dP, dWt, _, _ = impl.embedding_ln_backward(dy, cache)
    T = ids.shape[1]
    scale = _mag(dW, dP, dWt)
    return [close(op, "dW_pos and dW_word have the same column sums", dP.sum(0), dW.sum(0),
                  scale),
            close(op, "dW_type and dW_word have the same column sums", dWt.sum(0), dW.sum(0),
                  scale),
            holds(op, "positions beyond T get exactly 0", dP[T:] == 0),
            holds(op, "unused word ids get exactly 0",
                  dW[np.setdiff1d(np.arange(dW.shape[0]), ids)] == 0)]


def classifier_gradient_only_at_cls(impl, inputs: dict, dout) -> list[Finding]:
    """Only h[:, 0] enters the pooler under the classifier: dh is exactly 0 elsewhere."""
    _, cache = impl.classifier_forward(*inputs.values())
    dh = impl.classifier_backward(dout, cache)[0]
    return [holds("classifier", "only the first ([CLS]) token gets a gradient", dh[:, 1:] == 0)]


# --------------------------------------------------------------------------- losses
def cross_entropy_identities(impl, logits, labels, dloss: float,
                             ignore_index: int = IGNORE_INDEX) -> list[Finding]:
    """loss >= 0 (>= -log(1 + eps) per position under a declared guard log(p + eps));
    sum = n * mean and d sum = n * d mean (n predicted positions); ignored
    positions get gradient exactly 0; dlogits sums to 0 per position."""
    op, n = "cross_entropy", int(np.sum(labels != ignore_index))
    ignored = labels == ignore_index
    out = {}
    for r in ("mean", "sum"):
        loss, cache = impl.cross_entropy_forward(logits, labels, reduction=r,
                                                 ignore_index=ignore_index)
        out[r] = (float(loss), impl.cross_entropy_backward(dloss, cache)[0])
    (l_mean, d_mean), (l_sum, d_sum) = out["mean"], out["sum"]
    # a declared log guard -log(p + eps) is below 0 by up to log(1 + eps) per position at p = 1;
    # a declared mean_eps divides the mean by n + mean_eps
    guards = declared_on(op, capabilities(impl)["guards"])
    floor = loss_floor(guards)
    divisor = mean_divisor(n, "mean", guards)
    found = [holds(op, "loss >= 0" if not floor else
                   f"loss >= {floor:.4g} per position (declared guard log(p + "
                   f"{guards['log_eps']:g}))",
                   l_mean >= floor and l_sum >= n * floor,
                   f"mean {l_mean!r}, sum {l_sum!r}" + ("" if floor else
                                                        "; a log(p + eps) guard? declare it: "
                                                        "CAPABILITIES['guards'] = "
                                                        "{'log_eps': eps}")),
             close(op, "sum = n * mean" if divisor == n else f"sum = (n + mean_eps) * mean "
                   f"(declared guard mean_eps={guards['mean_eps']:g})", l_sum, divisor * l_mean),
             close(op, "d sum = n * d mean" if divisor == n else "d sum = (n + mean_eps) * d mean",
                   d_sum, divisor * d_mean)]
    if not found[1].ok and "mean_eps" not in guards and l_mean:  # sum / (n + eps)?
        found[1] = replace(found[1], detail=found[1].detail
                           + declare_hint("mean_eps", l_sum / l_mean - n))
    for r, (_, d) in out.items():
        found += [exact(op, f"{r}: ignored positions get gradient exactly 0",
                        d * ignored[..., None], 0.0),
                  close(op, f"{r}: dlogits sums to 0 per position", d.sum(-1),
                        np.zeros(labels.shape), abs(dloss) * logits.shape[-1])]
    return found


def cross_entropy_shift_invariant(impl, logits, labels, shift: float,
                                  ignore_index: int = IGNORE_INDEX) -> list[Finding]:
    """log-softmax is shift-invariant: stable for logits of size 800 (exp overflows at 709)."""
    loss = impl.cross_entropy_forward(logits, labels, ignore_index=ignore_index)[0]
    return [close("cross_entropy", f"loss(logits + {shift:g}) = loss(logits)",
                  impl.cross_entropy_forward(logits + shift, labels,
                                             ignore_index=ignore_index)[0], loss, 1.0)]


def linear_cross_entropy_is_the_composition(impl, x, W, b, labels, reduction: str,
                                            dloss: float, ignore_index: int = IGNORE_INDEX
                                            ) -> list[Finding]:
    """The fused head + loss is the linear op then the cross-entropy op: the same loss, and the
    same (dx, dW, db) as cross_entropy_backward then linear_backward, to float64 rounding."""
    op = "linear_cross_entropy"
    loss, cache = impl.linear_cross_entropy_forward(x, W, b, labels, reduction=reduction,
                                                    ignore_index=ignore_index)
    grads = impl.linear_cross_entropy_backward(dloss, cache)
    logits, c_lin = impl.linear_forward(x, W, b)
    want, c_ce = impl.cross_entropy_forward(logits, labels, reduction=reduction,
                                            ignore_index=ignore_index)
    want_grads = impl.linear_backward(impl.cross_entropy_backward(dloss, c_ce)[0], c_lin)
    found = [close(op, "loss = cross_entropy(linear(x))", loss, want)]
    for name, g, w in zip(("dx", "dW", "db"), grads, want_grads):
        if w is None:
            found.append(holds(op, f"{name} is None without a bias", g is None))
        else:
            found.append(close(op, f"{name} = the composed backward's", g, w))
    return found


def mse_identities(impl, y_hat, y, dloss: float) -> list[Finding]:
    """loss >= 0, 0 at y_hat = y, symmetric; dy = -dy_hat exactly (the loss depends on y_hat -
    y only)."""
    loss, cache = impl.mse_forward(y_hat, y)
    dy_hat, dy = impl.mse_backward(dloss, cache)
    return [holds("mse", "loss >= 0", float(loss) >= 0),
            holds("mse", "loss is 0 at y_hat = y", float(impl.mse_forward(y, y.copy())[0]) == 0),
            close("mse", "symmetric in its arguments", impl.mse_forward(y, y_hat)[0], loss),
            holds("mse", "dy = -dy_hat exactly", np.asarray(dy) == -np.asarray(dy_hat))]


# --------------------------------------------------------------------------- the model
def model_gradient_bookkeeping(impl, params: dict, config, ids, kw: dict) -> list[Finding]:
    """grads has exactly the parameter keys (in order), shapes and dtypes; loss_and_grads agrees
    with loss; inputs_embeds = embed(ids) gives the same loss."""
    op = "model"
    value, grads, _ = impl.loss_and_grads(params, config, ids, **kw)
    bad = [k for k in params if k in grads and (np.shape(grads[k]) != params[k].shape
                                                or grads[k].dtype != params[k].dtype)]
    types = {k: v for k, v in kw.items() if k == "token_type_ids"}
    kw_emb = {k: v for k, v in kw.items() if k != "token_type_ids"}  # in the embeddings
    emb = impl.embed(params, config, ids, **types)
    return [holds(op, "gradient keys are the parameter keys", list(grads) == list(params),
                  f"missing {sorted(set(params) - set(grads))}, extra "
                  f"{sorted(set(grads) - set(params))}"),
            holds(op, "gradient shapes and dtypes match the parameters", not bad,
                  f"mismatch for {bad[:3]}"),
            close(op, "loss_and_grads agrees with loss", value,
                  impl.loss(params, config, ids, **kw)),
            close(op, "inputs_embeds = embed(ids) gives the same loss",
                  impl.loss(params, config, inputs_embeds=emb, **kw_emb), value)]


# --------------------------------------------------------------------------- optimizer
def adam_first_step(impl, params: dict, grads: dict, *, lr: float, beta2: float = 0.999,
                    eps: float = 1e-8) -> list[Finding]:
    """Bias correction: at t = 1, m_hat = g and v_hat = g^2, so every entry moves against its
    gradient's sign by lr |g| / (|g| + eps'), with eps' = eps, or eps / sqrt(1 - beta2) in the
    paper's "efficient" form; with eps = 0 that is exactly lr, whatever the gradient's scale."""
    new, _ = impl.adam_step(copy.deepcopy(params), grads, impl.adam_init(copy.deepcopy(params)),
                            lr=lr, beta1=0.9, beta2=beta2, eps=eps, weight_decay=0.0,
                            no_decay=())
    slack = 1 + F64_IDENTITY_RTOL
    guards = declared_on("adam", capabilities(impl)["guards"])  # a guard under the root
    found = []
    for k in params:
        step = -(new[k] - params[k]) * np.sign(grads[k])  # signed along -g
        low = lr * np.abs(grads[k]) / adam_denominator(grads[k] ** 2, eps / np.sqrt(1 - beta2),
                                                        guards)
        # p - lr u rounds by ~u |p|: that much below the bound is rounding
        ok = (step >= low / slack - F64_IDENTITY_RTOL * np.abs(params[k])) & (step <= lr * slack)
        detail = f"step / lr in [{np.min(step) / lr:.6g}, {np.max(step) / lr:.6g}]"
        if not np.all(ok):  # the worst entry: its step ratio and the ratio expected there
            ratio, want = step / lr, np.abs(grads[k]) / (np.abs(grads[k]) + eps)
            excess = np.where(ok, -np.inf, np.abs(ratio - want))
            i = np.unravel_index(int(np.argmax(np.nan_to_num(excess, nan=np.inf))), ratio.shape)
            idx = tuple(int(j) for j in i)
            detail = (f"step / lr at index {idx}: got {float(ratio[i]):.6g}, expected "
                      f"{float(want[i]):.6g} (|g| / (|g| + eps), 1 up to eps: the bias-corrected "
                      f"first step; accepted [{float(low[i] / lr):.6g}, 1]); over {k}: " + detail)
        found.append(holds("adam", f"first step moves {k} by lr |g| / (|g| + eps) along -g", ok,
                           detail))
        if not found[-1].ok and not guards:  # lr |g| / (sqrt(g^2 + c) + eps') for some c?
            with np.errstate(divide="ignore", invalid="ignore"):
                c = (lr * np.abs(grads[k]) / step - eps / np.sqrt(1 - beta2)) ** 2 - grads[k] ** 2
            found[-1] = replace(found[-1], detail=found[-1].detail
                                + declare_hint("adam_sqrt_eps", float(np.median(c))))
    return found


def adam_decoupled_decay(impl, params: dict, decayed, *, lr: float, weight_decay: float,
                         **no_decay) -> list[Finding]:
    """Zero gradients make the Adam part exactly 0: decayed tensors shrink by lr wd w, the
    others (``no_decay=...`` when given, else the implementation's default) do not move."""
    zero = {k: np.zeros_like(v) for k, v in params.items()}
    new, _ = impl.adam_step(copy.deepcopy(params), zero, impl.adam_init(copy.deepcopy(params)),
                            lr=lr, weight_decay=weight_decay, **no_decay)
    return [close("adam", f"zero gradient: {k} " + ("shrinks by lr * wd * w" if k in decayed
                                                    else "does not move"),
                  new[k], params[k] * (1 - lr * weight_decay) if k in decayed else params[k])
            for k in params]


def schedule_shape(impl, *, peak: float, warmup: int, total: int) -> list[Finding]:
    """Linear warmup from > 0 to the peak, then linear decay to ~0."""
    lrs = np.array([float(impl.warmup_linear_lr(s, peak_lr=peak, warmup_steps=warmup,
                                                total_steps=total)) for s in range(total + 1)])
    op = "schedule"
    declared = "lr(0)=0" in capabilities(impl)["conventions"]
    if lrs[0] == 0 and lrs[1] > 0 and declared:  # the derivation's peak * s / warmup
        first = Finding(op, "lr > 0 on the first step (step 0)", True,
                        f"lr(0) = 0 (peak * s / warmup, the derivation's §8.1): the first "
                        f"step's lr is 0 instead of peak / warmup = {peak / warmup:.3g}",
                        convention=True)
    else:
        first = holds(op, "lr > 0 on the first step (step 0)", lrs[0] > 0,
                      f"lr(0) = {lrs[0]}" + (" (if that is your convention, the derivation's "
                                             "§8.1, declare CAPABILITIES['conventions'] = "
                                             "('lr(0)=0',))" if lrs[0] == 0 else ""))
    return [first,
            holds(op, "lr rises strictly during warmup", np.diff(lrs[:warmup]) > 0),
            close(op, "peak lr is reached", lrs.max(), peak),
            holds(op, "peak lr is never exceeded", lrs <= peak * (1 + F64_IDENTITY_RTOL)),
            holds(op, "lr decays after warmup", np.diff(lrs[warmup + 1:]) < 0),
            holds(op, "lr ends near 0", 0 <= lrs[-1] <= peak / (total - warmup),
                  f"lr({total}) = {lrs[-1]}")]


def clip_global_norm(impl, grads: dict, max_norm: float) -> list[Finding]:
    """The norm is the 2-norm of all gradients; above max_norm every tensor is scaled by the same
    factor to norm max_norm -- exactly, or max_norm * norm / (norm + eps) under a declared
    divisor guard (spec/protocol/guards.py: CAPABILITIES["guards"]["clip_eps"]); below it nothing
    changes.  An undeclared guard is a failure naming the eps it implies."""
    from minibert_spec.protocol.guards import clip_guard, clipped_norm, undeclared_clip_message

    op = "clip"
    eps = clip_guard(capabilities(impl)["guards"])
    norm = np.sqrt(sum(float((g * g).sum()) for g in grads.values()))
    found = [close(op, "global_grad_norm is the 2-norm of all gradients",
                   impl.global_grad_norm(grads), norm)]
    given = copy.deepcopy(grads)
    before = _snapshot(given)
    clipped, reported = impl.clip_by_global_norm(given, max_norm)
    found.append(holds(op, "clip_by_global_norm leaves its input untouched",
                       not _mutated(before, given), "the gradients were modified in place"))
    found.append(close(op, "reported norm is the norm before clipping", reported, norm))
    if norm > max_norm:
        ratios = np.concatenate([(clipped[k] / grads[k]).ravel() for k in grads])
        new_norm = np.sqrt(sum(float((g * g).sum()) for g in clipped.values()))
        want = clipped_norm(norm, max_norm, eps)
        what = "the clipped global norm is max_norm" + (
            f" * norm / (norm + {eps:g}) (declared guard)" if eps else "")
        found.append(close(op, "every tensor is scaled by the same factor (global)", ratios,
                           np.full_like(ratios, ratios[0])))
        exact = close(op, what, new_norm, want)
        if not exact.ok and 0 < new_norm < max_norm:  # looks like a divisor guard
            exact = Finding(op, what, False, undeclared_clip_message(norm, max_norm, new_norm,
                                                                     eps))
        found.append(exact)
        if exact.ok and eps:
            found.append(Finding(op, "declared divisor guard", True,
                                 f"clip_eps={eps:g} changes the clipped norm by "
                                 f"{want / max_norm - 1:+.1e} relative", convention=True))
    else:
        found += [close(op, f"below max_norm, {k} is unchanged", clipped[k], grads[k])
                  for k in grads]
    c32, _ = impl.clip_by_global_norm(_to32(copy.deepcopy(grads)), max_norm)
    bad = sorted({str(np.asarray(v).dtype) for v in c32.values()
                  if np.asarray(v).dtype != np.float32})
    found.append(holds(op, "float32 in -> float32 out", not bad, f"got {bad}"))
    return found


def adam_contract(impl, params: dict, grads: dict, *, lr: float, **kw) -> list[Finding]:
    """adam_step is pure (params, grads and state untouched) and keeps float32 parameters
    float32 (and its returned state usable for a second step)."""
    op = "adam"
    p, g = copy.deepcopy(params), copy.deepcopy(grads)
    state = impl.adam_init(p)
    snap = _snapshot(p), _snapshot(g), _snapshot(state)
    new, state2 = impl.adam_step(p, g, state, lr=lr, **kw)
    found = [holds(op, "adam_step leaves params, grads and state untouched",
                   (_snapshot(p), _snapshot(g), _snapshot(state)) == snap,
                   "modified in place (the protocol's adam_step is pure: copy first)")]
    p32, g32 = _to32(copy.deepcopy(params)), _to32(copy.deepcopy(grads))
    new32, s32 = impl.adam_step(p32, g32, impl.adam_init(p32), lr=lr, **kw)
    new32, _ = impl.adam_step(new32, g32, s32, lr=lr, **kw)
    bad = sorted({f"{k}: {np.asarray(v).dtype}" for k, v in new32.items()
                  if np.asarray(v).dtype != np.float32})
    found.append(holds(op, "float32 in -> float32 out (two steps)", not bad, f"got {bad}"))
    return found


def accumulation_matches_full_batch(impl, params: dict, config, micro_batches: list[dict],
                                    label: str = "") -> list[Finding]:
    """The accumulated loss and gradient of a logical batch equal the full batch's (its mean
    over all predicted tokens / elements), whatever the micro-batches' sizes."""
    full = {k: np.concatenate([m[k] for m in micro_batches]) for k in micro_batches[0]}
    kw = {k: v for k, v in full.items() if k != "input_ids"}
    full_loss, full_grads, _ = impl.loss_and_grads(params, config, full["input_ids"], **kw)
    loss, acc = impl.accumulate_gradients(impl, params, config, micro_batches)
    op, tag = "accumulation", f"{label}: " if label else ""
    # the key bias's exact gradient is 0 (softmax is shift-invariant): both sides are rounding
    # noise of the size of the other gradients, so it is judged against the whole call's scale
    call = _mag(*full_grads.values())
    return [close(op, f"{tag}loss = full-batch loss", loss, full_loss),
            holds(op, f"{tag}gradient keys are the parameter keys", set(acc) == set(full_grads),
                  f"{sorted(set(acc) ^ set(full_grads))}"),
            *(close(op, f"{tag}d{k} = full-batch gradient", acc[k], full_grads[k],
                    call if k.endswith("attn.b_k") else 0.0)
              for k in sorted(set(acc) & set(full_grads)))]
