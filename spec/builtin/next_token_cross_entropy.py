"""The next-token (causal language model) cross-entropy: the cross-entropy of logits[..., :-1, :]
against ids[..., 1:] (its SymPy derivation: spec/equations/next_token.py; its reference pair:
minibert_reference.ops.losses).  Its loss guards stay with the other losses'
(minibert_spec.protocol.guards: LOSS_ROWS, LOSS_CALLS, JUDGES)."""

from __future__ import annotations

import numpy as np

from minibert_spec.builtin import Family, Identity, Mutant, OpDeclaration

NAME = "next_token_cross_entropy"


def _draw(draw, k, reduction: str):
    """logits [T, V] or [B, T, V] (T >= 2: a mean needs a target), ids with repeats and with
    ignore_index (-100 or -1, passed) at some positions, at least one target among positions
    1..T-1."""
    lead = () if draw(k.st.booleans()) else (draw(k.sizes(1, k.MAX_B)),)
    T, V = draw(k.sizes(2, 5)), draw(k.sizes(1, 6))
    ignore_index = draw(k.st.sampled_from([k.IGNORE_INDEX, -1]))
    ids = draw(k.ce_labels(lead + (T,), V, ignore_index))
    if not np.any(ids[..., 1:] != ignore_index):
        ids[(0,) * len(lead) + (T - 1,)] = draw(k.st.integers(0, V - 1))
    fixed = {"ids": ids, "ignore_index": ignore_index, "reduction": reduction}
    return k.OpCase({"logits": draw(k.arrays(lead + (T, V), -4.0, 4.0))}, fixed,
                    draw(k.scalar_upstream()), draw(k._seed()))


def _example(rng, k, reduction: str):
    """Two sequences of 5 tokens: a padded tail and an ignored first token (never a target
    anyway); ignore_index -1 for the sum (a loss masking with the default -100 scores them)."""
    ignore = k.IGNORE_INDEX if reduction == "mean" else -1
    ids = np.array([[3, 1, 4, 1, 5], [ignore, 2, 6, ignore, ignore]])
    return k.OpCase({"logits": rng.standard_normal((2, 5, 7)) * 2},
                    {"ids": ids, "ignore_index": ignore, "reduction": reduction},
                    k.upstream_like(rng, ()))


def _torch(to):
    """The causal language model's loss as transformers computes it.  float32: its own
    ForCausalLMLoss (LlamaForCausalLM's: ids padded with ignore_index and shifted left, every
    position's logits flattened; ``num_items_in_batch=1`` turns its sum into the plain sum).
    float64: ForCausalLMLoss rounds the logits to float32 (``logits.float()``), so the shift as
    GPT2LMHeadModel writes it, logits[..., :-1, :] against ids[..., 1:], into F.cross_entropy
    (the float32 side checks that the two shifts agree)."""

    def next_token_cross_entropy(logits, ids, *, ignore_index=to.IGNORE_INDEX, reduction="mean"):
        from transformers.loss.loss_utils import ForCausalLMLoss

        V = logits.shape[-1]
        if logits.dtype == to.torch.float32:
            return ForCausalLMLoss(logits, ids, V, ignore_index=ignore_index,
                                   num_items_in_batch=1 if reduction == "sum" else None)
        return to.F.cross_entropy(logits[..., :-1, :].reshape(-1, V), ids[..., 1:].reshape(-1),
                                  ignore_index=ignore_index, reduction=reduction)

    return next_token_cross_entropy


def next_token_loss_is_the_shifted_cross_entropy(impl, case, h):
    """The loss and its gradient are the float64 log-sum-exp cross-entropy of the shifted pair
    (logits[..., :-1, :], ids[..., 1:]) -- its guarded formula under a declared loss guard,
    the gradient within the guard's allowance; the last position's gradient is exactly 0; and
    the first token's id changes nothing (it is never a target)."""
    z, f, dloss = case.inputs["logits"], case.fixed, case.dout
    ids, ignore = f["ids"], f["ignore_index"]
    kw = {"ignore_index": ignore, "reduction": f["reduction"]}
    loss, cache = impl.next_token_cross_entropy_forward(z, ids, **kw)
    (dz,) = impl.next_token_cross_entropy_backward(dloss, cache)
    want_loss, want_grad, allow = h.expected_cross_entropy(
        z[..., :-1, :], ids[..., 1:], ignore, f["reduction"], h.declared_guards(impl))
    want = dloss * want_grad
    got = dz[..., :-1, :]
    off = got - want  # a declared guard's share taken off (its allowance), the rest judged
    got = want + np.sign(off) * np.maximum(np.abs(off) - allow * abs(dloss), 0.0)
    first = ids.copy()
    first[..., 0] = np.where(ids[..., 0] == ignore, 0, (ids[..., 0] + 1) % z.shape[-1])
    loss_1, cache_1 = impl.next_token_cross_entropy_forward(z, first, **kw)
    (dz_1,) = impl.next_token_cross_entropy_backward(dloss, cache_1)
    h.require([h.close(NAME, "loss = CE(logits[..., :-1, :], ids[..., 1:])", loss, want_loss),
               h.close(NAME, "dlogits[..., :-1, :] = its gradient", got, want),
               h.exact(NAME, "dlogits[..., -1, :] = 0", dz[..., -1, :],
                       np.zeros_like(dz[..., -1, :])),
               h.exact(NAME, "the first id changes nothing (loss)", loss_1, loss),
               h.exact(NAME, "the first id changes nothing (dlogits)", dz_1, dz)])


