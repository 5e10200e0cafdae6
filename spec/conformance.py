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

import copy
import re
import signal
import threading
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np

from spec import invariants as inv
from spec.gradcheck import check_gradients, model_gradcheck
from spec.protocol import (
    OPS,
    ImplProxy,
    NotApplicable,
    _has,  # noqa: F401  (private helper shared with the loader)
    attention_example,
    capabilities,
    label_of,
    not_applicable_message,
    op_of_equation,
    op_registrar,
    unwrap,
)


# --------------------------------------------------------------------------- report model
@dataclass
class Cell:
    status: str  # "ok", "FAIL" or "n/a"
    detail: str = ""


# the report's columns: (attribute, heading); forward and backward findings apart
COLUMNS = (("forward", "forward vs oracle"), ("oracle_backward", "backward vs oracle"),
           ("backward", "backward vs FD"), ("invariants", "invariants"))


@dataclass
class OpReport:
    op: str
    forward: Cell = field(default_factory=lambda: Cell("n/a", "no oracle run"))
    oracle_backward: Cell = field(default_factory=lambda: Cell("n/a", "no oracle run"))
    backward: Cell = field(default_factory=lambda: Cell("n/a"))
    invariants: Cell = field(default_factory=lambda: Cell("n/a"))
    conventions: list = field(default_factory=list)  # "name: what it changes"

    @property
    def cells(self) -> list[Cell]:
        return [getattr(self, attr) for attr, _ in COLUMNS]

    @property
    def verdict(self) -> str:
        if any(c.status == "FAIL" for c in self.cells):
            return "FAIL"
        if all(c.status == "n/a" for c in self.cells):
            return "n/a"
        return "ok"

    @property
    def checked(self) -> bool:
        """Something of the implementation was checked for this op (not only the oracle's
        records: FD or invariants ran)."""
        return self.backward.status != "n/a" or self.invariants.status != "n/a"

    @property
    def failures(self) -> list[str]:
        return [f"{self.op} {attr.replace('_', ' ')}: {c.detail}" for attr, _ in COLUMNS
                if (c := getattr(self, attr)).status == "FAIL"]


class OpTimeout(BaseException):
    """An op's check ran past its time limit (a BaseException: ``except Exception`` in the
    implementation cannot swallow it)."""


@contextmanager
def time_limit(seconds: float | None, what: str):
    """Raise :class:`OpTimeout` in the main thread after ``seconds`` (SIGALRM; no limit where
    that is unavailable: off the main thread, or on Windows).  Measured cost: ~10 us a call."""
    usable = (seconds and hasattr(signal, "setitimer")
              and threading.current_thread() is threading.main_thread())
    if not usable:
        yield
        return

    def expire(signum, frame):
        raise OpTimeout(f"{what} did not finish within {seconds:g} s (--timeout)")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


class _Findings:
    """Collects the FD results and the invariant findings of one op."""

    def __init__(self, op: str):
        self.op = op
        self.fd: list = []
        self.invariants: list[inv.Finding] = []

    def add(self, findings: list[inv.Finding]) -> None:
        self.invariants += findings


# --------------------------------------------------------------------------- the generic check
def _fd_pair(F: _Findings, fwd, bwd, inputs: dict, rng, *, kwargs=None, n_dirs=2):
    """FD check of every float input of an op pair with a random (mixed-sign) upstream grad:
    ``fwd(**inputs, **kwargs)``, one gradient per input in ``inputs``' order.
    Returns (out, grads tuple)."""
    kwargs = kwargs or {}
    names = list(inputs)
    # every op pair, first (on copies, before anything could have changed the inputs): inputs
    # never modified in place, float32 in -> float32 out
    out, _ = fwd(**copy.deepcopy(inputs), **copy.deepcopy(kwargs))
    probe = rng.standard_normal(np.shape(out))
    F.add(inv.pair_contract(None, F.op, fwd, bwd, inputs, kwargs,
                            float(probe) if np.ndim(out) == 0 else probe))
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


# @bespoke("op", ...) registers f(impl, findings, rng) as a bespoke conformance check
bespoke = op_registrar(BESPOKE, "bespoke")


