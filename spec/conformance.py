"""Conformance mode: a programmatic per-op checker of any implementation (NumPy only).

The adapter protocol and the op table are in :mod:`spec.protocol`.  The checker is NumPy +
``spec.gradcheck``: backward vs central finite differences in float64 on each op's fixed-seed
example from the table (generic: no per-op code), and the invariants registered for the op in
:mod:`spec.invariants` (``@invariant("op")``); ops the table cannot drive (a params dict, the
whole model) register a bespoke check here (``@bespoke("op")``).  It never imports torch: the
"forward vs oracle" column comes from the PyTorch oracle tests of the suite (tests/), which
``minibert check`` runs in a subprocess when torch is installed, and merges in with
:func:`merge_oracle`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from spec import invariants as I
from spec.gradcheck import check_gradients, model_gradcheck
from spec.protocol import (
    OPS,
    ImplProxy,
    NotApplicable,
    _has,  # noqa: F401  (private helper shared with the loader)
    attention_example,
    label_of,
    not_applicable_message,
    op_of_equation,
    unwrap,
)


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


# --------------------------------------------------------------------------- the generic check
def _fd_pair(F: _Findings, fwd, bwd, inputs: dict, rng, *, kwargs=None, n_dirs=2):
    """FD check of every float input of an op pair with a random (mixed-sign) upstream grad:
    ``fwd(**inputs, **kwargs)``, one gradient per input in ``inputs``' order.
    Returns (out, grads tuple)."""
    kwargs = kwargs or {}
    names = list(inputs)
    out, cache = fwd(**inputs, **kwargs)
    # another forward before the backward, as FD and training loops do: an implementation whose
    # cache is shared state (one object's attributes) now back-propagates the wrong activations
    fwd(**{n: _other(v) for n, v in inputs.items()}, **kwargs)
    dout = rng.standard_normal(np.shape(out))
    if np.ndim(out) == 0:  # a loss: backward takes the upstream gradient as a scalar
        dout = float(dout)
    grads = bwd(np.copy(dout) if isinstance(dout, np.ndarray) else dout, cache)
    if not isinstance(grads, tuple) or len(grads) != len(names):
        got = len(grads) if isinstance(grads, tuple) else type(grads).__name__
        raise AssertionError(f"backward: expected a tuple of {len(names)} gradients "
                             f"({', '.join(names)}), got {got}")

    def f(**kw):
        return float(np.vdot(fwd(**kw, **kwargs)[0], dout))

    checked = {n: g for n, g in zip(names, grads) if inputs[n] is not None}
    F.fd += check_gradients(f, inputs, checked, rng=rng, n_dirs=n_dirs, op=F.op)
    return out, grads


def _other(v):
    """Different values of the same shape and dtype (ints and None unchanged)."""
    if isinstance(v, np.ndarray) and np.issubdtype(v.dtype, np.floating):
        return (v * 1.3 + 0.1).astype(v.dtype)
    return v


# --------------------------------------------------------------------------- bespoke checks
# Ops the generic check cannot drive from a table entry (a params dict, whole models) register
# their own fixed-seed check here by name: ``f(impl, F, rng)`` adds FD results and findings.
BESPOKE: dict[str, list[Callable]] = {}


def bespoke(*ops: str):
    """Register ``f(impl, findings, rng)`` as a bespoke conformance check of ``ops``."""
    unknown = [op for op in ops if op not in OPS]
    if unknown:
        raise ValueError(f"bespoke: {unknown} are not ops of spec.protocol.OPS")

    def register(f):
        for op in ops:
            BESPOKE.setdefault(op, []).append(f)
        return f

    return register


def _block_params(rng, H=6, I=12):
    a = attention_example(rng, H)
    p = {f"attn.{k}": v for k, v in a.items() if k != "x"}
    p["ln1.gamma"], p["ln1.beta"] = 1 + 0.4 * rng.standard_normal(H), 0.2 * rng.standard_normal(H)
    p["ffn.W_1"], p["ffn.b_1"] = 0.5 * rng.standard_normal((H, I)), 0.2 * rng.standard_normal(I)
    p["ffn.W_2"], p["ffn.b_2"] = 0.5 * rng.standard_normal((I, H)), 0.2 * rng.standard_normal(H)
    p["ln2.gamma"], p["ln2.beta"] = 1 + 0.4 * rng.standard_normal(H), 0.2 * rng.standard_normal(H)
    return a["x"], p


@bespoke("block")
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


def _tiny_configs():
    from reference.config import bert_tiny, mini_bert, seed001  # config only: no code

    dims = dict(n_layers=2, hidden=8, n_heads=2, intermediate=16, max_len=8, vocab_size=13)
    return {"mini_bert": mini_bert(**dims), "seed001": seed001(**dims),
            "bert_tiny": bert_tiny(**dims),
            "bert_classifier": bert_tiny(**dims, head="classifier", num_labels=3,
                                         activation="gelu_tanh")}


def _batch_kwargs(config, batch):
    kw = dict(attention_mask=batch["attention_mask"])
    if config.head == "classifier":
        kw["labels"] = batch["class_labels"]
    else:
        key = "labels" if config.head == "mlm" else "targets"
        kw[key] = batch[key]
    if "token_type_ids" in batch:
        kw["token_type_ids"] = batch["token_type_ids"]
    return kw


@bespoke("model")
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


@bespoke("accumulation")
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


def coverage_gaps() -> dict[str, str]:
    """Ops of the table that ``check_op`` would check nothing of (or an op pair whose backward
    it cannot check): op -> what is missing.  Empty when the table is complete."""
    gaps = {}
    for name, row in OPS.items():
        fd = row.example is not None and row.pair is not None
        if row.pair is not None and not fd and name not in BESPOKE:
            gaps[name] = ("an op pair with neither an example in spec/protocol.py nor a "
                          "bespoke check")
        elif not (fd or name in BESPOKE or name in I.INVARIANTS):
            gaps[name] = "no example, bespoke check or registered invariant"
    return gaps


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
        return Cell("n/a", "no invariants registered")
    failed = [(f.name, f.detail) for f in invariants if not f.ok]
    if failed:
        return Cell("FAIL", "; ".join(f"{n}" + (f" ({d})" if d else "") for n, d in failed))
    return Cell("ok", f"{len(invariants)} hold")


def check_op(impl, op: str, seed: int = 0) -> OpReport:
    """Run the backward-vs-FD and invariant checks of one op: the generic FD check of its table
    entry's examples (spec.protocol), its bespoke check if it has one, and the invariants
    registered for it (spec.invariants)."""
    report = OpReport(op)
    obj = unwrap(impl)
    row = OPS[op]
    missing = [n for n in row.names if not _has(obj, n)]
    if missing:
        msg = not_applicable_message(label_of(impl), ", ".join(missing))
        report.backward = report.invariants = Cell("n/a", msg)
        return report
    F = _Findings(op)
    rng = np.random.default_rng(seed)
    proxy = ImplProxy(obj, label_of(impl))
    crashed = {}
    try:
        examples = row.examples(rng)
        try:
            if row.pair is not None:
                fwd, bwd = (getattr(proxy, n) for n in row.pair)
                for ex in examples:
                    _fd_pair(F, fwd, bwd, ex.inputs, rng, kwargs=ex.fixed)
            for check in BESPOKE.get(op, ()):
                check(proxy, F, rng)
        except NotApplicable:
            raise
        except Exception as e:  # a crash is a failure of the op, reported with its message
            crashed["backward"] = e
        try:
            for bind in I.INVARIANTS.get(op, ()):
                for ex in examples or [None]:
                    F.add(bind(proxy, ex, rng))
        except NotApplicable:
            raise
        except Exception as e:
            crashed["invariants"] = e
    except NotApplicable as e:
        report.backward = report.invariants = Cell("n/a", str(e))
        return report
    report.backward = _summarise_fd(F.fd)
    report.invariants = _summarise_inv(F.invariants)
    for col, e in crashed.items():
        setattr(report, col, Cell("FAIL", f"raised {type(e).__name__}: {e}"))
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

