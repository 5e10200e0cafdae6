"""Fixed-seed checks derived from the op table alone: every op pair's backward against finite
differences on its table ``example`` (spec.protocol), the op-pair contract (inputs untouched,
float32 kept), the identities registered for the op (``@invariant("op")`` in
spec.numerics.identities), and bespoke checks for what the table cannot drive (a block's params
dict, whole models, gradient accumulation).  They need no Hypothesis draw, so they are the first
and fastest evidence on a new implementation (and what a mutant trips first).
"""

from __future__ import annotations

import copy

import numpy as np

from spec.numerics import identities as inv
from spec.numerics.finite_differences import assert_all_passed, check_gradients, model_gradcheck
from spec.numerics.identities import require
from spec.protocol import IGNORE_INDEX, OPS, NotApplicable, attention_example, capabilities
from spec.protocol.capabilities import VARIANTS, resolve_variant
from spec.suite.registry import check

SEED = 0


# --------------------------------------------------------------------------- helpers
def examples(op: str, caps: dict, rng) -> list:
    """The op's table examples, adapted to what the implementation claims (CAPABILITIES):
    no biases, no masks where they are not claimed, and each op in the variant it declares
    (its standard form where it has it): no gamma/beta, eps 0, no b_2, no W_o, causal, the
    predicted rows gathered for a cross-entropy without ignore_index."""
    exs = OPS[op].examples(rng)
    if op in ("attention", "softmax") and not caps["key_mask"]:
        exs = [ex for ex in exs if ex.fixed.get("mask") is None]
    if op == "attention" and not caps["attention_bias"]:
        for ex in exs:
            ex.inputs.update({k: None for k in ("b_q", "b_k", "b_v", "b_o")})
    v = resolve_variant(caps, op) if op in VARIANTS else {}
    for ex in exs:
        if op == "layernorm":
            if not v["affine"]:
                ex.inputs.update(gamma=None, beta=None)
            if not v["eps"]:
                ex.fixed["eps"] = 0.0
        elif op == "ffn" and not v["b_2"]:
            ex.inputs["b_2"] = None
        elif op == "attention":
            if not v["W_o"]:
                ex.inputs.update(W_o=None, b_o=None)
            if v["causal"]:
                ex.fixed["causal"] = True
                if ex.fixed.get("mask") is not None:
                    ex.fixed["mask"] = np.asarray(ex.fixed["mask"]).copy()
                    ex.fixed["mask"][:, 0] = True  # the first query needs key 0
        elif op == "cross_entropy" and not v["ignore_index"]:
            labels = ex.fixed["labels"]
            keep = labels != IGNORE_INDEX  # the predicted rows, gathered: [N, V]
            ex.inputs["logits"] = ex.inputs["logits"][keep]
            ex.fixed["labels"] = labels[keep]
    return exs


def _variant(e: NotApplicable) -> NotApplicable:
    """``e`` when it is about a variant of the call (a keyword, bias or mask not taken); a
    missing name is re-raised: it makes the whole check n/a, never a partial pass."""
    if " lacks " in str(e):
        raise e
    return e


def _other(v):
    """Different values of the same shape and dtype (ints and None unchanged)."""
    if isinstance(v, np.ndarray) and np.issubdtype(v.dtype, np.floating):
        return (v * 1.3 + 0.1).astype(v.dtype)
    return v


def fd_pair(op: str, fwd, bwd, inputs: dict, rng, *, kwargs=None, n_dirs=2) -> list:
    """FD check of every float input of an op pair with a random (mixed-sign) upstream grad:
    ``fwd(**inputs, **kwargs)``, one gradient per input in ``inputs``' order.  A second
    forward runs before the backward, as FD and training loops do: an implementation whose
    cache is shared state (one object's attributes) then back-propagates the wrong
    activations.  Returns the FD results."""
    kwargs = kwargs or {}
    names = list(inputs)
    out, cache = fwd(**inputs, **kwargs)
    fwd(**{n: _other(v) for n, v in inputs.items()}, **kwargs)
    dout = rng.standard_normal(np.shape(out))
    if np.ndim(out) == 0:  # a loss: backward takes the upstream gradient as a scalar
        dout = float(dout)
    grads = bwd(np.copy(dout) if isinstance(dout, np.ndarray) else dout, cache)
    if not isinstance(grads, tuple) or len(grads) != len(names):
        got = len(grads) if isinstance(grads, tuple) else type(grads).__name__
        raise AssertionError(f"{op} backward: expected a tuple of {len(names)} gradients "
                             f"({', '.join(names)}), got {got}")

    def f(**kw):
        return float(np.vdot(fwd(**kw, **kwargs)[0], dout))

    checked = {n: g for n, g in zip(names, grads) if inputs[n] is not None}
    return check_gradients(f, inputs, checked, rng=rng, n_dirs=n_dirs, op=op)


def contract(op: str, fwd, bwd, inputs: dict, kwargs: dict, rng) -> list:
    """The op-pair contract on copies: inputs never modified in place, float32 in -> float32
    out (outputs and gradients)."""
    out, _ = fwd(**copy.deepcopy(inputs), **copy.deepcopy(kwargs))
    probe = rng.standard_normal(np.shape(out))
    return inv.pair_contract(None, op, fwd, bwd, inputs, kwargs,
                             float(probe) if np.ndim(out) == 0 else probe)


