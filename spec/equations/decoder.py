"""The causal decoder (GPT-2 and LLaMA forms, reference/decoder.py) as a whole: its forward
composition, its backward in reverse order, the tied table's two shares, and causality.

None of the five documents describes a decoder; GPT-2 and LLaMA are the forms real code takes
(Hugging Face's GPT2LMHeadModel / LlamaForCausalLM are the oracle), so the equations cite the
protocol's variants.  Each proof takes every stage as an arbitrary SymPy function: it proves
the wiring (the order, which gradient goes where, the final norm, the tied sum, that causal
stages compose to a causal model), and the stages' own equations prove the stages.
"""

from __future__ import annotations

import sympy as sp

from minibert_spec.equations import Equation, Proof, register
from minibert_spec.equations._sym import Stage, arr, chain_equal, is_zero
from minibert_spec.sources import PROTOCOL_VARIANTS

N = 2  # features of the symbolic residual stream
PARAMS = ("p_tok", "p_pos", "p_1", "p_2", "p_norm")


def _parts():
    """Embeddings E(p_tok, p_pos) (the ids fixed), two blocks B1, B2, the final norm F and the
    head H(.; p_tok) whose matrix is the token table, and a loss ell: arbitrary functions."""
    p = {name: sp.Symbol(name, real=True) for name in PARAMS}
    emb = [sp.Function(f"E{i}")(p["p_tok"], p["p_pos"]) for i in range(N)]
    blocks = [Stage("B1", N, (p["p_1"],)), Stage("B2", N, (p["p_2"],))]
    final = Stage("F", N, (p["p_norm"],))
    head = Stage("H", N, (p["p_tok"],))
    return p, emb, blocks, final, head, sp.Function("ell")


def decoder_forward_staged(emb, blocks, final, head):
    """logits = H(F(B_L(..B_1(E)..))): the residual stream through the blocks, the final norm
    once, then the head; also returns every stage's input (what the backward reads)."""
    xs = [list(emb)]
    for b in blocks:
        xs.append(b(xs[-1]))
    h = final(xs[-1])
    return head(h), xs, h


def decoder_backward_composed(p, emb, blocks, final, head, ell):
    """The gradient as minibert_reference.decoder.run_backward composes it: the loss's gradient, the
    head's backward (its share of the token table), the final norm's, the blocks' from the
    last to the first (each at its own input, the stream's gradient handed on), the
    embeddings', and the token table's two shares summed.  {parameter: gradient}."""
    logits, xs, h = decoder_forward_staged(emb, blocks, final, head)
    u = sp.symbols(f"z0:{N}", real=True)
    dlogits = [sp.diff(ell(*u), uk).subs(dict(zip(u, logits))) for uk in u]
    dh, (d_tok_head,) = head.vjp(h, dlogits)
    dx, (grads_norm,) = final.vjp(xs[-1], dh)
    grads = {"p_norm": grads_norm}
    for i in reversed(range(len(blocks))):
        dx, (grads[f"p_{i + 1}"],) = blocks[i].vjp(xs[i], dx)
    for name in ("p_tok", "p_pos"):  # the embeddings' backward: the lookup's share
        grads[name] = sp.Add(*[dx[j] * sp.diff(emb[j], p[name]) for j in range(N)])
    grads["p_tok"] += d_tok_head  # tied: the lookup's share + the head's
    return grads


def prove_decoder_backward(composed=decoder_backward_composed) -> Proof:
    """Every parameter's gradient from the composed backward equals sympy.diff of the loss of
    the composed forward, for arbitrary stages (N = 2 features, two blocks, the final norm,
    the tied head)."""
    p, emb, blocks, final, head, ell = _parts()
    loss = ell(*decoder_forward_staged(emb, blocks, final, head)[0])
    grads = composed(p, emb, blocks, final, head, ell)
    for name in PARAMS:
        if not chain_equal(sp.diff(loss, p[name]), grads[name]):
            return Proof("refuted", (N,), f"the gradient of {name} differs from sympy.diff")
    return Proof("proven", (N,), "the gradients of the tied token table, the positions, both "
                                 "blocks and the final norm equal sympy.diff of "
                                 "ell(H(F(B2(B1(E))))) for arbitrary stage functions")


def _prove_tied() -> Proof:
    """A table used twice -- looked up (E(w)) and as the head's matrix (H(.; w)) -- has the sum
    of both uses' gradients: d/dw ell(H(G(E(w)); w)) = E^T(G^T(H_h^T dl)) + H_w^T dl, and
    either share alone differs (the 'counted once' bug is not the gradient)."""
    w = sp.Symbol("w", real=True)
    emb = [sp.Function(f"E{i}")(w) for i in range(N)]
    body, head = Stage("G", N), Stage("H", N, (w,))
    h = body(emb)
    ell = sp.Function("ell")
    u = sp.symbols(f"z0:{N}", real=True)
    logits = head(h)
    dl = [sp.diff(ell(*u), uk).subs(dict(zip(u, logits))) for uk in u]
    dh, (head_share,) = head.vjp(h, dl)
    dx, _ = body.vjp(emb, dh)
    lookup_share = sp.Add(*[dx[j] * sp.diff(emb[j], w) for j in range(N)])
    total = sp.diff(ell(*logits), w)
    if not chain_equal(total, lookup_share + head_share):
        return Proof("refuted", (N,), "the tied gradient is not the sum of the two shares")
    for share, name in ((lookup_share, "the lookup's"), (head_share, "the head's")):
        if chain_equal(total, share):
            return Proof("refuted", (N,), f"{name} share alone equals the gradient")
    return Proof("proven", (N,), "dW = lookup share + head share; neither alone")


