"""The whole model's gradient: the backwards of the embeddings, the blocks (last first), the
head and the loss composed, with the tied word-embedding table's two shares summed."""

from __future__ import annotations

import sympy as sp

from minibert_spec.equations import Equation, Proof, register
from minibert_spec.equations._sym import Stage, chain_equal
from minibert_spec.sources import GUIDE, MINIBERT

N = 2  # features of the symbolic hidden state
PARAMS = ("p_word", "p_pos", "p_1", "p_2", "p_head")


def _parts():
    """The model with arbitrary stages: embeddings E(p_word, p_pos) (the ids are fixed), two
    blocks B1(.; p_1), B2(.; p_2), a head H(.; p_head, p_word) whose decoder is tied to the
    word table, and a loss ell(logits); every one an undefined SymPy function."""
    p = {name: sp.Symbol(name, real=True) for name in PARAMS}
    emb = [sp.Function(f"E{i}")(p["p_word"], p["p_pos"]) for i in range(N)]
    blocks = [Stage("B1", N, (p["p_1"],)), Stage("B2", N, (p["p_2"],))]
    head = Stage("H", N, (p["p_head"], p["p_word"]))
    ell = sp.Function("ell")
    return p, emb, blocks, head, ell


def model_backward_composed(p, emb, blocks, head, ell):
    """The gradient as the reference's model backward composes it (``minibert_reference.model.
    _backward``): the loss's gradient, the head's backward, the blocks' backwards from the
    last to the first (each at its own input), the embeddings' backward, and the word
    table's lookup and decoder shares summed.  Returns {parameter name: gradient}."""
    hs = [list(emb)]
    for b in blocks:
        hs.append(b(hs[-1]))
    logits = head(hs[-1])
    u = sp.symbols(f"z0:{N}", real=True)
    dlogits = [sp.diff(ell(*u), uk).subs(dict(zip(u, logits))) for uk in u]
    dh, (d_head, d_word_decoder) = head.vjp(hs[-1], dlogits)
    grads = {"p_head": d_head}
    for i in reversed(range(len(blocks))):
        dh, (grads[f"p_{i + 1}"],) = blocks[i].vjp(hs[i], dh)
    for name in ("p_word", "p_pos"):  # the embeddings' backward
        grads[name] = sp.Add(*[dh[j] * sp.diff(emb[j], p[name]) for j in range(N)])
    grads["p_word"] += d_word_decoder  # tied: lookup share + decoder share
    return grads


def prove_model_backward(composed=model_backward_composed) -> Proof:
    """Every parameter's gradient from the composed backward equals sympy.diff of the loss of
    the composed forward, for arbitrary stages (N = 2 features, two blocks)."""
    p, emb, blocks, head, ell = _parts()
    h = list(emb)
    for b in blocks:
        h = b(h)
    loss = ell(*head(h))
    grads = composed(p, emb, blocks, head, ell)
    for name in PARAMS:
        if not chain_equal(sp.diff(loss, p[name]), grads[name]):
            return Proof("refuted", (N,), f"the gradient of {name} differs from sympy.diff")
    return Proof("proven", (N,), "the gradients of the word table (lookup + tied decoder), "
                                 "the positions, both blocks and the head equal sympy.diff of "
                                 "ell(H(B2(B1(E)))) for arbitrary stage functions")


register(Equation(
    "model.backward", "The model's gradient: every backward composed, last block first",
    (f"{GUIDE} §6", f"{MINIBERT} §3"),
    r"\delta z = \nabla \ell,\ (\delta h_L, \delta\theta_{head}) = H^\top(\delta z),\ "
    r"(\delta h_{l-1}, \delta\theta_l) = B_l^\top(\delta h_l)\ (l = L..1),\ "
    r"\delta W_{word} = E^\top(\delta h_0) + \delta W_{word}^{decoder}",
    prove_model_backward, gradient=True,
    numeric_na="the composition of every op backward, each with its own SymPy <-> code "
               "check; the whole model is checked by directional finite differences "
               "(the suite's fd[model] checks) and the wiring is proven for arbitrary stages",
    note="B^T(d) is a stage's transposed Jacobian at its own input times d; the proof takes "
         "every stage as an arbitrary function, so it proves the order (the last block "
         "first, each at its own cache) and the tied table's sum, and the uses prove the "
         "stages",
    uses=("block.backward", "embedding_ln.backward", "embedding.backward",
          "position.learned.backward", "token_type.backward", "layernorm.backward.dx",
          "mlm_head.backward", "mlm_head.tied", "classifier.backward",
          "loss.ce.backward.mean", "loss.ce.backward.sum", "loss.mse.backward")))