def require_names(impl, op: str) -> None:
    """Read every protocol name of the op: one the implementation lacks makes the check not
    applicable (the proxy raises NotApplicable) before anything runs."""
    for name in OPS[op].names:
        getattr(impl, name)


# --------------------------------------------------------------------------- table ops
def _table_fd_cases():
    return [(f"{op}.example", {"op": op}) for op, row in OPS.items()
            if row.pair is not None and row.example is not None]


def _table_invariant_cases():
    return [(f"{op}.example", {"op": op}) for op, row in OPS.items()
            if (row.pair is not None and row.example is not None) or op in inv.INVARIANTS]


@check("fd", "", cases=_table_fd_cases(), ops=lambda kw: (kw["op"],),
       equations=lambda kw: OPS[kw["op"]].equations)
def table_example_fd(impl, op):
    """The op pair's backward against central differences on its fixed-seed example."""
    require_names(impl, op)
    rng = np.random.default_rng(SEED)
    fwd, bwd = (getattr(impl, n) for n in OPS[op].pair)
    results, skipped = [], None
    for ex in examples(op, capabilities(impl), rng):
        try:  # a variant the implementation does not take (n/a) leaves the others checked
            results += fd_pair(op, fwd, bwd, ex.inputs, rng, kwargs=ex.fixed)
        except NotApplicable as e:
            skipped = _variant(e)
    if not results and skipped is not None:
        raise skipped
    assert_all_passed(results)


@check("invariant", "", cases=_table_invariant_cases(), ops=lambda kw: (kw["op"],),
       equations=lambda kw: OPS[kw["op"]].equations)
def table_example_invariants(impl, op):
    """The op-pair contract and the identities registered for the op, on its fixed-seed
    example."""
    require_names(impl, op)
    rng = np.random.default_rng(SEED)
    row = OPS[op]
    exs = examples(op, capabilities(impl), rng) if row.example is not None else []
    found, skipped = [], None
    if row.pair is not None:
        fwd, bwd = (getattr(impl, n) for n in row.pair)
        for ex in exs:
            try:  # a variant the implementation does not take (n/a) leaves the others checked
                found += contract(op, fwd, bwd, ex.inputs, ex.fixed, rng)
            except NotApplicable as e:
                skipped = _variant(e)
    for bind in inv.INVARIANTS.get(op, ()):
        for ex in exs or [None]:
            try:
                found += bind(impl, ex, rng)
            except NotApplicable as e:
                skipped = _variant(e)
    if not found and skipped is not None:
        raise skipped
    require(found)


# --------------------------------------------------------------------------- block
def block_params(rng, H=6, I=12, norm="post"):
    a = attention_example(rng, H)
    p = {f"attn.{k}": v for k, v in a.items() if k != "x"}
    p["ln1.gamma"], p["ln1.beta"] = 1 + 0.4 * rng.standard_normal(H), 0.2 * rng.standard_normal(H)
    p["ffn.W_1"], p["ffn.b_1"] = 0.5 * rng.standard_normal((H, I)), 0.2 * rng.standard_normal(I)
    p["ffn.W_2"], p["ffn.b_2"] = 0.5 * rng.standard_normal((I, H)), 0.2 * rng.standard_normal(H)
    p["ln2.gamma"], p["ln2.beta"] = 1 + 0.4 * rng.standard_normal(H), 0.2 * rng.standard_normal(H)
    if norm == "pre_final":
        p["ln_f.gamma"] = 1 + 0.4 * rng.standard_normal(H)
        p["ln_f.beta"] = 0.2 * rng.standard_normal(H)
    return a["x"], p


def _block_case(impl):
    """The fixed-seed block in the form the implementation declares (its standard form where
    it has it): biases, key mask, norm, causal; ``variant`` are the keywords to pass."""
    rng = np.random.default_rng(SEED)
    caps = capabilities(impl)
    v = resolve_variant(caps, "block")
    x, p = block_params(rng, norm=v["norm"])
    if not caps["attention_bias"]:
        p = {k: v for k, v in p.items() if not k.startswith("attn.b_")}
    mask = np.array([[1, 1, 1, 1], [1, 1, 1, 0]]) if caps["key_mask"] else None
    variant = {**({"norm": v["norm"]} if v["norm"] != "post" else {}),
               **({"causal": True} if v["causal"] else {})}
    return rng, x, p, mask, variant


@check("fd", "block.example", ops=("block",), equations=OPS["block"].equations)
def block_example_fd(impl):
    """Every block parameter and x against central differences, padded batch."""
    rng, x, p, mask, variant = _block_case(impl)
    out, cache = impl.block_forward(x, p, n_heads=2, mask=mask, **variant)
    dout = rng.standard_normal(out.shape)
    dx, grads = impl.block_backward(dout.copy(), cache)
    assert set(grads) == set(p), (f"block_backward: gradient keys {sorted(grads)} differ from "
                                  f"the parameter keys {sorted(p)}")

    def f(x, **params):
        return float(np.vdot(impl.block_forward(x, params, n_heads=2, mask=mask,
                                                **variant)[0], dout))

    assert_all_passed(check_gradients(f, {"x": x, **p}, {"x": dx, **{k: grads[k] for k in p}},
                                      rng=rng, op="block"))


