"""The MLM head's orientation: the slides' W h_i + b (W [V, d]) vs the reference's h W_mlm + b
(W_mlm [H, V]); the head itself is the linear layer (``linear.forward``)."""

from __future__ import annotations

from minibert_spec.equations import Equation, Proof, register
from minibert_spec.equations._sym import arr, compare
from minibert_spec.sources import MINIBERT, SLIDES


def _prove_head_orientation() -> Proof:
    """The slides' W in R^{V x d} applied as W h_i equals h_i W^T: the reference stores the
    transpose ([H, V], logits = h @ W + b).  Proven for symbolic W, h."""
    for V, d in ((3, 2), (2, 3)):
        W, h, b = arr("W", V, d), arr("h", d), arr("b", V)
        ok, detail = compare(W @ h + b, h @ W.T + b)
        if not ok:
            return Proof("refuted", (V, d), detail)
    return Proof("convention", ((3, 2), (2, 3)),
                 "slides: W [V, d] times the column h_i; Mini-BERT derivation §2.6 and the "
                 "reference: h @ W_mlm with W_mlm [H, V]; equal with W_mlm = W^T (proven)")


register(Equation(
    "head.mlm.orientation", "Vocabulary projection W h_i + b vs h W_mlm + b",
    (f"{SLIDES} (step 4)", f"{MINIBERT} §2.6"),
    r"\hat y_i = \mathrm{softmax}(W H_i + b),\ W \in \mathbb{R}^{V \times d}",
    _prove_head_orientation, kind="document", expected="convention", target="linear.forward"))
