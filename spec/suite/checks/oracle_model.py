"""The whole encoder against PyTorch, both presets: the model rebuilt in torch from the same flat
parameter dict (spec/suite/torch_oracle.py: F.embedding, nn.TransformerEncoderLayer post-LN blocks,
F.layer_norm, F.linear, F.cross_entropy / F.mse_loss) and differentiated by torch.autograd.

Compared: the output (MLM logits or hidden states), the loss, every parameter gradient and the
gradient w.r.t. the input embeddings (token + position sum).  Random gamma/beta/biases
(minibert_spec.numerics.finite_differences.random_params), batch > 1 with repeated ids, a padding
mask and ignored labels (minibert_spec.numerics.finite_differences.random_batch); within
ORACLE_RTOL_F64 / ORACLE_RTOL_F32 of each tensor's magnitude (torch_oracle.allowed_error says why
that, and not entry by entry).
"""

from __future__ import annotations

import numpy as np

from minibert_reference.config import mini_bert, seed001
from minibert_spec.numerics.finite_differences import random_batch, random_params
from minibert_spec.protocol import IGNORE_INDEX, OPS, capabilities
from minibert_spec.protocol.variants import with_pinned_config
from minibert_spec.suite.checks.model import mini_bert_size
from minibert_spec.suite.registry import check, lazy_module

to = lazy_module("minibert_spec.suite.torch_oracle")

# the rows of the protocol the whole encoder exercises (derived: a new op is one OPS entry)
MODEL_OPS = ("embedding", "position_embedding", "sinusoidal_position", "linear", "layernorm",
             "softmax", "relu", "heads", "attention", "ffn", "block")
MODEL_EQUATIONS = tuple(e for op in MODEL_OPS for e in OPS[op].equations)
LOSS_EQUATIONS = OPS["cross_entropy"].equations + OPS["mse"].equations

# Every ReLU pre-activation of the batch is at least this far from 0 (float64, torch).  float32
# pre-activations differ from float64 by up to 5.4e-6 at the Mini-BERT sizes (measured, torch
# float32 vs float64), and a ReLU flipped by that changes whole rows of dW_1 (seed 1 at B=3,
# T=12 has one at 3.9e-7: torch float32 itself is then 6e-3 off).  10x that error; FD's
# KINK_MARGIN (1e-3) is out of reach with ~4e4 pre-activations of size ~1 (smallest ~1e-5).
MODEL_KINK_MARGIN = 5e-5

# (preset, config, B, T, seed): the real sizes of both presets at small B, T, plus shrunk
# configs over several seeds (T = 1 included).  Every case is checked for kinks first.
SMALL = dict(n_layers=2, hidden=12, n_heads=3, intermediate=20, vocab_size=13, max_len=9)
CASES = [
    ("mini_bert", mini_bert(), 3, 8, 6),
    ("mini_bert", mini_bert(), 2, 12, 6),
    ("seed001", seed001(), 3, 8, 2),
    ("mini_bert-small", mini_bert(**SMALL), 2, 9, 1),
    ("mini_bert-small", mini_bert(**SMALL), 3, 1, 2),
    ("seed001-small", seed001(**SMALL), 2, 9, 1),
    ("seed001-small", seed001(**SMALL), 3, 1, 2),
]
case_ids = [f"{name}-B{B}-T{T}-s{seed}" for name, _, B, T, seed in CASES]
# the MLM head's loss in both reductions, hidden states with MSE (it has a single reduction)
LOSS_CASES = [(*case, loss) for case in CASES
              for loss in (("mean", "sum") if case[1].head == "mlm" else ("mse",))]
loss_case_ids = [f"{name}-B{B}-T{T}-s{seed}-{loss}" for name, _, B, T, seed, loss in LOSS_CASES]
DTYPES = (("f64", np.float64), ("f32", np.float32))


def make_case(impl, config, B, T, seed, dtype):
    """float params (random gamma/beta/biases) and a batch, with its preconditions asserted."""
    params64 = random_params(impl, config, seed)
    batch = random_batch(config, B, T, seed)
    ids, mask, labels = batch["input_ids"], batch["attention_mask"], batch["labels"]
    if T == 1:  # random_batch predicts every single-token sequence: ignore the last one
        labels[-1, 0] = IGNORE_INDEX
    assert B > 1, "the oracle runs need batch > 1"
    assert len(np.unique(ids)) < ids.size, "the batch needs repeated token ids"
    if T > 1:
        assert not mask.all(), "the batch needs padding"
    assert (labels == IGNORE_INDEX).any() and (labels != IGNORE_INDEX).any(), (
        "labels need both ignored and predicted positions")
    cond = to.model_conditioning(params64, config, ids, mask)
    assert cond["relu"] > MODEL_KINK_MARGIN, (
        f"seed {seed}: a ReLU pre-activation is {cond['relu']:.1e} from its kink; pick another "
        "seed (the comparison would test rounding, not the backward)")
    params = {k: v.astype(dtype) for k, v in params64.items()}
    return params, dict(batch, targets=batch["targets"].astype(dtype))


