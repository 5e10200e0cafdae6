"""Conformance mode: a programmatic per-op checker of any implementation (NumPy only).

The adapter protocol and the op table are in :mod:`spec.protocol`.  The checker is NumPy +
``spec.gradcheck``: backward vs central finite differences in float64 and invariants that hold
for any correct implementation.  It never imports torch: the "forward vs oracle" column comes from
the PyTorch oracle tests of the suite (tests/), which ``minibert check`` runs in a subprocess when
torch is installed, and merges in with :func:`merge_oracle`.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from spec.gradcheck import check_gradients, model_gradcheck
from spec.protocol import (
    OPS,
    ImplProxy,
    NotApplicable,
    _has,  # noqa: F401  (private helper shared with the loader)
    label_of,
    not_applicable_message,
    op_of_equation,
    unwrap,
)
from spec.tolerances import CLIP_NORM_RTOL, KINK_MARGIN, ORACLE_ATOL_F64, ORACLE_RTOL_F64


# --------------------------------------------------------------------------- report model
@dataclass
class Cell:
    status: str  # "ok", "FAIL" or "n/a"
    detail: str = ""


@dataclass
class OpReport:
    op: str
    forward: Cell = field(default_factory=lambda: Cell("n/a", "no oracle run"))
    backward: Cell = field(default_factory=lambda: Cell("n/a"))
    invariants: Cell = field(default_factory=lambda: Cell("n/a"))

    @property
    def verdict(self) -> str:
        cells = (self.forward, self.backward, self.invariants)
        if any(c.status == "FAIL" for c in cells):
            return "FAIL"
        if all(c.status == "n/a" for c in cells):
            return "n/a"
        return "ok"

    @property
    def failures(self) -> list[str]:
        return [f"{self.op} {col}: {c.detail}" for col, c in
                (("forward", self.forward), ("backward", self.backward),
                 ("invariants", self.invariants)) if c.status == "FAIL"]


class _Findings:
    """Collects FD results and invariant outcomes of one op."""

    def __init__(self, op: str):
        self.op = op
        self.fd: list = []
        self.invariants: list[tuple[str, bool, str]] = []

    def inv(self, name: str, ok, detail: str = "") -> None:
        self.invariants.append((name, bool(ok), detail))

    def close(self, name: str, a, b) -> None:
        """Float64 identity up to rounding (the same maths computed in another order)."""
        a = np.asarray(a, dtype=np.float64)
        b = np.asarray(b, dtype=np.float64)
        ok = a.shape == b.shape and np.allclose(a, b, rtol=ORACLE_RTOL_F64, atol=ORACLE_ATOL_F64)
        err = float(np.max(np.abs(a - b))) if a.shape == b.shape and a.size else float("nan")
        self.inv(name, ok, "" if ok else f"max |difference| {err:.2e}, shapes {a.shape} "
                                         f"vs {b.shape}")

    def zero(self, name: str, value, scale) -> None:
        """|value| is rounding noise relative to ``scale`` (the magnitude of its terms)."""
        v = float(np.max(np.abs(value))) if np.size(value) else 0.0
        bound = ORACLE_RTOL_F64 * float(np.max(np.abs(scale))) + ORACLE_ATOL_F64
        self.inv(name, v <= bound, "" if v <= bound else f"max |value| {v:.2e} > {bound:.1e}")


# --------------------------------------------------------------------------- helpers
def _fd_pair(F: _Findings, fwd, bwd, inputs: dict, rng, *, kwargs=None, n_dirs=2):
    """FD check of every float input of an op pair with a random (mixed-sign) upstream grad.
    Returns (out, grads tuple)."""
    kwargs = kwargs or {}
    names = list(inputs)
    out, cache = fwd(*inputs.values(), **kwargs)
    # another forward before the backward, as FD and training loops do: an implementation whose
    # cache is shared state (one object's attributes) now back-propagates the wrong activations
    fwd(*(_other(v) for v in inputs.values()), **kwargs)
    dout = rng.standard_normal(np.shape(out))
    grads = bwd(dout.copy(), cache)
    if not isinstance(grads, tuple) or len(grads) != len(names):
        got = len(grads) if isinstance(grads, tuple) else type(grads).__name__
        raise AssertionError(f"backward: expected a tuple of {len(names)} gradients "
                             f"({', '.join(names)}), got {got}")

    def f(**kw):
        return float(np.vdot(fwd(*(kw[n] for n in names), **kwargs)[0], dout))

    checked = {n: g for n, g in zip(names, grads) if inputs[n] is not None}
    F.fd += check_gradients(f, inputs, checked, rng=rng, n_dirs=n_dirs, op=F.op)
    return out, grads


def _other(v):
    """Different values of the same shape and dtype (ints and None unchanged)."""
    if isinstance(v, np.ndarray) and np.issubdtype(v.dtype, np.floating):
        return (v * 1.3 + 0.1).astype(v.dtype)
    return v


def _dtype_kept(F: _Findings, fwd, inputs: dict, **kwargs) -> None:
    f32 = {k: (v.astype(np.float32) if isinstance(v, np.ndarray) and v.dtype == np.float64
               else v) for k, v in inputs.items()}
    out = fwd(*f32.values(), **kwargs)[0]
    F.inv("float32 in -> float32 out", np.asarray(out).dtype == np.float32,
          f"got {np.asarray(out).dtype}")


def _away_from_zero(rng, shape, low=0.1, high=2.0):
    return rng.choice([-1.0, 1.0], size=shape) * rng.uniform(low, high, size=shape)


# --------------------------------------------------------------------------- per-op checks
def _check_embedding(impl, F, rng):
    W = rng.standard_normal((6, 4))  # id 5 never occurs
    ids = np.array([[0, 3, 3, 1, 0], [3, 3, 2, 0, 4]])  # repeated ids within and across rows
    out, (dW,) = _fd_pair(F, lambda W: impl.embedding_forward(ids, W), impl.embedding_backward,
                          {"W": W}, rng)
    F.close("rows are W[ids]", out, W[ids])
    dout = rng.standard_normal(out.shape)
    (dW,) = impl.embedding_backward(dout, impl.embedding_forward(ids, W)[1])
    F.close("sum of dW equals the sum of dout (no repeated id lost)", dW.sum(0), dout.sum((0, 1)))
    F.zero("rows of unused ids are 0", dW[5], dout)


def _check_position_embedding(impl, F, rng):
    x, W_pos = rng.standard_normal((3, 4, 5)), rng.standard_normal((6, 5))
    _fd_pair(F, impl.position_embedding_forward, impl.position_embedding_backward,
             {"x": x, "W_pos": W_pos}, rng)
    dout = rng.standard_normal(x.shape)
    dx, dW = impl.position_embedding_backward(dout, impl.position_embedding_forward(x, W_pos)[1])
    F.close("dx equals dout", dx, dout)
    F.zero("positions beyond T get 0", dW[4:], dout)
    _dtype_kept(F, impl.position_embedding_forward, {"x": x, "W_pos": W_pos})


def _check_sinusoidal(impl, F, rng):
    pe = np.asarray(impl.sinusoidal_encoding(7, 6, np.float64))
    F.inv("shape [T, d]", pe.shape == (7, 6), f"got {pe.shape}")
    F.close("position 0: sin(0)=0 on even features, cos(0)=1 on odd", pe[0],
            np.tile([0.0, 1.0], 3))
    F.inv("values in [-1, 1]", np.all(np.abs(pe) <= 1.0))
    F.close("feature 0 is sin(position)", pe[:, 0], np.sin(np.arange(7.0)))
    x = rng.standard_normal((2, 7, 6))
    out, _ = _fd_pair(F, impl.sinusoidal_position_forward, impl.sinusoidal_position_backward,
                      {"x": x}, rng)
    F.close("forward adds the table", out - x, np.broadcast_to(pe, x.shape))


def _check_linear(impl, F, rng):
    x, W, b = rng.standard_normal((2, 3, 4)), rng.standard_normal((4, 5)), rng.standard_normal(5)
    out, _ = _fd_pair(F, impl.linear_forward, impl.linear_backward, {"x": x, "W": W, "b": b}, rng)
    F.close("forward is x @ W + b", out, x @ W + b)
    grads = impl.linear_backward(rng.standard_normal((2, 3, 5)), impl.linear_forward(x, W)[1])
    F.inv("db is None without a bias", len(grads) == 3 and grads[2] is None)
    _dtype_kept(F, impl.linear_forward, {"x": x, "W": W, "b": b})


def _check_layernorm(impl, F, rng):
    x = rng.standard_normal((2, 3, 6)) * 2 + 1
    gamma, beta = 1 + 0.5 * rng.standard_normal(6), 0.3 * rng.standard_normal(6)  # never 1 / 0
    out, _ = _fd_pair(F, impl.layernorm_forward, impl.layernorm_backward,
                      {"x": x, "gamma": gamma, "beta": beta}, rng)
    x_hat = (out - beta) / gamma
    F.zero("normalised output has mean 0 per row", x_hat.mean(-1), x_hat)
    F.close("normalised output has (biased) variance 1 per row", x_hat.var(-1),
            np.ones(x_hat.shape[:-1]))
    dy = rng.standard_normal(x.shape)
    dx, _, _ = impl.layernorm_backward(dy, impl.layernorm_forward(x, gamma, beta)[1])
    F.zero("dx sums to 0 per row (shift invariance)", dx.sum(-1), dx)
    F.zero("dx is orthogonal to x - mean (scale invariance)",
           (dx * (x - x.mean(-1, keepdims=True))).sum(-1), dx * x)
    _dtype_kept(F, impl.layernorm_forward, {"x": x, "gamma": gamma, "beta": beta})


def _check_softmax(impl, F, rng):
    x = rng.standard_normal((2, 3, 5)) * 2
    out, _ = _fd_pair(F, impl.softmax_forward, impl.softmax_backward, {"x": x}, rng)
    F.close("rows sum to 1", out.sum(-1), np.ones((2, 3)))
    mask = rng.random((2, 3, 5)) < 0.6
    mask[..., 0] = True
    p, _ = _fd_pair(F, lambda x: impl.softmax_forward(x, mask), impl.softmax_backward,
                    {"x": x}, rng)
    F.inv("masked entries get probability exactly 0", np.all(p[~mask] == 0))
    dp = rng.standard_normal(x.shape)
    (dx,) = impl.softmax_backward(dp, impl.softmax_forward(x, mask)[1])
    F.zero("dx sums to 0 per row (shift invariance)", dx.sum(-1), dx)
    F.inv("masked entries get gradient exactly 0", np.all(dx[~mask] == 0))
    big, _ = impl.softmax_forward(x + 800.0)
    F.close("stable for large logits (shift by 800)", big, out)
    _dtype_kept(F, impl.softmax_forward, {"x": x})


def _check_softmax_jacobian(impl, F, rng):
    p = rng.random((2, 5)) + 0.05
    p /= p.sum(-1, keepdims=True)
    J = np.asarray(impl.softmax_jacobian(p))
    F.inv("shape [..., N, N]", J.shape == (2, 5, 5), f"got {J.shape}")
    F.zero("every column sums to 0 (probabilities keep summing to 1)", J.sum(-2), J)
    F.close("symmetric", J, np.swapaxes(J, -1, -2))
    F.close("diagonal is p (1 - p)", np.diagonal(J, axis1=-2, axis2=-1), p * (1 - p))


def _check_relu(impl, F, rng):
    x = _away_from_zero(rng, (2, 3, 4))
    out, _ = _fd_pair(F, impl.relu_forward, impl.relu_backward, {"x": x}, rng)
    F.inv("output >= 0", np.all(out >= 0))
    (dx,) = impl.relu_backward(rng.standard_normal(x.shape), impl.relu_forward(x)[1])
    F.inv("dx is 0 where x < 0", np.all(dx[x < 0] == 0))


def _check_tanh(impl, F, rng):
    x = rng.standard_normal((2, 3, 4))
    out, _ = _fd_pair(F, impl.tanh_forward, impl.tanh_backward, {"x": x}, rng)
    F.inv("|output| < 1", np.all(np.abs(out) < 1))
    F.close("odd function", impl.tanh_forward(-x)[0], -out)


def _check_heads(impl, F, rng):
    x, y = rng.standard_normal((2, 5, 6)), rng.standard_normal((2, 3, 5, 2))
    s = np.asarray(impl.split_heads(x, 3))
    F.inv("split_heads shape [B, A, T, d_k]", s.shape == (2, 3, 5, 2), f"got {s.shape}")
    F.close("head a holds features a*d_k:(a+1)*d_k", s[:, 1], x[:, :, 2:4])
    F.close("merge_heads inverts split_heads", impl.merge_heads(s), x)
    F.close("merge_heads is the adjoint of split_heads",
            np.vdot(s, y), np.vdot(x, impl.merge_heads(y)))


def _attention_inputs(rng, H=6):
    ws = {n: rng.standard_normal((H, H)) * 0.6 for n in ("W_q", "W_k", "W_v", "W_o")}
    bs = {n: 0.3 * rng.standard_normal(H) for n in ("b_q", "b_k", "b_v", "b_o")}
    return {"x": rng.standard_normal((2, 4, H)), **ws, **bs}


def _check_attention(impl, F, rng):
    inputs = _attention_inputs(rng)
    mask = np.array([[1, 1, 1, 1], [1, 1, 0, 0]])
    for m in (None, mask):
        out, grads = _fd_pair(F, impl.attention_forward, impl.attention_backward, inputs, rng,
                              kwargs=dict(n_heads=2, mask=m))
    F.zero("db_k is 0 (softmax is shift-invariant per row)", grads[6], grads[4])
    x2 = inputs["x"].copy()
    x2[1, 2:] += rng.standard_normal((2, 6))  # change the padded positions only
    out2, _ = impl.attention_forward(x2, *list(inputs.values())[1:], n_heads=2, mask=mask)
    F.close("padded keys do not affect unpadded positions", out2[1, :2], out[1, :2])
    perm = np.array([2, 0, 3, 1])
    x_p = inputs["x"][:, perm]
    rest = list(inputs.values())[1:]
    F.close("permuting tokens permutes the output (no mask)",
            impl.attention_forward(x_p, *rest, n_heads=2)[0],
            impl.attention_forward(inputs["x"], *rest, n_heads=2)[0][:, perm])
    # the scores are scaled by 1/sqrt(d_k), not 1/sqrt(H): keep only head 0's features in Q, K, V
    # (head 1 then attends uniformly to zero values); that is single-head attention (d_k = H)
    # whose W_q, b_q carry the factor sqrt(H / d_k) = sqrt(A)
    head0 = np.r_[np.ones(3), np.zeros(3)]  # H = 6, A = 2, d_k = 3
    qkv = {n: inputs[n] * head0 for n in ("W_q", "W_k", "W_v", "b_q", "b_k", "b_v")}
    args = lambda c: (qkv["W_q"] * c, qkv["W_k"], qkv["W_v"], inputs["W_o"],  # noqa: E731
                      qkv["b_q"] * c, qkv["b_k"], qkv["b_v"], inputs["b_o"])
    F.close("scores are scaled by 1/sqrt(d_k): one head of two = one head of H with W_q*sqrt(2)",
            impl.attention_forward(inputs["x"], *args(1.0), n_heads=2)[0],
            impl.attention_forward(inputs["x"], *args(np.sqrt(2.0)), n_heads=1)[0])
    _dtype_kept(F, lambda *a: impl.attention_forward(*a, n_heads=2), inputs)


def _check_ffn(impl, F, rng):
    for _ in range(100):  # keep every ReLU pre-activation away from the kink
        x, W_1, b_1 = (rng.standard_normal((2, 3, 4)), rng.standard_normal((4, 8)),
                       0.3 * rng.standard_normal(8))
        if np.min(np.abs(x @ W_1 + b_1)) > 100 * KINK_MARGIN:
            break
    inputs = {"x": x, "W_1": W_1, "b_1": b_1, "W_2": rng.standard_normal((8, 4)),
              "b_2": 0.3 * rng.standard_normal(4)}
    _fd_pair(F, impl.ffn_forward, impl.ffn_backward, inputs, rng)
    _dtype_kept(F, impl.ffn_forward, inputs)


def _block_params(rng, H=6, I=12):
    a = _attention_inputs(rng, H)
    p = {f"attn.{k}": v for k, v in a.items() if k != "x"}
    p["ln1.gamma"], p["ln1.beta"] = 1 + 0.4 * rng.standard_normal(H), 0.2 * rng.standard_normal(H)
    p["ffn.W_1"], p["ffn.b_1"] = 0.5 * rng.standard_normal((H, I)), 0.2 * rng.standard_normal(I)
    p["ffn.W_2"], p["ffn.b_2"] = 0.5 * rng.standard_normal((I, H)), 0.2 * rng.standard_normal(H)
    p["ln2.gamma"], p["ln2.beta"] = 1 + 0.4 * rng.standard_normal(H), 0.2 * rng.standard_normal(H)
    return a["x"], p


def _check_block(impl, F, rng):
    x, p = _block_params(rng)
    mask = np.array([[1, 1, 1, 1], [1, 1, 1, 0]])
    out, cache = impl.block_forward(x, p, n_heads=2, mask=mask)
    dout = rng.standard_normal(out.shape)
    dx, grads = impl.block_backward(dout.copy(), cache)
    F.inv("grads has the keys of p", set(grads) == set(p),
          f"missing {sorted(set(p) - set(grads))}, extra {sorted(set(grads) - set(p))}")

    def f(x, **params):
        return float(np.vdot(impl.block_forward(x, params, n_heads=2, mask=mask)[0], dout))

    F.fd += check_gradients(f, {"x": x, **p}, {"x": dx, **{k: grads[k] for k in p}}, rng=rng,
                            op=F.op)
    x2 = x.copy()
    x2[1, 3] += 1.0
    F.close("padded keys do not affect unpadded positions",
            impl.block_forward(x2, p, n_heads=2, mask=mask)[0][1, :3], out[1, :3])


def _check_pooler(impl, F, rng):
    inputs = {"h": rng.standard_normal((2, 3, 4)), "W": rng.standard_normal((4, 4)),
              "b": 0.3 * rng.standard_normal(4)}
    _fd_pair(F, impl.pooler_forward, impl.pooler_backward, inputs, rng)
    dh, _, _ = impl.pooler_backward(rng.standard_normal((2, 4)),
                                    impl.pooler_forward(*inputs.values())[1])
    F.inv("only the first ([CLS]) token gets a gradient", np.all(dh[:, 1:] == 0))


def _check_cross_entropy(impl, F, rng):
    logits = rng.standard_normal((2, 4, 5)) * 2
    labels = np.array([[1, -100, 4, 4], [-100, -100, 0, 2]])
    valid = labels != -100
    dloss = 0.7
    for reduction in ("mean", "sum"):
        loss, cache = impl.cross_entropy_forward(logits, labels, reduction=reduction)
        (dlogits,) = impl.cross_entropy_backward(dloss, cache)

        def f(logits, _r=reduction):
            return dloss * float(impl.cross_entropy_forward(logits, labels, reduction=_r)[0])

        F.fd += check_gradients(f, {"logits": logits}, {"logits": dlogits}, rng=rng, op=F.op)
        F.inv(f"{reduction}: ignored positions get gradient exactly 0",
              np.all(dlogits[~valid] == 0))
        F.zero(f"{reduction}: dlogits sums to 0 per position", dlogits.sum(-1), dlogits)
    mean = float(impl.cross_entropy_forward(logits, labels, reduction="mean")[0])
    total = float(impl.cross_entropy_forward(logits, labels, reduction="sum")[0])
    F.inv("loss >= 0", mean >= 0 and total >= 0)
    F.close("mean = sum / (number of predicted positions)", mean * valid.sum(), total)
    F.close("large logits are stable (shift by 800)",
            impl.cross_entropy_forward(logits + 800.0, labels)[0], mean)


def _check_mse(impl, F, rng):
    y_hat, y = rng.standard_normal((2, 3, 4)), rng.standard_normal((2, 3, 4))
    loss, _ = _fd_pair(F, impl.mse_forward, impl.mse_backward, {"y_hat": y_hat, "y": y}, rng)
    F.inv("loss >= 0", float(loss) >= 0)
    F.zero("loss is 0 at y_hat = y", impl.mse_forward(y, y.copy())[0], 1.0)
    F.close("symmetric in its arguments", impl.mse_forward(y, y_hat)[0], loss)


def _tiny_configs():
    from reference.config import mini_bert, seed001  # config only: no implementation code

    dims = dict(n_layers=2, hidden=8, n_heads=2, intermediate=16, max_len=8, vocab_size=13)
    return {"mini_bert": mini_bert(**dims), "seed001": seed001(**dims)}


def _check_model(impl, F, rng):
    from spec.gradcheck import random_batch, random_params

    for name, config in _tiny_configs().items():
        F.op = f"model[{name}]"
        F.fd += model_gradcheck(impl, config, B=2, T=6, seed=1, n_dirs=2)
        params = random_params(impl, config, seed=2)
        batch = random_batch(config, 2, 6, seed=2)
        kw = dict(attention_mask=batch["attention_mask"])
        kw["labels" if config.head == "mlm" else "targets"] = batch[
            "labels" if config.head == "mlm" else "targets"]
        value, grads, d_emb = impl.loss_and_grads(params, config, batch["input_ids"], **kw)
        F.inv(f"{name}: gradient keys are the parameter keys", set(grads) == set(params),
              f"missing {sorted(set(params) - set(grads))}, extra "
              f"{sorted(set(grads) - set(params))}")
        bad = [k for k in params if k in grads and (np.shape(grads[k]) != params[k].shape
                                                    or grads[k].dtype != params[k].dtype)]
        F.inv(f"{name}: gradient shapes and dtypes match the parameters", not bad,
              f"mismatch for {bad[:3]}")
        F.close(f"{name}: loss_and_grads agrees with loss",
                value, impl.loss(params, config, batch["input_ids"], **kw))
        F.close(f"{name}: inputs_embeds=embed(ids) gives the same loss",
                impl.loss(params, config, inputs_embeds=impl.embed(params, config,
                                                                   batch["input_ids"]), **kw),
                value)
        p32 = impl.init_params(config, seed=0, dtype=np.float32)
        kw32 = {k: (v.astype(np.float32) if k == "targets" else v) for k, v in kw.items()}
        v32, g32, _ = impl.loss_and_grads(p32, config, batch["input_ids"], **kw32)
        F.inv(f"{name}: float32 params -> float32 loss and grads",
              np.asarray(v32).dtype == np.float32
              and all(g.dtype == np.float32 for g in g32.values()))
    F.op = "model"


# ---- optimizer (interface fixed by the project; checked through invariants only)
def _adam_kwargs(**kw):
    base = dict(lr=1e-2, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.0, no_decay=())
    return {**base, **kw}


def _check_adam(impl, F, rng):
    params = {"w": rng.standard_normal((3, 4)), "b": rng.standard_normal(4)}
    # |g| log-uniform in [1e-4, 1], mixed signs: both the placement of eps (which matters when
    # |g| ~ sqrt(eps)) and a missing bias correction (3x too large a first step) show up
    grads = {k: rng.choice([-1.0, 1.0], v.shape) * 10.0 ** rng.uniform(-4, 0, v.shape)
             for k, v in params.items()}
    lr, beta2, eps = 1e-2, 0.999, 1e-8
    state = impl.adam_init(copy.deepcopy(params))
    new, state = impl.adam_step(copy.deepcopy(params), grads, state,
                                **_adam_kwargs(lr=lr, beta2=beta2, eps=eps))
    for k in params:
        step = -(new[k] - params[k]) * np.sign(grads[k])  # signed along -g
        # first bias-corrected step: m_hat = g, v_hat = g^2, so lr * |g| / (|g| + eps'), with
        # eps' = eps, or eps / sqrt(1 - beta2) in the paper's "efficient" form
        low = lr * np.abs(grads[k]) / (np.abs(grads[k]) + eps / np.sqrt(1 - beta2))
        slack = 1 + ORACLE_RTOL_F64
        F.inv(f"first step moves every entry of {k} by lr * |g| / (|g| + eps), along -g",
              np.all(step >= low / slack) and np.all(step <= lr * slack),
              f"step / lr in [{np.min(step) / lr:.6g}, {np.max(step) / lr:.6g}]")
    zero = {k: np.zeros_like(v) for k, v in params.items()}
    state = impl.adam_init(copy.deepcopy(params))
    new, _ = impl.adam_step(copy.deepcopy(params), zero, state,
                            **_adam_kwargs(lr=lr, weight_decay=0.1, no_decay=("b",)))
    F.close("zero gradient, decoupled decay: w shrinks by lr * weight_decay * w",
            params["w"] - new["w"], lr * 0.1 * params["w"])
    F.close("zero gradient: a no_decay tensor does not move", new["b"], params["b"])


def _check_schedule(impl, F, rng):
    peak, warm, total = 1e-3, 10, 50
    lrs = np.array([float(impl.warmup_linear_lr(s, peak_lr=peak, warmup_steps=warm,
                                                total_steps=total)) for s in range(total + 1)])
    F.inv("lr > 0 on the first step (step 0)", lrs[0] > 0, f"lr(0) = {lrs[0]}")
    F.inv("lr rises strictly during warmup", np.all(np.diff(lrs[:warm]) > 0))
    F.inv("peak lr is reached and never exceeded",
          np.isclose(lrs.max(), peak, rtol=ORACLE_RTOL_F64) and np.all(lrs <= peak * (1 + 1e-12)))
    F.inv("lr decays after warmup", np.all(np.diff(lrs[warm + 1:]) < 0))
    F.inv("lr ends near 0", 0 <= lrs[-1] <= peak / (total - warm), f"lr({total}) = {lrs[-1]}")


def _check_clip(impl, F, rng):
    grads = {"a": rng.standard_normal((3, 4)), "b": 10 * rng.standard_normal(5)}
    norm = np.sqrt(sum(float((g * g).sum()) for g in grads.values()))
    F.close("global_grad_norm is the 2-norm of all gradients", impl.global_grad_norm(grads), norm)
    clipped, reported = impl.clip_by_global_norm(copy.deepcopy(grads), norm / 4)
    F.close("reported norm is the norm before clipping", reported, norm)
    ratios = np.concatenate([(clipped[k] / grads[k]).ravel() for k in grads])
    F.close("every tensor is scaled by the same factor (global, not per tensor)",
            ratios, np.full_like(ratios, ratios[0]))
    new_norm = np.sqrt(sum(float((g * g).sum()) for g in clipped.values()))
    F.inv("the clipped global norm is max_norm",
          abs(new_norm - norm / 4) <= CLIP_NORM_RTOL * norm / 4, f"got {new_norm / (norm / 4)}")
    kept, _ = impl.clip_by_global_norm(copy.deepcopy(grads), 2 * norm)
    for k in grads:
        F.close(f"below max_norm, {k} is unchanged", kept[k], grads[k])


def _check_accumulation(impl, F, rng):
    """The accumulated loss and gradient of a logical batch equal the full batch's, for
    micro-batches with uneven numbers of predicted tokens (one with none), on both heads."""
    from spec.gradcheck import random_params, split_batch, uneven_mlm_batch

    configs = _tiny_configs()
    mlm, mse = configs["mini_bert"], configs["seed001"]
    params = random_params(impl, mlm, seed=4)
    batch = uneven_mlm_batch(mlm, seed=4)
    full_loss, full, _ = impl.loss_and_grads(params, mlm, batch["input_ids"],
                                             labels=batch["labels"],
                                             attention_mask=batch["attention_mask"])
    # predicted tokens per micro-batch: 1 | 6, 0 | 3, 2; and 1 | 6 | 0 (alone) | 3 | 2
    for bounds in ([0, 1, 3, 5], [0, 1, 2, 3, 4, 5]):
        loss, acc = impl.accumulate_gradients(impl, params, mlm, split_batch(batch, bounds))
        F.close(f"mlm, micro-batches {bounds}: loss = full-batch loss", loss, full_loss)
        F.inv(f"mlm, micro-batches {bounds}: gradient keys are the parameter keys",
              set(acc) == set(full))
        for k in sorted(set(acc) & set(full)):
            F.close(f"mlm, micro-batches {bounds}: d{k} = full-batch gradient", acc[k], full[k])
    params = random_params(impl, mse, seed=5)
    ids = rng.integers(0, mse.vocab_size, size=(5, 6))
    targets = rng.standard_normal((5, 6, mse.hidden))
    full_loss, full, _ = impl.loss_and_grads(params, mse, ids, targets=targets)
    loss, acc = impl.accumulate_gradients(
        impl, params, mse, split_batch({"input_ids": ids, "targets": targets}, [0, 1, 5]))
    F.close("mse, micro-batches of 1 and 4 rows: loss = full-batch loss", loss, full_loss)
    for k in sorted(set(acc) & set(full)):
        F.close(f"mse, micro-batches of 1 and 4 rows: d{k} = full-batch gradient",
                acc[k], full[k])


CHECKS: dict[str, Callable] = {
    "embedding": _check_embedding, "position_embedding": _check_position_embedding,
    "sinusoidal_position": _check_sinusoidal, "linear": _check_linear,
    "layernorm": _check_layernorm, "softmax": _check_softmax,
    "softmax_jacobian": _check_softmax_jacobian, "relu": _check_relu,
    "tanh": _check_tanh, "heads": _check_heads, "attention": _check_attention,
    "ffn": _check_ffn, "block": _check_block, "pooler": _check_pooler,
    "cross_entropy": _check_cross_entropy, "mse": _check_mse, "model": _check_model,
    "adam": _check_adam, "schedule": _check_schedule, "clip": _check_clip,
    "accumulation": _check_accumulation,
}
assert set(CHECKS) == set(OPS)


def _summarise_fd(results) -> Cell:
    if not results:
        return Cell("n/a", "nothing to differentiate")
    failed = [r for r in results if not r.passed]
    if failed:
        worst = max(failed, key=lambda r: r.error)
        return Cell("FAIL", f"{len(failed)}/{len(results)} tensors; worst d/d{worst.tensor}: "
                            f"error {worst.error:.1e} (analytic {worst.analytic:.6g}, "
                            f"FD {worst.numeric:.6g})")
    return Cell("ok", f"{len(results)} tensors, worst error "
                      f"{max(r.error for r in results):.1e}")


def _summarise_inv(invariants) -> Cell:
    if not invariants:
        return Cell("n/a")
    failed = [(n, d) for n, ok, d in invariants if not ok]
    if failed:
        return Cell("FAIL", "; ".join(f"{n}" + (f" ({d})" if d else "") for n, d in failed))
    return Cell("ok", f"{len(invariants)} hold")


def check_op(impl, op: str, seed: int = 0) -> OpReport:
    """Run the backward-vs-FD and invariant checks of one op."""
    report = OpReport(op)
    obj = unwrap(impl)
    missing = [n for n in OPS[op].names if not _has(obj, n)]
    if missing:
        msg = not_applicable_message(label_of(impl), ", ".join(missing))
        report.backward = report.invariants = Cell("n/a", msg)
        return report
    F = _Findings(op)
    rng = np.random.default_rng(seed)
    try:
        CHECKS[op](ImplProxy(obj, label_of(impl)), F, rng)
    except NotApplicable as e:
        report.backward = report.invariants = Cell("n/a", str(e))
        return report
    except Exception as e:  # a crash is a failure of the op, reported with its message
        report.backward = Cell("FAIL", f"raised {type(e).__name__}: {e}")
        report.invariants = _summarise_inv(F.invariants)
        return report
    report.backward = _summarise_fd(F.fd)
    report.invariants = _summarise_inv(F.invariants)
    return report


def check_all(impl, ops=None, seed: int = 0) -> list[OpReport]:
    """The programmatic conformance checks of every op (or of ``ops``)."""
    return [check_op(impl, op, seed) for op in (ops or OPS)]


def merge_oracle(reports: list[OpReport], records: list[dict]) -> None:
    """Fill the "forward vs oracle" cells from test records (``{"nodeid", "outcome",
    "equations", "ops"}``, as the conftest's MINIBERT_REPORT hook writes them): a test counts
    for the op of each of its equations and for the rows its oracle marker names."""
    by_op: dict[str, list[dict]] = {}
    for rec in records:
        ops = {op_of_equation(e) for e in rec.get("equations", ())} | set(rec.get("ops", ()))
        for op in ops & set(OPS):
            by_op.setdefault(op, []).append(rec)
    for report in reports:
        recs = by_op.get(report.op, [])
        ran = [r for r in recs if r["outcome"] in ("passed", "failed")]
        failed = [r for r in ran if r["outcome"] == "failed"]
        if failed:
            report.forward = Cell("FAIL", f"{len(failed)}/{len(ran)} oracle tests failed, first "
                                          f"{failed[0]['nodeid']}")
        elif ran:
            report.forward = Cell("ok", f"{len(ran)} oracle tests")
        elif recs:
            report.forward = Cell("n/a", "oracle tests skipped")
        else:
            report.forward = Cell("n/a", "no oracle test for this op")