def _block_example_params(rng, H=6, I=12):
    a = attention_example(rng, H)
    p = {f"attn.{k}": v for k, v in a.items() if k != "x"}
    p["ln1.gamma"], p["ln1.beta"] = 1 + 0.4 * rng.standard_normal(H), 0.2 * rng.standard_normal(H)
    p["ffn.W_1"], p["ffn.b_1"] = 0.5 * rng.standard_normal((H, I)), 0.2 * rng.standard_normal(I)
    p["ffn.W_2"], p["ffn.b_2"] = 0.5 * rng.standard_normal((I, H)), 0.2 * rng.standard_normal(H)
    p["ln2.gamma"], p["ln2.beta"] = 1 + 0.4 * rng.standard_normal(H), 0.2 * rng.standard_normal(H)
    return a["x"], p


@bespoke("block")
def _check_block(impl, F, rng):
    x, p = _block_example_params(rng)
    mask = np.array([[1, 1, 1, 1], [1, 1, 1, 0]])
    caps = capabilities(impl)
    if not caps["attention_bias"]:
        p = {k: v for k, v in p.items() if not k.startswith("attn.b_")}
    out, cache = impl.block_forward(x, p, n_heads=2, mask=mask if caps["key_mask"] else None)
    dout = rng.standard_normal(out.shape)
    noise = rng.standard_normal(x.shape)
    if caps["key_mask"]:
        F.add(inv.block_identities(impl, x, p, 2, mask, dout, noise))
    else:
        mask = None
    F.add(inv.pair_contract(impl, "block", lambda x, p, **kw: impl.block_forward(x, p, **kw),
                            impl.block_backward, {"x": x, "p": p},
                            {"n_heads": 2, "mask": mask}, dout))
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
        F.add(inv.model_gradient_bookkeeping(impl, random_params(impl, config, seed=2), config,
                                             batch["input_ids"], kw))
        p32 = impl.init_params(config, seed=0, dtype=np.float32)
        kw32 = {k: (v.astype(np.float32) if k == "targets" else v) for k, v in kw.items()}
        F.add(inv.model_gradient_bookkeeping(impl, p32, config, batch["input_ids"], kw32)[:2])
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
        F.add(inv.accumulation_matches_full_batch(impl, params, mlm, split_batch(batch, bounds),
                                                  f"mlm, micro-batches {bounds}"))
    ids = rng.integers(0, mse.vocab_size, size=(5, 6))
    targets = rng.standard_normal((5, 6, mse.hidden))
    F.add(inv.accumulation_matches_full_batch(
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
        elif not (fd or name in BESPOKE or name in inv.INVARIANTS):
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
    conventions = sum(f.convention for f in invariants)
    return Cell("ok", f"{len(invariants)} hold"
                      + (f" ({conventions} by convention)" if conventions else ""))


def _examples(op: str, caps: dict, rng) -> list:
    """The op's table examples, adapted to what the implementation claims (CAPABILITIES):
    no biases, no masks where they are not claimed."""
    examples = OPS[op].examples(rng)
    if op in ("attention", "softmax") and not caps["key_mask"]:
        examples = [ex for ex in examples if ex.fixed.get("mask") is None]
    if op == "attention" and not caps["attention_bias"]:
        for ex in examples:
            ex.inputs.update({k: None for k in ("b_q", "b_k", "b_v", "b_o")})
    return examples


def _impl_error(e: BaseException) -> bool:
    """A BaseException the checker reports as the op's failure (not a real Ctrl-C)."""
    from spec import protocol

    return not (isinstance(e, KeyboardInterrupt) and protocol._SIGINT_SEEN)


def _one_line(e: BaseException) -> str:
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0][:200]}" if text else type(e).__name__