def _prove_causal() -> Proof:
    """Causal stages (output t an arbitrary function of inputs 0..t) composed with
    position-wise ones (the embeddings, the final norm, the head) give a causal model:
    d logits_t / d x_s = 0 for every s > t, and != 0 for s <= t (T = 3 positions, two
    blocks)."""
    T = 3
    x = list(arr("x", T))

    def causal(name, v):
        return [sp.Function(f"{name}{t}")(*v[:t + 1]) for t in range(T)]

    def positionwise(name, v):
        return [sp.Function(name)(vt) for vt in v]

    logits = positionwise("H", positionwise("F", causal("B2", causal("B1", positionwise(
        "E", x)))))
    for t in range(T):
        for s in range(T):
            d = sp.diff(logits[t], x[s])
            if (s > t) != is_zero(d):
                return Proof("refuted", (T,), f"d logits_{t} / d x_{s} is "
                             + ("nonzero" if s > t else "zero"))
    return Proof("proven", (T,), "logits_t depends on x_0..x_t only, on each of them")


def _prove_forward() -> Proof:
    """The residual stream passes every block unnormalised and is normalised once, by the
    final norm: with every block's branches zero (each block the identity, pre-LN), the
    logits are H(F(E)) whatever the number of blocks (N = 2 features)."""
    p, emb, _, final, head, _ = _parts()
    identity = type("Identity", (), {"__call__": lambda self, v: list(v)})()
    logits, _, _ = decoder_forward_staged(emb, [identity, identity], final, head)
    want = head(final(emb))
    if any(not chain_equal(a, b) for a, b in zip(logits, want)):
        return Proof("refuted", (N,), "identity blocks do not give H(F(E))")
    return Proof("proven", (N,), "identity blocks: logits = H(F(E)), one final norm")


_ORACLE = "transformers.GPT2LMHeadModel / transformers.LlamaForCausalLM"
_NA = ("a composition of op pairs, each with its own SymPy <-> code check; the whole decoder "
       "is checked by directional finite differences and against transformers "
       "(fd[decoder-*], oracle.*[decoder.hf-*]), and the wiring is proven for arbitrary stages")
_USES = ("embedding.forward", "position.learned.forward", "block.preln", "layernorm.forward",
         "rmsnorm.forward", "linear.forward")

register(Equation(
    "decoder.forward", "Causal decoder: embeddings -> pre-norm blocks -> final norm -> LM head",
    (PROTOCOL_VARIANTS,),
    r"x_0 = W_E[\mathrm{ids}] + W_{pos}[:T],\ x_l = B_l(x_{l-1}),\ "
    r"\mathrm{logits} = \mathrm{LN}_f(x_L)\, W^\top\ (W = W_E\ \text{tied})",
    _prove_forward, torch_op=_ORACLE, numeric_na=_NA,
    note="GPT-2: learned positions, LayerNorm, gelu_new MLP, tied head; LLaMA: RoPE inside the "
         "attention (no position table), RMSNorm, SwiGLU, an LM head of its own or tied",
    uses=_USES))
register(Equation(
    "decoder.backward", "Causal decoder backward: head, final norm, blocks last first, "
    "embeddings", (PROTOCOL_VARIANTS,),
    r"\delta h = \delta z\, W,\ \delta x_L = \mathrm{LN}_f^\top(\delta h),\ "
    r"(\delta x_{l-1}, \delta\theta_l) = B_l^\top(\delta x_l)\ (l = L..1),\ "
    r"\delta W_E = E^\top(\delta x_0) + \delta z^\top h",
    prove_decoder_backward, gradient=True, torch_op=_ORACLE, numeric_na=_NA,
    uses=("decoder.forward", "block.preln_backward", "layernorm.backward.dx",
          "rmsnorm.backward.dx", "embedding.backward", "position.learned.backward",
          "linear.backward.dx", "linear.backward.dW")))
register(Equation(
    "decoder.tied", "The tied token table's gradient: the lookup's share plus the head's",
    (PROTOCOL_VARIANTS,),
    r"\delta W_E = \mathrm{scatter}_{\mathrm{ids}}(\delta x_0) + \delta z^\top h",
    _prove_tied, gradient=True, torch_op=_ORACLE, numeric_na=_NA,
    note="counting one use alone (the lookup's, or the head's) is the classic tied-weight bug",
    uses=("decoder.backward", "embedding.backward", "linear.backward.dW")))
register(Equation(
    "decoder.causal", "The decoder is causal: position t's logits read ids[0..t] only",
    (PROTOCOL_VARIANTS,),
    r"\partial\, \mathrm{logits}_t / \partial\, \mathrm{ids}_s = 0\ \ (s > t)",
    _prove_causal, torch_op=_ORACLE,
    numeric_na="a property of the whole model, checked on the implementation by changing later "
               "ids (invariant[decoder.causal-*]) and against transformers",
    uses=("attention.causal", "decoder.forward")))
