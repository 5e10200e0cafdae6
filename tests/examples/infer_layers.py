"""Class-style layers in the shapes real code has, whose maths is the reference's kernels called
through ``minibert_reference.ops`` at call time (so a catalog mutant applied to the reference is a
bug of these classes too): what ``minibert adapter infer`` is tested on (tests/suite/test_infer.py).

Linear keeps its weight torch-style ``[out, in]`` and returns its gradients as attributes;
LayerNorm keeps gamma and beta in a dict and adds into its gradients; ReLU's backward needs the
forward's input again; GELU frees its activations; Softmax returns ``(p, extra)``; FeedForward
keeps its two projections in sub-objects (``fc1.W`` .. ``fc2.b``), its gradients in a
dict beside them (``fc1.grad["W"]``); RMSNorm names its gain ``weight``; Embedding's backward
returns nothing; CrossEntropyLoss's ``backward()`` takes no upstream gradient; SelfAttention
names its projections loosely (``Wq``), its gradients in a dict; PositionalEncoding keeps a
sinusoidal table of more positions than it adds, LearnedPositions a learned one; LMHeadLoss is
the LM head fused with its loss (``forward(h, targets)``), scoring 5 rows at a time,
its ``backward()`` taking no upstream gradient."""

import numpy as np

from minibert_reference import ops


class Linear:
    def __init__(self, n_in, n_out):
        self.weight = np.zeros((n_out, n_in))  # [out, in]: transposed against the protocol
        self.bias = np.zeros(n_out)

    def forward(self, x):
        y, self.cache = ops._linear_forward(x, self.weight.T, self.bias)
        return y

    def backward(self, dy):
        dx, dW, db = ops._linear_backward(dy, self.cache)
        self.grad_weight, self.grad_bias = dW.T, db
        return dx


class LayerNorm:
    def __init__(self, dim, eps=1e-12):
        self.params = {"gamma": np.ones(dim), "beta": np.zeros(dim)}
        self.grads = {"gamma": np.zeros(dim), "beta": np.zeros(dim)}
        self.eps = eps

    def forward(self, x):
        y, self.cache = ops._layernorm_forward(x, self.params["gamma"], self.params["beta"],
                                               self.eps)
        return y

    def backward(self, dy):
        dx, dgamma, dbeta = ops._layernorm_backward(dy, self.cache)
        self.grads["gamma"] += dgamma
        self.grads["beta"] += dbeta
        return dx


class ReLU:
    def forward(self, x):
        return ops._relu_forward(x)[0]

    def backward(self, x, dy):  # the forward's input again
        return ops._relu_backward(dy, ops._relu_forward(x)[1])[0]


class GELU:
    def forward(self, x):
        y, self.cache = ops._gelu_forward(x)
        return y

    def backward(self, dy):
        (dx,) = ops._gelu_backward(dy, self.cache)
        del self.cache  # frees its activations: one backward per forward
        return dx


class Softmax:
    def forward(self, x):
        p, self.cache = ops._softmax_forward(x)
        return p, {"max": x.max(axis=-1)}  # (out, extra)

    def backward(self, dp):
        return ops._softmax_backward(dp, self.cache)[0]


class _Dense:
    """A projection's parameters and gradients (no forward: FeedForward runs them)."""

    def __init__(self, n_in, n_out):
        self.W, self.b = np.zeros((n_in, n_out)), np.zeros(n_out)


class FeedForward:
    def __init__(self, d_model, d_ff):
        self.fc1, self.fc2 = _Dense(d_model, d_ff), _Dense(d_ff, d_model)

    def forward(self, x):
        y, self.cache = ops._ffn_forward(x, self.fc1.W, self.fc1.b, self.fc2.W, self.fc2.b)
        return y

    def backward(self, dy):  # the gradients three levels down: fc1.grad["W"]
        dx, dW_1, db_1, dW_2, db_2 = ops._ffn_backward(dy, self.cache)
        self.fc1.grad, self.fc2.grad = {"W": dW_1, "b": db_1}, {"W": dW_2, "b": db_2}
        return dx