def check_op(impl, op: str, seed: int = 0, timeout: float | None = None) -> OpReport:
    """Run the backward-vs-FD and invariant checks of one op: the generic FD check of its table
    entry's examples (spec.protocol), its bespoke check if it has one, the contract of every
    op pair (inputs untouched, float32 kept) and the invariants registered for it
    (spec.invariants).  Anything the implementation raises -- ``SystemExit`` and
    ``KeyboardInterrupt`` included -- fails the op with its message, and so does running past
    ``timeout`` seconds (the whole op's checks)."""
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
    column = "backward"
    try:
        with time_limit(timeout, f"{op}: the checks"):
            examples = _examples(op, proxy._impl_caps, rng)
            try:
                if row.pair is not None:
                    fwd, bwd = (getattr(proxy, n) for n in row.pair)
                    for ex in examples:
                        _fd_pair(F, fwd, bwd, ex.inputs, rng, kwargs=ex.fixed)
                for check in BESPOKE.get(op, ()):
                    check(proxy, F, rng)
            except (NotApplicable, OpTimeout):
                raise
            except BaseException as e:  # a crash is a failure of the op, with its message
                if not _impl_error(e):
                    raise
                crashed["backward"] = e
            column = "invariants"
            try:
                for bind in inv.INVARIANTS.get(op, ()):
                    for ex in examples or [None]:
                        F.add(bind(proxy, ex, rng))
            except (NotApplicable, OpTimeout):
                raise
            except BaseException as e:
                if not _impl_error(e):
                    raise
                crashed["invariants"] = e
    except NotApplicable as e:
        report.backward = report.invariants = Cell("n/a", str(e))
        return report
    except OpTimeout as e:
        crashed[column] = e
    report.backward = _summarise_fd(F.fd)
    report.invariants = _summarise_inv(F.invariants)
    report.conventions = [f"{f.name}: {f.detail}" for f in F.invariants if f.convention]
    for col, e in crashed.items():
        msg = str(e) if isinstance(e, OpTimeout) else f"raised {_one_line(e)}"
        setattr(report, col, Cell("FAIL", msg))
    return report


def check_all(impl, ops=None, seed: int = 0, timeout: float | None = None) -> list[OpReport]:
    """The programmatic conformance checks of every op (or of ``ops``), each op within
    ``timeout`` seconds."""
    return [check_op(impl, op, seed, timeout) for op in (ops or OPS)]


BACKWARD_NAMES = frozenset(n for row in OPS.values() for n in row.names
                           if n.endswith("_backward")) | {"backward", "loss_and_grads",
                                                          "accumulate_gradients"}


def credited_ops(record: dict) -> set[str]:
    """The ops a test record counts for: those its equation IDs and oracle marker name, and of
    those only the ops whose protocol names the test actually called through the proxy (the
    record's ``called``): a test that never touched the implementation credits nothing, an FFN
    test credits ``relu`` only if it called ``relu_forward``.  Records without ``called`` (an
    older conftest) credit what they declare."""
    declared = ({op_of_equation(e) for e in record.get("equations", ())}
                | set(record.get("ops", ()))) & set(OPS)
    if "called" not in record:
        return declared
    called = set(record["called"])
    return {op for op in declared if called & set(OPS[op].names)}


def _sides(op: str, rec: dict) -> tuple[str, ...]:
    """The oracle cells a record counts for: a passed (or skipped) test for "forward vs oracle",
    and for "backward vs oracle" too when it called the op's backward; a failed test for the
    backward only when it called the backward and its message does not name the forward (the
    oracle tests compare the forward output first, then each gradient)."""
    bwd = bool(set(rec.get("called", ())) & BACKWARD_NAMES & set(OPS[op].names))
    if rec["outcome"] != "failed":
        return ("forward", "oracle_backward") if bwd else ("forward",)
    forward_named = re.search(r"\bforward\b", rec.get("message", "") or "")
    return ("oracle_backward",) if bwd and not forward_named else ("forward",)


def merge_oracle(reports: list[OpReport], records: list[dict]) -> None:
    """Fill the oracle cells from test records (``{"nodeid", "outcome", "equations", "ops",
    "called", "message"}``, as the conftest's MINIBERT_REPORT hook writes them): a test counts
    for the ops :func:`credited_ops` gives, in the cells :func:`_sides` gives."""
    by_op: dict[str, dict[str, list[dict]]] = {}
    for rec in records:
        for op in credited_ops(rec):
            for side in _sides(op, rec):
                by_op.setdefault(op, {}).setdefault(side, []).append(rec)
    for report in reports:
        for side in ("forward", "oracle_backward"):
            recs = by_op.get(report.op, {}).get(side, [])
            ran = [r for r in recs if r["outcome"] in ("passed", "failed")]
            failed = [r for r in ran if r["outcome"] == "failed"]
            if failed:
                first = failed[0]
                cell = Cell("FAIL", f"{len(failed)}/{len(ran)} oracle tests failed, first "
                                    f"{first['nodeid']}"
                                    + (f": {first['message']}" if first.get("message") else ""))
            elif ran:
                cell = Cell("ok", f"{len(ran)} oracle tests")
            elif recs:
                cell = Cell("n/a", "oracle tests skipped")
            else:
                cell = Cell("n/a", "no oracle test exercised this op")
            setattr(report, side, cell)
