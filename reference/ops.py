"""Op pairs, llm.c style: ``X_forward(...) -> (out, cache)``, ``X_backward(dout, cache) -> grads``.

Conventions
-----------
* Pure functions, no hidden state: everything backward needs travels in ``cache``.
* A backward returns a tuple with one gradient per differentiable input of the forward, in the
  forward's argument order (``None`` where an optional input such as a bias was ``None``).
* float32 and float64 go through the same code; the dtype of the inputs is the dtype of every
  output (no silent casts, mixing dtypes is a ValueError).
* Shapes in comments: B batch, T sequence, H hidden, A heads, d_k = H / A, I intermediate, V vocab.
* Equation IDs (``@implements``) name the derivation in ``spec/`` each function realises.
"""

from __future__ import annotations

import numpy as np

from reference.registry import implements
from reference.validate import as_float_array, as_index_array, as_mask

__all__ = [
    "embedding_forward",
    "embedding_backward",
    "position_embedding_forward",
    "position_embedding_backward",
    "sinusoidal_encoding",
    "sinusoidal_position_forward",
    "sinusoidal_position_backward",
    "linear_forward",
    "linear_backward",
    "layernorm_forward",
    "layernorm_backward",
    "softmax_forward",
    "softmax_backward",
    "softmax_jacobian",
    "relu_forward",
    "relu_backward",
    "tanh_forward",
    "tanh_backward",
    "split_heads",
    "merge_heads",
    "attention_forward",
    "attention_backward",
    "ffn_forward",
    "ffn_backward",
    "block_param_names",
    "block_forward",
    "block_backward",
    "pooler_forward",
    "pooler_backward",
    "cross_entropy_forward",
    "cross_entropy_backward",
    "mse_forward",
    "mse_backward",
    "IGNORE_INDEX",
    "ATTENTION_PARAMS",
    "FFN_PARAMS",
]

IGNORE_INDEX = -100


def _sum_to_last(a: np.ndarray) -> np.ndarray:
    """Sum every leading axis: the gradient of a parameter broadcast over [*, n]."""
    return a.reshape(-1, a.shape[-1]).sum(axis=0)


# --------------------------------------------------------------------------- embeddings
@implements("embedding.forward")
def embedding_forward(ids, W):
    """Token lookup ``E[b, t] = W[ids[b, t]]``.  ids [B, T] int, W [V, H] -> [B, T, H]."""
    as_float_array("W", W, ndim=2)
    as_index_array("ids", ids, low=0, high=W.shape[0])
    out = W[ids]  # [B, T, H]
    return out, (ids, W.shape, W.dtype)


@implements("embedding.backward")
def embedding_backward(dout, cache):
    """dW[v] = sum of dout over every position holding id v.

    ``np.add.at`` is unbuffered: a plain ``dW[ids] += dout`` keeps only one of repeated ids.
    """
    ids, W_shape, dtype = cache
    as_float_array("dout", dout, shape=ids.shape + (W_shape[1],), dtype=dtype)
    dW = np.zeros(W_shape, dtype=dtype)
    np.add.at(dW, ids.reshape(-1), dout.reshape(-1, W_shape[1]))
    return (dW,)


@implements("position.learned.forward")
def position_embedding_forward(x, W_pos):
    """Add learned positions: ``x[b, t] + W_pos[t]``.  x [B, T, H], W_pos [T_max, H]."""
    as_float_array("x", x, ndim=3)
    as_float_array("W_pos", W_pos, ndim=2, dtype=x.dtype)
    B, T, H = x.shape
    if W_pos.shape[1] != H:
        raise ValueError(f"W_pos: expected shape (*, {H}) to match x, got {W_pos.shape}")
    if T > W_pos.shape[0]:
        raise ValueError(
            f"x: sequence length {T} exceeds the {W_pos.shape[0]} positions of W_pos")
    return x + W_pos[:T], (x.shape, W_pos.shape, x.dtype)


@implements("position.learned.backward")
def position_embedding_backward(dout, cache):
    """dx = dout; dW_pos[t] = sum_b dout[b, t] for t < T, 0 for unused positions."""
    x_shape, W_shape, dtype = cache
    as_float_array("dout", dout, shape=x_shape, dtype=dtype)
    T = x_shape[1]
    dW_pos = np.zeros(W_shape, dtype=dout.dtype)
    dW_pos[:T] = dout.sum(axis=0)
    return dout, dW_pos


