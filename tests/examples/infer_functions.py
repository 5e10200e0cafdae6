"""Function-style (notebook, cs231n) op pairs in the conventions real code has, whose maths is the
reference's kernels called through ``minibert_reference.ops`` at call time (so a catalog mutant
applied to the reference is a bug of these functions too): what ``minibert adapter infer`` is tested
on for module-level functions (tests/suite/test_infer.py).

``dense`` keeps its weight torch-style ``[out, in]`` and its backward needs the input and the
weight again; ``layer_norm`` returns ``(y, cache)`` (an ``axis`` argument between its
parameters and its eps) and its backward returns ``(dx, dgamma, dbeta)``; ``relu_grad`` needs
the input again, ``softmax_backward`` the output; ``gelu_fwd``/``gelu_bwd`` pass a ``ctx``;
``feed_forward_backward`` returns its gradients in an order of its own (weights, then biases);
``rms_norm`` names its gain ``weight``; ``embed``/``cross_entropy`` take integer ids/labels;
``multi_head_attention`` takes ``n_heads`` by keyword only;
``add_positional_encoding`` adds the sinusoidal table that ``positional_encoding(d_model,
max_len)`` returns alone, ``add_position_embedding`` a learned one; ``lm_head_loss(x, W, b,
labels)`` takes its labels after its parameters (the protocol's order) and its backward the
upstream dloss; ``one_hot`` is a helper, no op."""

import numpy as np

from minibert_reference import ops


def dense(x, weight, bias=None):  # weight [out, in]
    return ops._linear_forward(x, weight.T, bias)[0]


def dense_backward(dout, x, weight):  # the forward's input and weight again
    dx, dW, db = ops._linear_backward(dout, ops.LinearCache(x, weight.T, True))
    return dx, dW.T, db


def layer_norm(x, gamma, beta, axis=-1, eps=1e-12):
    if axis != -1:
        raise ValueError(f"axis: only -1, got {axis}")
    return ops._layernorm_forward(x, gamma, beta, eps)


def layer_norm_backward(dout, cache):
    return ops._layernorm_backward(dout, cache)


def relu(x):
    return ops._relu_forward(x)[0]


def relu_grad(dout, x):
    return ops._relu_backward(dout, ops._relu_forward(x)[1])[0]


def gelu_fwd(x):
    return ops._gelu_forward(x)


def gelu_bwd(grad, ctx):
    return ops._gelu_backward(grad, ctx)[0]


def softmax(x):
    return ops._softmax_forward(x)[0]


def softmax_backward(dp, p):  # the forward's output again
    return ops._softmax_backward(dp, ops.SoftmaxCache(p))[0]


def feed_forward(x, W1, b1, W2, b2):
    return ops._ffn_forward(x, W1, b1, W2, b2)


def feed_forward_backward(dy, cache):
    dx, dW1, db1, dW2, db2 = ops._ffn_backward(dy, cache)
    return dx, dW1, dW2, db1, db2


def rms_norm(x, weight, eps=1e-6):
    return ops._rmsnorm_forward(x, weight, eps)


def rms_norm_backward(dout, cache):
    return ops._rmsnorm_backward(dout, cache)


def silu(x):
    return ops._silu_forward(x)[0]


def silu_grad(dout, x):  # the forward's input again
    return ops._silu_backward(dout, ops._silu_forward(x)[1])[0]


def tanh_forward(x):
    return ops._tanh_forward(x)


def tanh_backward(dout, cache):
    return ops._tanh_backward(dout, cache)[0]


def embed(ids, table):
    return ops._embedding_forward(ids, table)


def embed_backward(dout, cache):  # (dtable,): no gradient for the ids
    return ops._embedding_backward(dout, cache)


def cross_entropy(logits, labels):
    return ops._cross_entropy_forward(logits, labels)


def cross_entropy_backward(dloss, cache):
    return ops._cross_entropy_backward(dloss, cache)[0]


def multi_head_attention(x, W_q, W_k, W_v, W_o, b_q, b_k, b_v, b_o, *, n_heads):
    return ops._attention_forward(x, W_q, W_k, W_v, W_o, b_q, b_k, b_v, b_o, n_heads=n_heads)


def multi_head_attention_backward(dout, cache):
    return ops._attention_backward(dout, cache)


def add_positional_encoding(x):  # x + the sinusoidal table, with a cache
    return ops._sinusoidal_position_forward(x)


def add_positional_encoding_backward(dout, cache):
    return ops._sinusoidal_position_backward(dout, cache)[0]


def positional_encoding(d_model, max_len):  # the table alone, its sizes in their own order
    return ops._sinusoidal_encoding(max_len, d_model)


def add_position_embedding(x, wpe):
    return ops._position_embedding_forward(x, wpe)


def add_position_embedding_backward(dout, cache):  # (dx, dwpe)
    return ops._position_embedding_backward(dout, cache)


def lm_head_loss(x, W, b, labels):  # the labels after the parameters
    return ops._linear_cross_entropy_forward(x, W, b, labels)


def lm_head_loss_backward(dloss, cache):  # (dx, dW, db)
    return ops._linear_cross_entropy_backward(dloss, cache)


def one_hot(ids, n):
    return np.eye(n)[ids]
