"""Conformance mode: a programmatic per-op checker of any implementation (NumPy only).

The adapter protocol and the op table are in :mod:`spec.protocol`.  The checker is NumPy +
``spec.gradcheck``: backward vs central finite differences in float64 and invariants that hold
for any correct implementation.  It never imports torch: the "forward vs oracle" column comes from
the PyTorch oracle tests of the suite (tests/), which ``minibert check`` runs in a subprocess when
torch is installed, and merges in with :func:`merge_oracle`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from spec import invariants as I
from spec.gradcheck import check_gradients, model_gradcheck
from spec.protocol import (
    IGNORE_INDEX,
    OPS,
    ImplProxy,
    NotApplicable,
    _has,  # noqa: F401  (private helper shared with the loader)
    label_of,
    not_applicable_message,
    op_of_equation,
    unwrap,
)
from spec.tolerances import KINK_MARGIN


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
    """Collects the FD results and the invariant findings of one op."""

    def __init__(self, op: str):
        self.op = op
        self.fd: list = []
        self.invariants: list[I.Finding] = []

    def add(self, findings: list[I.Finding]) -> None:
        self.invariants += findings


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


def _away_from_zero(rng, shape, low=0.1, high=2.0):
    return rng.choice([-1.0, 1.0], size=shape) * rng.uniform(low, high, size=shape)


# --------------------------------------------------------------------------- per-op checks
# Each builds fixed-seed inputs, runs the FD check of the pair and the op's identities of
# spec.invariants (the same functions the Hypothesis tests call on drawn inputs).
def _check_embedding(impl, F, rng):
    W = rng.standard_normal((6, 4))  # id 5 never occurs
    ids = np.array([[0, 3, 3, 1, 0], [3, 3, 2, 0, 4]])  # repeated ids within and across rows
    _fd_pair(F, lambda W: impl.embedding_forward(ids, W), impl.embedding_backward, {"W": W}, rng)
    F.add(I.embedding_scatter_adds(impl, ids, W, rng.standard_normal(ids.shape + (4,))))


def _check_position_embedding(impl, F, rng):
    x, W_pos = rng.standard_normal((3, 4, 5)), rng.standard_normal((6, 5))
    _fd_pair(F, impl.position_embedding_forward, impl.position_embedding_backward,
             {"x": x, "W_pos": W_pos}, rng)
    F.add(I.position_embedding_identities(impl, x, W_pos, rng.standard_normal(x.shape)))
    F.add(I.dtype_kept(impl, F.op, impl.position_embedding_forward, {"x": x, "W_pos": W_pos}))


def _check_sinusoidal(impl, F, rng):
    x = rng.standard_normal((2, 7, 6))
    _fd_pair(F, impl.sinusoidal_position_forward, impl.sinusoidal_position_backward, {"x": x},
             rng)
    F.add(I.sinusoidal_identities(impl, x))


def _check_linear(impl, F, rng):
    x, W, b = rng.standard_normal((2, 3, 4)), rng.standard_normal((4, 5)), rng.standard_normal(5)
    _fd_pair(F, impl.linear_forward, impl.linear_backward, {"x": x, "W": W, "b": b}, rng)
    F.add(I.linear_identities(impl, x, W, b, rng.standard_normal((2, 3, 5))))
    F.add(I.dtype_kept(impl, F.op, impl.linear_forward, {"x": x, "W": W, "b": b}))


def _check_layernorm(impl, F, rng):
    x = rng.standard_normal((2, 3, 6)) * 2 + 1
    gamma, beta = 1 + 0.5 * rng.standard_normal(6), 0.3 * rng.standard_normal(6)  # never 1 / 0
    _fd_pair(F, impl.layernorm_forward, impl.layernorm_backward,
             {"x": x, "gamma": gamma, "beta": beta}, rng)
    F.add(I.layernorm_normalises(impl, x, gamma, beta, scale=1.7, shift=-0.4))
    F.add(I.layernorm_backward_invariances(impl, x, gamma, beta, rng.standard_normal(x.shape)))
    F.add(I.dtype_kept(impl, F.op, impl.layernorm_forward,
                       {"x": x, "gamma": gamma, "beta": beta}))


def _check_softmax(impl, F, rng):
    x = rng.standard_normal((2, 3, 5)) * 2
    _fd_pair(F, impl.softmax_forward, impl.softmax_backward, {"x": x}, rng)
    mask = rng.random((2, 3, 5)) < 0.6
    mask[..., 0] = True
    _fd_pair(F, lambda x: impl.softmax_forward(x, mask), impl.softmax_backward, {"x": x}, rng)
    for m in (None, mask):
        F.add(I.softmax_identities(impl, x, m, rng.standard_normal(x.shape)))
    F.add(I.softmax_shift_invariant(impl, x, None, 800.0))
    F.add(I.softmax_shift_invariant(impl, x, mask, -800.0))
    F.add(I.dtype_kept(impl, F.op, impl.softmax_forward, {"x": x}))


def _check_softmax_jacobian(impl, F, rng):
    p = rng.random((2, 5)) + 0.05
    F.add(I.softmax_jacobian_identities(impl, p / p.sum(-1, keepdims=True)))


def _check_relu(impl, F, rng):
    x = _away_from_zero(rng, (2, 3, 4))
    _fd_pair(F, impl.relu_forward, impl.relu_backward, {"x": x}, rng)
    F.add(I.relu_identities(impl, x, rng.standard_normal(x.shape)))


def _check_tanh(impl, F, rng):
    x = rng.standard_normal((2, 3, 4))
    _fd_pair(F, impl.tanh_forward, impl.tanh_backward, {"x": x}, rng)
    F.add(I.tanh_identities(impl, x))


def _check_heads(impl, F, rng):
    F.add(I.heads_identities(impl, rng.standard_normal((2, 5, 6)),
                             rng.standard_normal((2, 3, 5, 2)), 3))


def _attention_inputs(rng, H=6):
    ws = {n: rng.standard_normal((H, H)) * 0.6 for n in ("W_q", "W_k", "W_v", "W_o")}
    bs = {n: 0.3 * rng.standard_normal(H) for n in ("b_q", "b_k", "b_v", "b_o")}
    return {"x": rng.standard_normal((2, 4, H)), **ws, **bs}


def _check_attention(impl, F, rng):
    inputs = _attention_inputs(rng)
    mask = np.array([[1, 1, 1, 1], [1, 1, 0, 0]])
    for m in (None, mask):
        _fd_pair(F, impl.attention_forward, impl.attention_backward, inputs, rng,
                 kwargs=dict(n_heads=2, mask=m))
        F.add(I.attention_ignores_key_bias(impl, inputs, 2, m, rng.standard_normal(6),
                                           rng.standard_normal(inputs["x"].shape)))
        F.add(I.attention_permutation_equivariant(impl, inputs, 2, m, np.array([2, 0, 3, 1])))
    F.add(I.attention_padding_ignored(impl, inputs, 2, mask,
                                      rng.standard_normal(inputs["x"].shape)))
    F.add(I.attention_scaled_by_sqrt_d_k(impl, inputs))
    F.add(I.dtype_kept(impl, F.op, lambda *a: impl.attention_forward(*a, n_heads=2), inputs))


def _check_ffn(impl, F, rng):
    for _ in range(100):  # keep every ReLU pre-activation away from the kink
        x, W_1, b_1 = (rng.standard_normal((2, 3, 4)), rng.standard_normal((4, 8)),
                       0.3 * rng.standard_normal(8))
        if np.min(np.abs(x @ W_1 + b_1)) > 100 * KINK_MARGIN:
            break
    inputs = {"x": x, "W_1": W_1, "b_1": b_1, "W_2": rng.standard_normal((8, 4)),
              "b_2": 0.3 * rng.standard_normal(4)}
    _fd_pair(F, impl.ffn_forward, impl.ffn_backward, inputs, rng)
    F.add(I.dtype_kept(impl, F.op, impl.ffn_forward, inputs))


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
    F.add(I.block_identities(impl, x, p, 2, mask, dout, rng.standard_normal(x.shape)))
    dx, grads = impl.block_backward(dout.copy(), cache)
    if set(grads) != set(p):
        return  # reported by block_identities; FD needs one gradient per parameter

    def f(x, **params):
        return float(np.vdot(impl.block_forward(x, params, n_heads=2, mask=mask)[0], dout))

    F.fd += check_gradients(f, {"x": x, **p}, {"x": dx, **{k: grads[k] for k in p}}, rng=rng,
                            op=F.op)


def _check_pooler(impl, F, rng):
    inputs = {"h": rng.standard_normal((2, 3, 4)), "W": rng.standard_normal((4, 4)),
              "b": 0.3 * rng.standard_normal(4)}
    _fd_pair(F, impl.pooler_forward, impl.pooler_backward, inputs, rng)
    F.add(I.pooler_gradient_only_at_cls(impl, *inputs.values(), rng.standard_normal((2, 4))))


def _check_cross_entropy(impl, F, rng):
    logits = rng.standard_normal((2, 4, 5)) * 2
    labels = np.array([[1, IGNORE_INDEX, 4, 4], [IGNORE_INDEX, IGNORE_INDEX, 0, 2]])
    dloss = 0.7
    for reduction in ("mean", "sum"):
        _, cache = impl.cross_entropy_forward(logits, labels, reduction=reduction)
        (dlogits,) = impl.cross_entropy_backward(dloss, cache)

        def f(logits, _r=reduction):
            return dloss * float(impl.cross_entropy_forward(logits, labels, reduction=_r)[0])

        F.fd += check_gradients(f, {"logits": logits}, {"logits": dlogits}, rng=rng, op=F.op)
    F.add(I.cross_entropy_identities(impl, logits, labels, dloss))
    F.add(I.cross_entropy_shift_invariant(impl, logits, labels, 800.0))


def _check_mse(impl, F, rng):
    y_hat, y = rng.standard_normal((2, 3, 4)), rng.standard_normal((2, 3, 4))
    _fd_pair(F, impl.mse_forward, impl.mse_backward, {"y_hat": y_hat, "y": y}, rng)
    F.add(I.mse_identities(impl, y_hat, y, 0.7))


def _tiny_configs():
    from reference.config import mini_bert, seed001  # config only: no implementation code

    dims = dict(n_layers=2, hidden=8, n_heads=2, intermediate=16, max_len=8, vocab_size=13)
    return {"mini_bert": mini_bert(**dims), "seed001": seed001(**dims)}


def _batch_kwargs(config, batch):
    kw = dict(attention_mask=batch["attention_mask"])
    key = "labels" if config.head == "mlm" else "targets"
    kw[key] = batch[key]
    return kw


def _check_model(impl, F, rng):
    from spec.gradcheck import random_batch, random_params

    for name, config in _tiny_configs().items():
        F.op = f"model[{name}]"
        F.fd += model_gradcheck(impl, config, B=2, T=6, seed=1, n_dirs=2)
        batch = random_batch(config, 2, 6, seed=2)
        kw = _batch_kwargs(config, batch)
        F.add(I.model_gradient_bookkeeping(impl, random_params(impl, config, seed=2), config,
                                           batch["input_ids"], kw))
        p32 = impl.init_params(config, seed=0, dtype=np.float32)
        kw32 = {k: (v.astype(np.float32) if k == "targets" else v) for k, v in kw.items()}
        F.add(I.model_gradient_bookkeeping(impl, p32, config, batch["input_ids"], kw32)[:2])
    F.op = "model"


# ---- optimizer (interface fixed by the project; checked through invariants only)
def _check_adam(impl, F, rng):
    params = {"w": rng.standard_normal((3, 4)), "b": rng.standard_normal(4)}
    # |g| log-uniform in [1e-4, 1], mixed signs: both the placement of eps (which matters when
    # |g| ~ sqrt(eps)) and a missing bias correction (3x too large a first step) show up
    grads = {k: rng.choice([-1.0, 1.0], v.shape) * 10.0 ** rng.uniform(-4, 0, v.shape)
             for k, v in params.items()}
    F.add(I.adam_first_step(impl, params, grads, lr=1e-2, beta2=0.999, eps=1e-8))
    F.add(I.adam_decoupled_decay(impl, params, {"w"}, lr=1e-2, weight_decay=0.1,
                                 no_decay=("b",)))


def _check_schedule(impl, F, rng):
    F.add(I.schedule_shape(impl, peak=1e-3, warmup=10, total=50))


def _check_clip(impl, F, rng):
    grads = {"a": rng.standard_normal((3, 4)), "b": 10 * rng.standard_normal(5)}
    norm = np.sqrt(sum(float((g * g).sum()) for g in grads.values()))
    F.add(I.clip_global_norm(impl, grads, norm / 4))
    F.add(I.clip_global_norm(impl, grads, 2 * norm))


def _check_accumulation(impl, F, rng):
    """Micro-batches with uneven numbers of predicted tokens (one with none), on both heads."""
    from spec.gradcheck import random_params, split_batch, uneven_mlm_batch

    configs = _tiny_configs()
    mlm, mse = configs["mini_bert"], configs["seed001"]
    params = random_params(impl, mlm, seed=4)
    batch = uneven_mlm_batch(mlm, seed=4)
    # predicted tokens per micro-batch: 1 | 6, 0 | 3, 2; and 1 | 6 | 0 (alone) | 3 | 2
    for bounds in ([0, 1, 3, 5], [0, 1, 2, 3, 4, 5]):
        F.add(I.accumulation_matches_full_batch(impl, params, mlm, split_batch(batch, bounds),
                                                f"mlm, micro-batches {bounds}"))
    ids = rng.integers(0, mse.vocab_size, size=(5, 6))
    targets = rng.standard_normal((5, 6, mse.hidden))
    F.add(I.accumulation_matches_full_batch(
        impl, random_params(impl, mse, seed=5), mse,
        split_batch({"input_ids": ids, "targets": targets}, [0, 1, 5]), "mse, 1 | 4 rows"))


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
# the rows are spec.protocol.OPS: an op without fixed-seed inputs here is a bug
assert set(CHECKS) == set(OPS), sorted(set(CHECKS) ^ set(OPS))


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
    failed = [(f.name, f.detail) for f in invariants if not f.ok]
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

