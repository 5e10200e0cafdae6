"""BERT's masked-LM head: transform (dense -> GELU -> LayerNorm) then a decoder whose weight is
the word-embedding table itself (weight tying), plus a bias over the vocabulary.

The Mini-BERT derivation's head is one untied linear layer; BERT's is
logits = LN(act(h W_t + b_t)) W_word^T + b_dec.  The transform's pieces (linear, GELU, LayerNorm)
are proven in their own files; proven here: the decoder's gradients (dn = dlogits W_word,
dW_word = dlogits^T n, db = sum dlogits) and the tied weight's gradient, which is the *sum* of
the lookup's scatter-add and the decoder's dlogits^T n (a model that keeps one of the two
trains a different model).  The SymPy <-> code check runs the whole head (GELU and LayerNorm
included) against the code.
"""

from __future__ import annotations

import numpy as np

from minibert_spec.equations import Equation, Proof, register
from minibert_spec.equations._cache import maps_cache
from minibert_spec.equations._code import fb_checks
from minibert_spec.equations._nn import LN_EPS, ln_row
from minibert_spec.equations._sym import arr, compare, forward_backward_maps, vjp
from minibert_spec.equations.embedding import onehot
from minibert_spec.equations.gelu import gelu_erf
from minibert_spec.tolerances import LN_MIN_VAR

BERT = "BERT (cls.predictions, tied decoder)"
SIZES = ((2, 3, 4),)  # (N positions, H, V)


def _prove_decoder() -> Proof:
    N, H, V = 2, 2, 3
    n, W, b, dl = arr("n", N, H), arr("W", V, H), arr("b", V), arr("dl", N, V)
    logits = n @ W.T + b
    for name, x, closed in (("n", n, dl @ W), ("W_word", W, dl.T @ n), ("b", b, dl.sum(axis=0))):
        ok, detail = compare(vjp(logits, dl, x), closed)
        if not ok:
            return Proof("refuted", (N, H, V), f"d{name}: {detail}")
    return Proof("proven", (N, H, V), "dn = dl W_word, dW_word = dl^T n, db = sum dl")


def _prove_tied() -> Proof:
    """One table W feeds the lookup E = onehot(ids) W and the decoder logits = n W^T, with n a
    function of E (a linear stand-in M for the encoder and transform): sympy.diff w.r.t. W
    equals onehot^T dE + dlogits^T n, dE = (dlogits W) M^T -- both uses, summed."""
    ids, V, H = (0, 2, 2), 3, 2
    O = onehot(ids, V).astype(object)
    W, M, dl = arr("W", V, H), arr("M", H, H), arr("dl", len(ids), V)
    n = (O @ W) @ M
    logits = n @ W.T
    closed = O.T @ ((dl @ W) @ M.T) + dl.T @ n
    ok, detail = compare(vjp(logits, dl, W), closed)
    if not ok:
        return Proof("refuted", (V, H), detail)
    once = dl.T @ n  # the decoder's share alone
    ok_once, _ = compare(vjp(logits, dl, W), once)
    if ok_once:
        return Proof("refuted", (V, H), "the decoder's share alone already equals the gradient")
    return Proof("proven", (V, H), "dW = onehot^T dE (lookup) + dlogits^T n (decoder)")


@maps_cache
def _fns(size):
    N, H, V = size
    h, W_t, b_t = arr("h", N, H), arr("W_t", H, H), arr("b_t", H)
    g, be, W, b, dl = arr("g", H), arr("be", H), arr("W", V, H), arr("b", V), arr("dl", N, V)
    a = np.vectorize(gelu_erf, otypes=[object])(h @ W_t + b_t)
    n = np.array([ln_row(list(a[i]), g, be) for i in range(N)], dtype=object)
    logits = n @ W.T + b
    ins = dict(h=h, W_t=W_t, b_t=b_t, gamma=g, beta=be, W_word=W, b_dec=b)
    return forward_backward_maps({**ins, "dl": dl}, logits, dl, list(ins.values()))


def _inputs(size):
    N, H, V = size
    return dict(h=("float", (N, H), 2.0), W_t=("float", (H, H), 2.0), b_t=("float", (H,), 1.0),
                gamma=("float", (H,), 2.0), beta=("float", (H,), 1.0),
                W_word=("float", (V, H), 2.0), b_dec=("float", (V,), 1.0),
                dl=("float", (N, V), 1.0))


def _accept(size, h, W_t, b_t, **_):
    import math

    z = h @ W_t + b_t
    a = z * 0.5 * (1 + np.vectorize(math.erf)(z / math.sqrt(2)))
    return bool(np.min(a.var(axis=-1)) >= LN_MIN_VAR)


def _checks():
    return fb_checks(SIZES, _inputs, lambda w: lambda s: _fns(s)[w], "mlm_head_forward",
                     "mlm_head_backward", ("h", "W_t", "b_t", "gamma", "beta", "W_word", "b_dec"),
                     "dl", kwargs=dict(eps=float(LN_EPS), activation="gelu"), accept=_accept,
                     needs=("mlm_head_forward", "mlm_head_backward"))


register(Equation(
    "mlm_head.forward", "BERT MLM head: transform, tied decoder", (BERT,),
    r"\mathrm{logits} = \mathrm{LN}(\mathrm{GELU}(h W_t + b_t)) W_{word}^\top + b_{dec}",
    _prove_decoder, torch_op="torch.nn.functional.linear",
    numeric=_checks()[0],
    uses=("linear.forward", "gelu.forward.erf", "layernorm.forward")))
register(Equation(
    "mlm_head.backward", "BERT MLM head gradients", (BERT,),
    r"dn = d\ell\, W_{word},\ \text{then LN, GELU and the transform's backward}",
    _prove_decoder, gradient=True, torch_op="torch.nn.functional.linear",
    numeric=_checks()[1],
    uses=("mlm_head.forward", "linear.backward.dx", "linear.backward.dW", "linear.backward.db",
          "gelu.backward.erf", "layernorm.backward.dx", "layernorm.backward.dgamma",
          "layernorm.backward.dbeta")))
register(Equation(
    "mlm_head.decoder", "Tied decoder's share of the word-embedding gradient", (BERT,),
    r"\frac{\partial L}{\partial W_{word}}\Big|_{decoder} = d\ell^\top n", _prove_decoder,
    gradient=True, torch_op="torch.nn.functional.linear",
    numeric=_checks()[1],
    uses=("mlm_head.forward", "linear.backward.dW")))
register(Equation(
    "mlm_head.tied", "Tied word embeddings: the gradient is the sum of both uses", (BERT,),
    r"\frac{\partial L}{\partial W_{word}} = \mathrm{onehot}(\mathrm{ids})^\top dE + "
    r"d\ell^\top n", _prove_tied, gradient=True, torch_op="torch.nn.Module (tied weights)",
    numeric_na="a model-level identity: checked by the whole-model FD and transformers "
               "oracle tests",
    uses=("mlm_head.decoder", "embedding.backward")))