@implements("position.sinusoidal")
def sinusoidal_encoding(T: int, d: int, dtype=np.float64) -> np.ndarray:
    """PE[pos, 2i] = sin(pos / 10000^(2i/d)), PE[pos, 2i+1] = cos(pos / 10000^(2i/d)).  [T, d]

    Computed in float64 then cast once, so float32 and float64 tables agree to rounding.
    """
    if int(T) < 1 or int(d) < 1:
        raise ValueError(f"T, d: expected positive sizes, got T={T}, d={d}")
    pos = np.arange(T, dtype=np.float64)[:, None]  # [T, 1]
    two_i = np.arange(0, d, 2, dtype=np.float64)[None, :]  # [1, ceil(d/2)]
    angle = pos / np.power(10000.0, two_i / d)  # [T, ceil(d/2)]
    pe = np.empty((T, d), dtype=np.float64)
    pe[:, 0::2] = np.sin(angle)
    pe[:, 1::2] = np.cos(angle[:, : d // 2])
    return pe.astype(dtype)


def sinusoidal_position_forward(x):
    """x + PE (no parameters).  x [B, T, H]."""
    as_float_array("x", x, ndim=3)
    return x + sinusoidal_encoding(x.shape[1], x.shape[2], x.dtype), (x.shape, x.dtype)


def sinusoidal_position_backward(dout, cache):
    shape, dtype = cache
    as_float_array("dout", dout, shape=shape, dtype=dtype)
    return (dout,)


# --------------------------------------------------------------------------- linear
@implements("linear.forward")
def linear_forward(x, W, b=None):
    """y = x @ W + b.  x [..., n_in], W [n_in, n_out], b [n_out] or None -> [..., n_out]."""
    as_float_array("x", x, min_ndim=1)
    as_float_array("W", W, ndim=2, dtype=x.dtype)
    if x.shape[-1] != W.shape[0]:
        raise ValueError(
            f"W: expected shape ({x.shape[-1]}, *) to match x's last axis, got {W.shape}")
    y = x @ W
    if b is not None:
        as_float_array("b", b, shape=(W.shape[1],), dtype=x.dtype)
        y += b
    return y, (x, W, b is not None)


@implements("linear.backward.dx", "linear.backward.dW", "linear.backward.db")
def linear_backward(dy, cache):
    """dx = dy @ W^T;  dW = x^T @ dy (summed over every leading axis);  db = sum(dy)."""
    x, W, has_b = cache
    as_float_array("dy", dy, shape=x.shape[:-1] + (W.shape[1],), dtype=x.dtype)
    dx = dy @ W.T  # [..., n_in]
    dW = x.reshape(-1, W.shape[0]).T @ dy.reshape(-1, W.shape[1])  # [n_in, n_out]
    db = _sum_to_last(dy) if has_b else None
    return dx, dW, db


# --------------------------------------------------------------------------- layernorm
@implements("layernorm.forward")
def layernorm_forward(x, gamma, beta, eps: float = 1e-12):
    """y = gamma * x_hat + beta, x_hat = (x - mu) / sqrt(var + eps), statistics over the last axis.

    var is the biased (1/N) variance, as in the Mini-BERT derivation and torch.nn.LayerNorm.
    """
    as_float_array("x", x, min_ndim=1)
    N = x.shape[-1]
    as_float_array("gamma", gamma, shape=(N,), dtype=x.dtype)
    as_float_array("beta", beta, shape=(N,), dtype=x.dtype)
    if not (np.isfinite(eps) and eps >= 0):
        raise ValueError(f"eps: expected a finite value >= 0, got {eps}")
    mu = x.mean(axis=-1, keepdims=True)  # [..., 1]
    x_mu = x - mu
    var = (x_mu * x_mu).mean(axis=-1, keepdims=True)  # [..., 1]
    rstd = 1.0 / np.sqrt(var + x.dtype.type(eps))  # [..., 1]
    x_hat = x_mu * rstd
    return gamma * x_hat + beta, (x_hat, rstd, gamma)


@implements("layernorm.backward.dx", "layernorm.backward.dgamma", "layernorm.backward.dbeta")
def layernorm_backward(dy, cache):
    """dx = rstd * (g - mean(g) - x_hat * mean(g * x_hat)) with g = dy * gamma.

    gamma multiplies dy *before* the feature means: pulling it outside (as the Mini-BERT
    derivation §3.3 writes it) is only right when gamma is constant across features.
    """
    x_hat, rstd, gamma = cache
    as_float_array("dy", dy, shape=x_hat.shape, dtype=x_hat.dtype)
    g = dy * gamma  # dL/dx_hat  [..., N]
    dx = rstd * (g - g.mean(axis=-1, keepdims=True)
                 - x_hat * (g * x_hat).mean(axis=-1, keepdims=True))
    dgamma = _sum_to_last(dy * x_hat)
    dbeta = _sum_to_last(dy)
    return dx, dgamma, dbeta


# --------------------------------------------------------------------------- softmax
@implements("softmax.forward")
def softmax_forward(x, mask=None):
    """Stable softmax over the last axis: exp(x - max) / sum.  ``mask`` (bool, x's shape) keeps
    True entries; False entries get probability exactly 0 and every row needs one True entry."""
    as_float_array("x", x, min_ndim=1)
    if mask is not None:
        mask = as_mask("mask", mask, shape=x.shape)
        if not np.all(mask.any(axis=-1)):
            raise ValueError("mask: every row needs at least one True entry, got an all-False row")
        x = np.where(mask, x, -np.inf)
    z = x - x.max(axis=-1, keepdims=True)  # max is finite: each row has a kept entry
    e = np.exp(z)
    p = e / e.sum(axis=-1, keepdims=True)
    return p, p


@implements("softmax.backward")
def softmax_backward(dp, cache):
    """Jacobian-vector product: dx = p * (dp - sum(p * dp)).  Masked entries (p = 0) get 0."""
    p = cache
    as_float_array("dp", dp, shape=p.shape, dtype=p.dtype)
    return (p * (dp - (p * dp).sum(axis=-1, keepdims=True)),)


@implements("softmax.jacobian")
def softmax_jacobian(p):
    """The full Jacobian dp_i/dx_j = p_i (delta_ij - p_j) from softmax outputs p [..., N] ->
    [..., N, N] (Mini-BERT derivation §3.2).  For inspection and tests: the backward uses the
    O(N) Jacobian-vector product above, never this O(N^2) matrix."""
    as_float_array("p", p, min_ndim=1)
    return p[..., :, None] * (np.eye(p.shape[-1], dtype=p.dtype) - p[..., None, :])


# --------------------------------------------------------------------------- relu / tanh
@implements("relu.forward")
def relu_forward(x):
    """max(0, x)."""
    as_float_array("x", x)
    return np.maximum(x, 0), (x > 0, x.dtype)


@implements("relu.backward")
def relu_backward(dy, cache):
    """dx = dy * [x > 0] (the subgradient at 0 is taken as 0, as torch does)."""
    positive, dtype = cache
    as_float_array("dy", dy, shape=positive.shape, dtype=dtype)
    return (dy * positive,)


@implements("tanh.forward")
def tanh_forward(x):
    as_float_array("x", x)
    y = np.tanh(x)
    return y, y


@implements("tanh.backward")
def tanh_backward(dy, cache):
    """dx = dy * (1 - tanh(x)^2)."""
    y = cache
    as_float_array("dy", dy, shape=y.shape, dtype=y.dtype)
    return (dy * (1 - y * y),)


# --------------------------------------------------------------------------- attention
@implements("attention.split_heads")
def split_heads(x, n_heads: int):
    """[B, T, H] -> [B, A, T, d_k]: head a owns features a*d_k:(a+1)*d_k."""
    as_float_array("x", x, ndim=3, finite=False)
    B, T, H = x.shape
    _check_heads(n_heads, H)
    return x.reshape(B, T, n_heads, H // n_heads).transpose(0, 2, 1, 3)


@implements("attention.merge_heads")
def merge_heads(x):
    """[B, A, T, d_k] -> [B, T, H] (the inverse of split_heads, and its adjoint)."""
    as_float_array("x", x, ndim=4, finite=False)
    B, A, T, d_k = x.shape
    return x.transpose(0, 2, 1, 3).reshape(B, T, A * d_k)


def _check_heads(n_heads, H: int) -> None:
    if (not isinstance(n_heads, (int, np.integer)) or isinstance(n_heads, bool) or n_heads < 1
            or H % n_heads):
        raise ValueError(f"n_heads: expected a positive divisor of H={H}, got {n_heads!r}")


ATTENTION_PARAMS = ("W_q", "W_k", "W_v", "W_o", "b_q", "b_k", "b_v", "b_o")


@implements("attention.qkv", "attention.scores", "attention.context", "attention.output")
def attention_forward(x, W_q, W_k, W_v, W_o, b_q=None, b_k=None, b_v=None, b_o=None, *,
                      n_heads: int, mask=None):
    """Multi-head self-attention.

    Q = x W_q + b_q (likewise K, V)                       [B, T, H]
    S = Q_h K_h^T / sqrt(d_k), P = softmax(S) over keys     [B, A, T, T]
    C = P V_h, y = merge(C) W_o + b_o                     [B, T, H]
    ``mask`` [B, T] (bool or 0/1) marks the keys that may be attended (key padding mask).
    """
    as_float_array("x", x, ndim=3)
    B, T, H = x.shape
    for name, W in (("W_q", W_q), ("W_k", W_k), ("W_v", W_v), ("W_o", W_o)):
        as_float_array(name, W, shape=(H, H), dtype=x.dtype)
    _check_heads(n_heads, H)
    for name, b in (("b_q", b_q), ("b_k", b_k), ("b_v", b_v), ("b_o", b_o)):
        if b is not None:
            as_float_array(name, b, shape=(H,), dtype=x.dtype)
    d_k = H // n_heads
    if mask is not None:
        mask = as_mask("mask", mask, shape=(B, T))
        if not np.all(mask.any(axis=-1)):
            raise ValueError("mask: every sequence needs at least one unmasked key, "
                             f"rows {np.flatnonzero(~mask.any(axis=-1)).tolist()} have none")
    q, q_cache = linear_forward(x, W_q, b_q)  # [B, T, H]
    k, k_cache = linear_forward(x, W_k, b_k)
    v, v_cache = linear_forward(x, W_v, b_v)
    q_h, k_h, v_h = (split_heads(t, n_heads) for t in (q, k, v))  # [B, A, T, d_k]
    scale = x.dtype.type(1.0 / np.sqrt(d_k))
    scores = (q_h @ k_h.transpose(0, 1, 3, 2)) * scale  # [B, A, T, T]
    key_mask = None if mask is None else np.broadcast_to(mask[:, None, None, :], scores.shape)
    p, p_cache = softmax_forward(scores, key_mask)  # [B, A, T, T]
    ctx = merge_heads(p @ v_h)  # [B, T, H]
    y, o_cache = linear_forward(ctx, W_o, b_o)
    cache = (n_heads, scale, q_h, k_h, v_h, p_cache, q_cache, k_cache, v_cache, o_cache)
    return y, cache


@implements("attention.backward.dW_o", "attention.backward.dV", "attention.backward.dP",
            "attention.backward.dS", "attention.backward.dQ", "attention.backward.dK",
            "attention.backward.dx")
def attention_backward(dy, cache):
    """Returns (dx, dW_q, dW_k, dW_v, dW_o, db_q, db_k, db_v, db_o); None for absent biases.

    dC = dy W_o^T;  dV_h = P^T dC_h;  dP = dC_h V_h^T;  dS = softmax JVP(dP);
    dQ_h = dS K_h / sqrt(d_k);  dK_h = dS^T Q_h / sqrt(d_k);  dx sums the three projections.
    """
    n_heads, scale, q_h, k_h, v_h, p_cache, q_cache, k_cache, v_cache, o_cache = cache
    dctx, dW_o, db_o = linear_backward(dy, o_cache)  # [B, T, H]
    dctx_h = split_heads(dctx, n_heads)  # [B, A, T, d_k]
    p = p_cache
    dv_h = p.transpose(0, 1, 3, 2) @ dctx_h  # [B, A, T, d_k]
    dp = dctx_h @ v_h.transpose(0, 1, 3, 2)  # [B, A, T, T]
    (dscores,) = softmax_backward(dp, p_cache)
    dscores *= scale
    dq_h = dscores @ k_h  # [B, A, T, d_k]
    dk_h = dscores.transpose(0, 1, 3, 2) @ q_h
    dx_q, dW_q, db_q = linear_backward(merge_heads(dq_h), q_cache)
    dx_k, dW_k, db_k = linear_backward(merge_heads(dk_h), k_cache)
    dx_v, dW_v, db_v = linear_backward(merge_heads(dv_h), v_cache)
    return dx_q + dx_k + dx_v, dW_q, dW_k, dW_v, dW_o, db_q, db_k, db_v, db_o


# --------------------------------------------------------------------------- feed-forward
FFN_PARAMS = ("W_1", "b_1", "W_2", "b_2")


@implements("ffn.forward")
def ffn_forward(x, W_1, b_1, W_2, b_2):
    """FFN(x) = ReLU(x W_1 + b_1) W_2 + b_2.  [..., H] -> [..., I] -> [..., H]."""
    as_float_array("x", x, min_ndim=1)
    H = x.shape[-1]
    as_float_array("W_1", W_1, ndim=2, dtype=x.dtype)
    I = W_1.shape[1]
    as_float_array("W_1", W_1, shape=(H, I))
    as_float_array("b_1", b_1, shape=(I,), dtype=x.dtype)
    as_float_array("W_2", W_2, shape=(I, H), dtype=x.dtype)
    as_float_array("b_2", b_2, shape=(H,), dtype=x.dtype)
    h, c1 = linear_forward(x, W_1, b_1)
    a, c_relu = relu_forward(h)
    y, c2 = linear_forward(a, W_2, b_2)
    return y, (c1, c_relu, c2)


@implements("ffn.backward")
def ffn_backward(dy, cache):
    """Returns (dx, dW_1, db_1, dW_2, db_2)."""
    c1, c_relu, c2 = cache
    da, dW_2, db_2 = linear_backward(dy, c2)
    (dh,) = relu_backward(da, c_relu)
    dx, dW_1, db_1 = linear_backward(dh, c1)
    return dx, dW_1, db_1, dW_2, db_2


# --------------------------------------------------------------------------- post-LN block
def block_param_names(attn_bias: bool) -> tuple[str, ...]:
    """Local parameter names of one block, in a fixed order."""
    attn = ATTENTION_PARAMS if attn_bias else ATTENTION_PARAMS[:4]
    return (tuple(f"attn.{n}" for n in attn) + ("ln1.gamma", "ln1.beta")
            + tuple(f"ffn.{n}" for n in FFN_PARAMS) + ("ln2.gamma", "ln2.beta"))


@implements("block.postln", "residual.forward")
def block_forward(x, p: dict, *, n_heads: int, mask=None, eps: float = 1e-12):
    """Post-LN encoder block (Mini-BERT derivation §2.5, BERT):

    x' = LN1(x + MHA(x));  out = LN2(x' + FFN(x')).
    ``p`` maps local names (``attn.W_q``, ``ln1.gamma``, ...) to arrays.
    """
    if not isinstance(p, dict):
        raise ValueError(f"p: expected a dict of block parameters, got {type(p).__name__}")
    expected = set(block_param_names(attn_bias="attn.b_q" in p))
    if set(p) != expected:
        raise ValueError(f"p: expected the keys of block_param_names(); missing "
                         f"{sorted(expected - set(p))}, unexpected {sorted(set(p) - expected)}")
    attn_args = [p.get(f"attn.{n}") for n in ATTENTION_PARAMS]
    a, c_attn = attention_forward(x, *attn_args, n_heads=n_heads, mask=mask)
    h1, c_ln1 = layernorm_forward(x + a, p["ln1.gamma"], p["ln1.beta"], eps)
    f, c_ffn = ffn_forward(h1, *(p[f"ffn.{n}"] for n in FFN_PARAMS))
    out, c_ln2 = layernorm_forward(h1 + f, p["ln2.gamma"], p["ln2.beta"], eps)
    return out, (c_attn, c_ln1, c_ffn, c_ln2, tuple(sorted(p)))


@implements("residual.backward")
def block_backward(dout, cache):
    """Returns (dx, grads) with grads keyed like the forward's ``p``.

    A residual sum passes its gradient unchanged to both branches: dx gets dr from the skip
    connection plus the attention branch's input gradient.
    """
    c_attn, c_ln1, c_ffn, c_ln2, names = cache
    dr2, dg2, db2 = layernorm_backward(dout, c_ln2)
    dh1_ffn, *dffn = ffn_backward(dr2, c_ffn)
    dh1 = dr2 + dh1_ffn  # skip + FFN branch
    dr1, dg1, db1 = layernorm_backward(dh1, c_ln1)
    dx_attn, *dattn = attention_backward(dr1, c_attn)
    dx = dr1 + dx_attn  # skip + attention branch
    grads = {f"attn.{n}": g for n, g in zip(ATTENTION_PARAMS, dattn)}
    grads.update({f"ffn.{n}": g for n, g in zip(FFN_PARAMS, dffn)})
    grads.update({"ln1.gamma": dg1, "ln1.beta": db1, "ln2.gamma": dg2, "ln2.beta": db2})
    return dx, {n: grads[n] for n in names}


# ----------------------------------------------------------------- pooler (BERT-base blog)
@implements("pooler.forward")
def pooler_forward(h, W, b=None):
    """Classification pooler: tanh(h[:, 0] W + b) on the first ([CLS]) token.

    [B, T, H] -> [B, H] (BERT-base forward-pass blog)."""
    as_float_array("h", h, ndim=3)
    z, c_lin = linear_forward(h[:, 0], W, b)
    y, c_tanh = tanh_forward(z)
    return y, (h.shape, c_lin, c_tanh)


def pooler_backward(dy, cache):
    """Returns (dh, dW, db); dh is zero except at position 0."""
    h_shape, c_lin, c_tanh = cache
    (dz,) = tanh_backward(dy, c_tanh)
    dh0, dW, db = linear_backward(dz, c_lin)
    dh = np.zeros(h_shape, dtype=dh0.dtype)
    dh[:, 0] = dh0
    return dh, dW, db


# --------------------------------------------------------------------------- losses
@implements("loss.ce.mean", "loss.ce.sum")
def cross_entropy_forward(logits, labels, *, ignore_index: int = IGNORE_INDEX,
                          reduction: str = "mean"):
    """Masked cross-entropy.  logits [..., V], labels [...] (``ignore_index`` = not predicted).

    "mean": -sum_{masked} log p[label] / N_masked  (Mini-BERT derivation §4.1)
    "sum":  -sum_{masked} log p[label]             (BERT masked-LM slides)
    """
    as_float_array("logits", logits, min_ndim=1)
    if reduction not in ("mean", "sum"):
        raise ValueError(f"reduction: expected 'mean' or 'sum', got {reduction!r}")
    V = logits.shape[-1]
    as_index_array("labels", labels, shape=logits.shape[:-1], low=0, high=V, allow=(ignore_index,))
    valid = labels != ignore_index  # [...]
    n = int(valid.sum())
    if n == 0 and reduction == "mean":
        raise ValueError(f"labels: the mean needs at least one position != ignore_index "
                         f"({ignore_index}), got none among {labels.size}")
    z = logits - logits.max(axis=-1, keepdims=True)
    log_sum = np.log(np.exp(z).sum(axis=-1, keepdims=True))
    logp = z - log_sum  # log-softmax [..., V]
    safe = np.where(valid, labels, 0)
    picked = np.take_along_axis(logp, safe[..., None], axis=-1)[..., 0]  # [...]
    total = -(picked * valid).sum(dtype=logits.dtype)
    denom = n if reduction == "mean" else 1
    loss = logits.dtype.type(total / denom)
    return loss, (logp, safe, valid, denom)


@implements("loss.ce.backward.mean", "loss.ce.backward.sum")
def cross_entropy_backward(dloss, cache):
    """dlogits = dloss * (softmax(logits) - onehot(label)) * valid / N (N = 1 for "sum")."""
    logp, safe, valid, denom = cache
    dloss = _scalar("dloss", dloss, logp.dtype)
    dlogits = np.exp(logp)  # p
    np.put_along_axis(dlogits, safe[..., None],
                      np.take_along_axis(dlogits, safe[..., None], axis=-1) - 1, axis=-1)
    dlogits *= (valid * (dloss / denom)).astype(logp.dtype)[..., None]
    return (dlogits,)


@implements("loss.mse")
def mse_forward(y_hat, y):
    """L = ||y_hat - y||^2 / N with N = y.size (NumPy-Transformer document, B*T*d_model)."""
    as_float_array("y_hat", y_hat)
    as_float_array("y", y, shape=y_hat.shape, dtype=y_hat.dtype)
    diff = y_hat - y
    return y_hat.dtype.type((diff * diff).sum() / diff.size), diff


@implements("loss.mse.backward")
def mse_backward(dloss, cache):
    """d y_hat = 2 (y_hat - y) / N * dloss;  d y = -d y_hat."""
    diff = cache
    dloss = _scalar("dloss", dloss, diff.dtype)
    dy_hat = diff * (2 * dloss / diff.size)
    return dy_hat, -dy_hat


def _scalar(name, value, dtype):
    a = np.asarray(value)
    if a.shape != () or not np.issubdtype(a.dtype, np.number) or not np.isfinite(a):
        raise ValueError(f"{name}: expected a finite scalar, got {value!r}")
    return dtype.type(a)