@check("invariant", "block.example", ops=("block",), equations=OPS["block"].equations)
def block_example_invariants(impl):
    """The block's identities (padding ignored, gradient keys) and the op-pair contract."""
    rng, x, p, mask, variant = _block_case(impl)
    out, _ = impl.block_forward(x, p, n_heads=2, mask=mask, **variant)
    dout = rng.standard_normal(out.shape)
    noise = rng.standard_normal(x.shape)
    found = []
    if mask is not None:
        found += inv.block_identities(impl, x, p, 2, mask, dout, noise, **variant)
    found += inv.pair_contract(impl, "block", lambda x, p, **kw: impl.block_forward(x, p, **kw),
                               impl.block_backward, {"x": x, "p": p},
                               {"n_heads": 2, "mask": mask, **variant}, dout)
    require(found)


# --------------------------------------------------------------------------- whole models
def tiny_configs():
    from reference.config import bert_tiny, mini_bert, seed001  # config only: no code

    dims = dict(n_layers=2, hidden=8, n_heads=2, intermediate=16, max_len=8, vocab_size=13)
    return {"mini_bert": mini_bert(**dims), "seed001": seed001(**dims),
            "bert_tiny": bert_tiny(**dims),
            "bert_classifier": bert_tiny(**dims, head="classifier", num_labels=3,
                                         activation="gelu_tanh")}


def batch_kwargs(config, batch):
    kw = dict(attention_mask=batch["attention_mask"])
    if config.head == "classifier":
        kw["labels"] = batch["class_labels"]
    else:
        key = "labels" if config.head == "mlm" else "targets"
        kw[key] = batch[key]
    if "token_type_ids" in batch:
        kw["token_type_ids"] = batch["token_type_ids"]
    return kw


_MODEL_EQUATIONS = ("mlm_head.tied",)


@check("fd", "model.example", cases=[(n, {"config_name": n}) for n in
                                     ("mini_bert", "seed001", "bert_tiny", "bert_classifier")],
       ops=("model",), equations=_MODEL_EQUATIONS)
def model_example_fd(impl, config_name):
    """Every parameter tensor and the input embeddings of a tiny model against directional
    central differences (padded batch, float64)."""
    config = tiny_configs()[config_name]
    assert_all_passed(model_gradcheck(impl, config, B=2, T=6, seed=1, n_dirs=2))


@check("invariant", "model.example", cases=[(n, {"config_name": n}) for n in
                                            ("mini_bert", "seed001", "bert_tiny",
                                             "bert_classifier")],
       ops=("model",), equations=_MODEL_EQUATIONS)
def model_example_bookkeeping(impl, config_name):
    """Gradient keys, shapes and dtypes equal the parameters' (float64 and float32)."""
    from spec.numerics.finite_differences import random_batch, random_params

    config = tiny_configs()[config_name]
    batch = random_batch(config, 2, 6, seed=2)
    kw = batch_kwargs(config, batch)
    found = inv.model_gradient_bookkeeping(impl, random_params(impl, config, seed=2), config,
                                           batch["input_ids"], kw)
    p32 = impl.init_params(config, seed=0, dtype=np.float32)
    kw32 = {k: (v.astype(np.float32) if k == "targets" else v) for k, v in kw.items()}
    found += inv.model_gradient_bookkeeping(impl, p32, config, batch["input_ids"], kw32)[:2]
    require(found)


@check("invariant", "accumulation.example", ops=("accumulation",),
       equations=("accum.grad_mean",))
def accumulation_example(impl):
    """Micro-batches with uneven numbers of predicted tokens (one with none), on both heads:
    the accumulated loss and gradient equal the full batch's."""
    from spec.numerics.finite_differences import random_params, split_batch, uneven_mlm_batch

    configs = tiny_configs()
    mlm, mse = configs["mini_bert"], configs["seed001"]
    params = random_params(impl, mlm, seed=4)
    batch = uneven_mlm_batch(mlm, seed=4)
    found = []
    # predicted tokens per micro-batch: 1 | 6, 0 | 3, 2; and 1 | 6 | 0 (alone) | 3 | 2
    for bounds in ([0, 1, 3, 5], [0, 1, 2, 3, 4, 5]):
        found += inv.accumulation_matches_full_batch(impl, params, mlm,
                                                     split_batch(batch, bounds),
                                                     f"mlm, micro-batches {bounds}")
    rng = np.random.default_rng(SEED)
    ids = rng.integers(0, mse.vocab_size, size=(5, 6))
    targets = rng.standard_normal((5, 6, mse.hidden))
    found += inv.accumulation_matches_full_batch(
        impl, random_params(impl, mse, seed=5), mse,
        split_batch({"input_ids": ids, "targets": targets}, [0, 1, 5]), "mse, 1 | 4 rows")
    require(found)
