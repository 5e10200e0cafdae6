"""The next-token (shifted) cross-entropy of a causal language model and its logit gradient.

Position t predicts token t + 1: the masked cross-entropy (spec/equations/loss.py) of the
logits at positions 0..T-2 against the ids at positions 1..T-1, the mean over the predicted
positions whose id is not ignore_index.  None of the five documents trains a decoder (they
predict masked tokens); GPT-2 and LLaMA code does (transformers' ``ForCausalLMLoss``), so it is
a protocol op of its own.  As in loss.py, the SymPy map takes the one-hot ids O and the mask m
(1 = a target) as inputs; the shift is built into the SymPy expression, so the derived gradient
covers every position, the last one included.
"""

from __future__ import annotations

import numpy as np
import sympy as sp

from minibert_spec.equations import Equation, Numeric, Proof, register
from minibert_spec.equations._cache import maps_cache
from minibert_spec.equations._code import op_check
from minibert_spec.equations._sym import arr, compare, exp_to_symbols, forward_backward_maps, vjp
from minibert_spec.equations.loss import ce
from minibert_spec.protocol import IGNORE_INDEX
from minibert_spec.sources import PROTOCOL_VARIANTS

# (B, T, V) and the mask m [B, T] of the proofs: position 0 ignored in one, a last position
# ignored in another (neither may matter), an ignored target inside a sequence
CASES = (((1, 3, 3), ((1, 1, 1),)), ((2, 3, 2), ((0, 1, 0), (1, 0, 1))),
         ((1, 4, 2), ((1, 1, 0, 1),)))
NUMERIC_SIZES = ((1, 3, 3), (2, 3, 2))


def next_token(z: np.ndarray, O: np.ndarray, m: np.ndarray, reduction: str):
    """The loss of logits z [B, T, V] against one-hot ids O [B, T, V] with mask m [B, T]: the
    masked cross-entropy of the rows z[:, :-1] against O[:, 1:], m[:, 1:]."""
    V = z.shape[-1]
    return ce(z[:, :-1].reshape(-1, V), O[:, 1:].reshape(-1, V),
              np.asarray(m, dtype=object)[:, 1:].reshape(-1), reduction)


def _prove(reduction: str) -> Proof:
    """sympy.diff of the shifted loss: dL/dz[b, t] = (softmax(z[b, t]) - onehot(ids[b, t+1]))
    m[b, t+1] / N (N the number of targets, 1 for "sum") for t < T - 1, and exactly 0 at
    t = T - 1; with symbolic ids and mask, the loss holds no symbol of the last position's
    logits nor of the first position's id or mask."""
    for (B, T, V), mask in CASES:
        z = arr("z", B, T, V)
        m = np.array(mask, dtype=int)
        ids = (np.arange(B * T).reshape(B, T) * 2 + 1) % V
        O = np.eye(V, dtype=int)[ids]
        L = next_token(z, O, m, reduction)
        derived, E, aux = exp_to_symbols(vjp(np.array([L], dtype=object),
                                             np.array([1], dtype=object), z), z)
        P = E / E.sum(axis=-1, keepdims=True)
        closed = np.zeros((B, T, V), dtype=object)
        closed[:, :-1] = (P[:, :-1] - O[:, 1:]) * m[:, 1:, None]
        if reduction == "mean":
            closed = closed / int(m[:, 1:].sum())
        ok, detail = compare(derived, closed, aux)
        if not ok:
            return Proof("refuted", (B, T, V), f"mask={mask}: {detail}")
        O_sym, m_sym = arr("O", B, T, V), arr("m", B, T)
        unused = set(z[:, -1].ravel()) | set(O_sym[:, 0].ravel()) | set(m_sym[:, 0])
        used = sp.sympify(next_token(z, O_sym, m_sym, reduction)).free_symbols & unused
        if used:
            return Proof("refuted", (B, T, V), f"the loss depends on {sorted(map(str, used))}")
    return Proof("proven", tuple(size for size, _ in CASES),
                 "dL/dz[:, -1] = 0, the cross-entropy's gradient elsewhere; the last logits and "
                 "the first id enter nothing")


# --------------------------------------------------------------------------- SymPy <-> code
@maps_cache
def _fns(size):
    B, T, V = size
    z, O, m = arr("z", B, T, V), arr("O", B, T, V), arr("m", B, T)
    L = np.array([next_token(z, O, m, "mean")], dtype=object)
    return forward_backward_maps(dict(z=z, O=O, m=m), L, np.array([1], dtype=object), [z])


def _inputs(size):
    B, T, V = size
    return dict(z=("float", (B, T, V), 3.0), ids=("int", (B, T), V), keep=("bool", (B, T)))


def _sympy(which: int):
    def build(size):
        fns = _fns(size)

        def run(z, ids, keep):
            out = fns[which](z=z, O=np.eye(size[2])[ids], m=keep.astype(float))
            return (out[0].reshape(()),) if which == 0 else out
        return run
    return build


def _accept(size, z, ids, keep):
    return bool(keep[:, 1:].any())  # the mean needs a target


def _call(z, ids, keep):
    """How the code side calls the op (its inputs, other arguments, dloss)."""
    return {"logits": z}, {"ids": np.where(keep, ids, IGNORE_INDEX), "reduction": "mean"}, 1.0


def _numeric(which: int) -> Numeric:
    return op_check(which, NUMERIC_SIZES, _inputs, _sympy(which),
                    "next_token_cross_entropy_forward", "next_token_cross_entropy_backward",
                    lambda z, ids, keep: ((z, np.where(keep, ids, IGNORE_INDEX)),
                                          {"reduction": "mean"}), 1.0, pick=slice(None),
                    loss=True, accept=_accept, guard_call=_call)


register(Equation(
    "next_token.forward", "Next-token (shifted) cross-entropy", (PROTOCOL_VARIANTS,),
    r"L = -\frac{1}{N} \sum_{b} \sum_{t=0}^{T-2} m_{b,t+1} \log "
    r"\mathrm{softmax}(z_{b,t})_{\mathrm{id}_{b,t+1}},\ N = \sum_b \sum_{t=1}^{T-1} m_{b,t}",
    lambda: _prove("mean"), torch_op="transformers ForCausalLMLoss", numeric=_numeric(0),
    note="GPT-2 / LLaMA: position t predicts token t + 1; the first token is never a target, "
         "the last position predicts nothing; reduction='sum' drops the 1/N (proven too)",
    uses=("loss.ce.mean",)))
register(Equation(
    "next_token.backward", "Next-token cross-entropy gradient", (PROTOCOL_VARIANTS,),
    r"\frac{\partial L}{\partial z_{b,t}} = \frac{m_{b,t+1}}{N}\bigl(\mathrm{softmax}(z_{b,t})"
    r" - e_{\mathrm{id}_{b,t+1}}\bigr)\ (t < T-1),\quad \frac{\partial L}{\partial z_{b,T-1}}"
    r" = 0",
    lambda: (lambda p: p if p.status != "proven" else _prove("sum"))(_prove("mean")),
    gradient=True, torch_op="transformers ForCausalLMLoss", numeric=_numeric(1),
    uses=("next_token.forward", "loss.ce.backward.mean")))
