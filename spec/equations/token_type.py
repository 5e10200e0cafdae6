"""Token-type (segment) embeddings: x + W_type[type_ids] and its scatter-add gradient.

The BERT-base blog adds no segment embeddings; BERT does (type_vocab_size = 2: sentence A and
B).  As for token embeddings, the lookup is onehot(type_ids) @ W_type, so dW_type is the
scatter-add of the upstream gradient over the positions of each segment.
"""

from __future__ import annotations

import numpy as np

from minibert_spec.equations import Equation, Proof, register
from minibert_spec.equations._code import op_check
from minibert_spec.equations._sym import arr, first_difference, vjp
from minibert_spec.equations.embedding import lookup_maps, onehot, table_grad

BERT = "BERT (segment embeddings)"
CASES = ((2, 2, ((0, 0, 1), (1, 1, 0))), (3, 2, ((2, 2), (0, 2))))  # (n_types, H, type_ids)
NUMERIC_SIZES = ((2, 2, 2, 3), (3, 1, 2, 2))  # (n_types, H, B, T)


def _prove() -> Proof:
    for n, H, ids in CASES:
        ids = np.array(ids)
        B, T = ids.shape
        x, W, dout = arr("x", B, T, H), arr("W", n, H), arr("dout", B, T, H)
        out = x + onehot(ids, n).astype(object) @ W
        detail = first_difference([table_grad(out, dout, W, ids, n), (vjp(out, dout, x), dout)])
        if detail:
            return Proof("refuted", (n, H), f"type_ids={ids.tolist()}: {detail}")
    return Proof("proven", tuple((n, H) for n, H, _ in CASES),
                 "dx = dout; dW_type[s] = sum of dout over the positions of segment s")


def _fns(size):
    return lookup_maps(*size, added=True)


def _inputs(size):
    n, H, B, T = size
    return dict(type_ids=("int", (B, T), n), x=("float", (B, T, H), 2.0),
                W=("float", (n, H), 2.0), dout=("float", (B, T, H), 1.0))


def _sympy(which):
    def build(size):
        f = _fns(size)[which]
        return lambda type_ids, x, W, dout: f(O=onehot(type_ids, size[0]), x=x, W=W, dout=dout)
    return build


def _numeric(which):
    return op_check(which, NUMERIC_SIZES, _inputs, _sympy(which), "token_type_embedding_forward",
                    "token_type_embedding_backward",
                    lambda type_ids, x, W, dout: ((x, type_ids, W), {}), "dout",
                    needs=("token_type_embedding_forward", "token_type_embedding_backward"))


register(Equation(
    "token_type.forward", "Token-type (segment) embedding", (BERT,),
    r"E[b,t] \mathrel{+}= W_{type}[\mathrm{type\_ids}[b,t]]", _prove,
    torch_op="torch.nn.functional.embedding",
    numeric=_numeric(0)))
register(Equation(
    "token_type.backward", "Token-type embedding gradient (scatter-add)", (BERT,),
    r"dW_{type}[s] = \sum_{(b,t): \mathrm{type\_ids}[b,t]=s} dE[b,t]", _prove, gradient=True,
    torch_op="torch.nn.functional.embedding",
    numeric=_numeric(1),
    uses=("token_type.forward",)))