class RMSNorm:
    """LLaMA's: its gain named ``weight``, eps a constructor argument."""

    def __init__(self, dim, eps=1e-6):
        self.weight, self.eps = np.ones(dim), eps

    def forward(self, x):
        y, self.cache = ops._rmsnorm_forward(x, self.weight, self.eps)
        return y

    def backward(self, dy):
        dx, self.weight_grad = ops._rmsnorm_backward(dy, self.cache)
        return dx


class SiLU:
    def forward(self, x):
        y, self.cache = ops._silu_forward(x)
        return y

    def backward(self, dy):
        return ops._silu_backward(dy, self.cache)[0]


class Tanh:
    def forward(self, x):
        y, self.cache = ops._tanh_forward(x)
        return y

    def backward(self, dy):
        return ops._tanh_backward(dy, self.cache)[0]


class Embedding:
    """A token table of its own name; its backward returns nothing (no input gradient)."""

    def __init__(self, vocab_size, dim):
        self.table = np.zeros((vocab_size, dim))

    def forward(self, ids):
        y, self.cache = ops._embedding_forward(ids, self.table)
        return y

    def backward(self, dy):
        (self.dtable,) = ops._embedding_backward(dy, self.cache)


class CrossEntropyLoss:
    """torch-style: ``forward(logits, targets)`` the mean loss, ``backward()`` its gradient."""

    def forward(self, logits, targets):
        loss, self.cache = ops._cross_entropy_forward(logits, targets)
        return loss

    def backward(self):
        return ops._cross_entropy_backward(self.cache.e.dtype.type(1.0), self.cache)[0]


class SelfAttention:
    """Its projections named loosely (``Wq`` for W_q) beside their biases, its gradients in a
    dict by the same names."""

    def __init__(self, d_model, n_heads):
        self.n_heads = n_heads
        for name in ("Wq", "Wk", "Wv", "Wo"):
            setattr(self, name, np.zeros((d_model, d_model)))
        for name in ("bq", "bk", "bv", "bo"):
            setattr(self, name, np.zeros(d_model))

    def forward(self, x):
        y, self.cache = ops._attention_forward(x, self.Wq, self.Wk, self.Wv, self.Wo, self.bq,
                                               self.bk, self.bv, self.bo, n_heads=self.n_heads)
        return y

    def backward(self, dy):
        dx, *grads = ops._attention_backward(dy, self.cache)
        self.grads = dict(zip(("Wq", "Wk", "Wv", "Wo", "bq", "bk", "bv", "bo"), grads))
        return dx


class PositionalEncoding:
    """PyTorch tutorials' sinusoidal table: built once for ``max_len`` positions as [1, max_len,
    d_model] (its size a default), the forward adding its first T rows."""

    def __init__(self, d_model, max_len=512):
        self.pe = ops._sinusoidal_encoding(max_len, d_model)[None]  # [1, max_len, d_model]

    def forward(self, x):
        return x + self.pe[:, :x.shape[1]].astype(x.dtype)

    def backward(self, dy):
        return dy


class LearnedPositions:
    """GPT-2's ``wpe``: a [max_len, dim] table of its own name, its gradient an attribute."""

    def __init__(self, max_len, dim):
        self.wpe = np.zeros((max_len, dim))

    def forward(self, x):
        y, self.cache = ops._position_embedding_forward(x, self.wpe)
        return y

    def backward(self, dy):
        dx, self.dwpe = ops._position_embedding_backward(dy, self.cache)
        return dx


class LMHeadLoss:
    """A GPT's last step: logits ``h W + b`` and their mean cross-entropy in one, the rows
    scored ``block_rows`` at a time (an [N, V] block at once would not fit in real sizes: the
    probe's 6 rows make a block of 5 and one of 1).  Built from its arrays (a head tied to the
    embedding is ``LMHeadLoss(wte.T)``), the bias optional.  ``backward()`` takes no upstream
    gradient (dloss = 1), its gradients attributes."""

    block_rows = 5

    def __init__(self, W, b=None):
        self.W, self.b = W, b

    def forward(self, h, targets):
        loss, self.cache = ops._linear_cross_entropy_forward(h, self.W, self.b, targets,
                                                             block_rows=self.block_rows)
        return loss

    def backward(self):
        dh, self.dW, self.db = ops._linear_cross_entropy_backward(1.0, self.cache)
        return dh