_NEXT = dict(torch_requires=("transformers",))

OP = OpDeclaration(
    NAME, after="cross_entropy", inputs=("logits",),
    equations=("next_token.forward", "next_token.backward"),
    doc="next_token_cross_entropy_forward(logits [...,T,V], ids [...,T] int, *, "
        'ignore_index=-100, reduction="mean"|"sum") -> the cross-entropy of logits[..., :-1, '
        ":] against ids[..., 1:] (position t predicts token t + 1; \"mean\" over the "
        "predicted positions whose id is not ignore_index)",
    backward_doc="(dlogits,) from a scalar dloss, exactly 0 at the last position",
    families=(Family(_draw, _example, "mean", torch=_torch,
                     options=dict(reduction="mean", **_NEXT)),
              Family(_draw, _example, "sum", torch=_torch, options=dict(reduction="sum", **_NEXT))),
    identities=(Identity("shifted_pair-sum", next_token_loss_is_the_shifted_cross_entropy,
                         family=f"{NAME}_sum"),
                Identity("shifted_pair-mean", next_token_loss_is_the_shifted_cross_entropy,
                         family=f"{NAME}_mean")),
    mutants=(
        Mutant("next_token_target_not_shifted", "next_token.forward",
               "The causal LM loss scores each position against its own token (ids[..., :-1]), "
               "not the next one", "ops._next_token_cross_entropy_forward",
               (("ids[..., 1:],", "ids[..., :-1],"),)),
        Mutant("next_token_gradient_shifted_the_wrong_way", "next_token.backward",
               "The causal LM loss's gradient lands one position late: on the last position, "
               "none on the first", "ops._next_token_cross_entropy_backward",
               (("(dlogits[..., :-1, :],) =", "(dlogits[..., 1:, :],) ="),)),
        Mutant("next_token_default_ignore_index", "next_token.forward",
               "The causal LM loss masks with the default -100 whatever ignore_index it is given",
               "ops._next_token_cross_entropy_forward",
               (("ignore_index=ignore_index, reduction=reduction)",
                 "ignore_index=IGNORE_INDEX, reduction=reduction)"),)),
    ),
    # (label, the argument its message names, call(impl, b)): ``b`` the bad-input module's
    # shapes and arrays (minibert_spec.suite.checks.bad_input: B, T, H, X, VEC...)
    bad_inputs=(
        ("next_token T = 1, mean", "ids",
         lambda m, b: m.next_token_cross_entropy_forward(b.X[:, :1], np.zeros((b.B, 1), int))),
        ("next_token nothing predicted", "ids", lambda m, b: m.next_token_cross_entropy_forward(
            b.X, np.array([[0, -100, -100], [1, -100, -100]]))),
        ("next_token ids shape", "ids", lambda m, b: m.next_token_cross_entropy_forward(
            b.X, np.zeros((b.B, b.T + 1), int))),
        ("next_token ids >= V", "ids",
         lambda m, b: m.next_token_cross_entropy_forward(b.X, np.full((b.B, b.T), b.H))),
        ("next_token float ids", "ids",
         lambda m, b: m.next_token_cross_entropy_forward(b.X, np.zeros((b.B, b.T)))),
        ("next_token logits rank 1", "logits",
         lambda m, b: m.next_token_cross_entropy_forward(b.VEC, np.zeros(b.H, int))),
        ("next_token bad reduction", "reduction", lambda m, b: m.next_token_cross_entropy_forward(
            b.X, np.zeros((b.B, b.T), int), reduction="max")),
    ),
)