def exactly_zero(name: str, T: int) -> bool:
    """Parameters whose exact gradient is 0: the key bias (softmax is shift invariant along
    the keys) and, with a single token (T = 1, attention weights identically 1), every
    query/key parameter."""
    leaf = name.rsplit(".", 1)[-1]
    return ".attn." in name and (leaf == "b_k" or (T == 1 and leaf in ("W_q", "W_k", "b_q")))


def compare_grads(label, grads, d_emb, theirs, dtype, params, T):
    """Every parameter gradient and the input-embedding gradient.

    Each is judged relative to its own magnitude (these fixed cases have no degenerate
    tensors), except tensors whose exact gradient is 0: those are rounding noise on both sides,
    judged against the scale of the whole backward.  Every tensor is checked and the failures
    are listed in backward order (head first), so the first one names where the gradient first
    goes wrong.
    """
    assert list(grads) == list(params), f"{label}: gradient keys differ from the params' keys"
    ours = dict(grads, **{"(input embeddings)": d_emb})
    reference = dict(theirs["grads"], **{"(input embeddings)": theirs["d_embeddings"]})
    order = [n for n in reversed(list(params)) if not n.startswith("embeddings.")]
    order += ["(input embeddings)"] + [n for n in params if n.startswith("embeddings.")]
    to.assert_gradients(label, ours, reference, order, dtype, lambda n: exactly_zero(n, T))


# hand-written, not a case family's oracle: a whole model is a config, a flat parameter dict and a
# batch through embeddings, blocks, head and loss -- no op pair with inputs to draw
@check("oracle.forward|oracle.backward", "model.loss", kinds_arg="part", ops=("model",),
       equations=MODEL_EQUATIONS + LOSS_EQUATIONS, requires=("torch",), deep=mini_bert_size,
       cases=[(f"{cid}-{dl}", dict(dtype=dt, name=c[0], config=c[1], B=c[2], T=c[3], seed=c[4],
                                    loss=c[5]))
              for cid, c in zip(loss_case_ids, LOSS_CASES) for dl, dt in DTYPES])
def model_loss_and_grads(impl, part, dtype, name, config, B, T, seed, loss):
    """Loss (CE mean/sum with ignore_index for the MLM head, MSE for hidden states), every
    parameter gradient and the input-embedding gradient."""
    config = with_pinned_config(capabilities(impl), config)
    params, batch = make_case(impl, config, B, T, seed, dtype)
    kw = dict(attention_mask=batch["attention_mask"])
    if loss == "mse":
        kw.update(targets=batch["targets"])
    else:
        kw.update(labels=batch["labels"], reduction=loss)
    theirs = to.model_loss_and_grads(params, config, batch["input_ids"], **kw)
    label = f"{name}[{loss}]"
    if part == "forward":  # the loss alone: a failing backward cannot turn this red
        value = impl.loss(params, config, batch["input_ids"], **kw)
        to.assert_oracle(f"{label} loss", np.asarray(value), theirs["loss"], dtype)
    else:
        value, grads, d_emb = impl.loss_and_grads(params, config, batch["input_ids"], **kw)
        to.assert_oracle(f"{label} loss_and_grads loss", np.asarray(value), theirs["loss"], dtype)
        compare_grads(label, grads, d_emb, theirs, dtype, params, T)


@check("oracle.forward|oracle.backward", "model.dout", kinds_arg="part", ops=("model",),
       equations=MODEL_EQUATIONS, requires=("torch",), deep=mini_bert_size,
       cases=[(f"{cid}-{dl}", dict(dtype=dt, name=c[0], config=c[1], B=c[2], T=c[3], seed=c[4]))
              for cid, c in zip(case_ids, CASES) for dl, dt in DTYPES])
def model_forward_backward(impl, part, dtype, name, config, B, T, seed):
    """forward's output (logits or hidden states) and backward's gradients for a random
    upstream gradient on the output (not through a loss)."""
    config = with_pinned_config(capabilities(impl), config)
    params, batch = make_case(impl, config, B, T, seed, dtype)
    ids, mask = batch["input_ids"], batch["attention_mask"]
    out, cache = impl.forward(params, config, ids, mask)
    dout = np.random.default_rng(seed + 10).standard_normal(out.shape).astype(dtype)
    theirs = to.model_loss_and_grads(params, config, ids, attention_mask=mask, dout=dout)
    if part == "forward":
        to.assert_oracle(f"{name} output", out, theirs["output"], dtype)
    else:
        grads, d_emb = impl.backward(dout, cache)
        compare_grads(f"{name}[dout]", grads, d_emb, theirs, dtype, params, T)
