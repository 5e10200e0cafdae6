"""The tied embedding, (W_E[ids] + x) W_E^T: one table as GPT-2's token lookup and LM head, its
gradient the sum of both uses (its SymPy derivation: spec/equations/tied_embedding.py; its
reference pair: minibert_reference.ops.embeddings)."""

from __future__ import annotations

import numpy as np

from minibert_spec.builtin import NOTHING_TO_GUARD, Family, Identity, Mutant, OpDeclaration

NAME = "tied_embedding"


def _draw(draw, k):
    """ids with a repeat whenever there are two positions, rows of W_E no id uses (their
    gradient is the head's share alone), x the body's residual contribution."""
    B, T = draw(k.batch_seq())
    V, H = draw(k.sizes(1, 5)), draw(k.sizes(1, 4))
    inputs = {"x": draw(k.arrays((B, T, H))), "W_E": draw(k.arrays((V, H)))}
    return k.OpCase(inputs, {"ids": draw(k.token_ids((B, T), V))}, draw(k.upstream((B, T, V))),
                    draw(k._seed()))


def _example(rng, k):
    ids = np.array([[0, 3, 3, 1], [3, 2, 0, 0]])  # repeated ids; row 4 of W_E only in the head
    return k.OpCase({"x": rng.standard_normal((2, 4, 3)), "W_E": rng.standard_normal((5, 3))},
                    {"ids": ids}, k.upstream_like(rng, (2, 4, 5)))


def _torch(to):
    """One tensor as F.embedding's table and F.linear's weight ([V, H] is torch's [out, in]
    already): what GPT-2's tie_weights makes of wte and lm_head -- autograd sums both uses."""

    def tied_embedding(ids, x, W_E):
        return to.F.linear(to.F.embedding(ids, W_E) + x, W_E)

    return tied_embedding


def tied_embedding_gradient_sums_both_uses(impl, case, h):
    """dW_E holds both shares of the one table: the lookup's (dx scattered to the rows of the
    ids, repeated ids adding up) plus the head's (dlogits^T h, h = W_E[ids] + x); a row no id
    uses gets the head's share alone; and dx = dlogits W_E."""
    ids, x, W_E, dz = case.fixed["ids"], case.inputs["x"], case.inputs["W_E"], case.dout
    _, cache = impl.tied_embedding_forward(ids, x, W_E)
    dx, dW_E = impl.tied_embedding_backward(dz, cache)
    V, H = W_E.shape
    lookup = np.zeros_like(W_E)
    np.add.at(lookup, ids.reshape(-1), np.asarray(dx).reshape(-1, H))
    head = dz.reshape(-1, V).T @ (W_E[ids] + x).reshape(-1, H)
    unused = np.setdiff1d(np.arange(V), ids)
    # the shares sum terms of |dz| |h| and |dz| |W_E| per entry: rounding of that size
    terms = float(np.abs(dz).max() * (np.abs(W_E).max() + np.abs(x).max()) * dz[..., 0].size)
    h.require([h.close(NAME, "dW_E = scatter(ids, dx) + dlogits^T h", dW_E, lookup + head, terms),
               h.close(NAME, "rows no id uses: dW_E = the head's share",
                       np.asarray(dW_E)[unused], head[unused], terms),
               h.close(NAME, "dx = dlogits W_E", dx, dz @ W_E, terms)])


OP = OpDeclaration(
    NAME, after="embedding", inputs=("x", "W_E"),
    equations=("tied_embedding.forward", "tied_embedding.backward"),
    unguarded=NOTHING_TO_GUARD,
    doc="tied_embedding_forward(ids [B,T] int, x [B,T,H], W_E [V,H]) -> (W_E[ids] + x) W_E^T "
        "[B,T,V]: one table as GPT-2's token lookup and LM head, x what the body adds between "
        "them; dW_E sums both uses",
    families=(Family(_draw, _example, torch=_torch),),
    identities=(Identity("both_uses_summed", tied_embedding_gradient_sums_both_uses),),
    mutants=(
        Mutant("tied_embedding_counted_once_lookup", "tied_embedding.backward",
               "Tied-weight gradient counted once: dW_E keeps the lookup's share, the LM head's "
               "dlogits^T h is lost", "ops._tied_embedding_backward",
               (("return dh, dW_lookup + dW_head_T.T", "return dh, dW_lookup"),)),
        Mutant("tied_embedding_counted_once_head", "tied_embedding.backward",
               "Tied-weight gradient counted once: dW_E keeps the LM head's share, the lookup's "
               "scatter of dh is lost", "ops._tied_embedding_backward",
               (("return dh, dW_lookup + dW_head_T.T", "return dh, dW_head_T.T"),)),
        Mutant("tied_embedding_head_skips_residual", "tied_embedding.forward",
               "The LM head reads the token embedding alone: logits = W_E[ids] W_E^T, the "
               "residual stream x left out", "ops._tied_embedding_forward",
               (("_linear_forward(e + x, W_E.T)", "_linear_forward(e, W_E.T)"),)),
    ),
    bad_inputs=(
        ("tied_embedding ids >= V", "ids",
         lambda m, b: m.tied_embedding_forward(b.IDS, b.X, b.rng.standard_normal((5, b.H)))),
        ("tied_embedding float ids", "ids", lambda m, b: m.tied_embedding_forward(
            b.IDS * 1.0, b.X, b.rng.standard_normal((b.V, b.H)))),
        ("tied_embedding x shape", "x", lambda m, b: m.tied_embedding_forward(
            b.IDS, np.ones((b.B, b.T, b.H + 1)), b.rng.standard_normal((b.V, b.H)))),
        ("tied_embedding x f32", "x", lambda m, b: m.tied_embedding_forward(
            b.IDS, b.f32(b.X), b.rng.standard_normal((b.V, b.H)))),
        ("tied_embedding W_E rank 1", "W_E",
         lambda m, b: m.tied_embedding_forward(b.IDS, b.X, b.VEC)),
    ),
)
