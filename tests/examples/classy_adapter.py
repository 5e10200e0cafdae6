"""Adapter: the class-based ``classy_bert`` network exposed through the minibert protocol.

    pytest --impl tests.examples.classy_adapter
    minibert check tests.examples.classy_adapter

The one idea: a class-based layer keeps its forward activations on ``self``, so the *layer
object is the cache*.  Each ``X_forward`` builds a fresh layer, loads the given parameters into
it and returns it as the cache; ``X_backward`` calls its ``backward`` and reads the parameter
gradients off it.  Reusing one shared instance instead would let a second forward (the suite runs
several before each backward, as finite differences and training loops do) overwrite the
activations the first backward needs.

Only what the network has is adapted: linear, layernorm, softmax, relu, embedding and the masked
cross-entropy.  Every other protocol name is absent, so its tests are reported as not applicable.
"""

from __future__ import annotations

import numpy as np

from tests.examples import classy_bert as cb


def embedding_forward(ids, W):
    layer = cb.Embedding(*W.shape)
    layer.W = W
    return layer.forward(ids), layer


def embedding_backward(dout, layer):
    layer.backward(dout)
    return (layer.dW,)


def linear_forward(x, W, b=None):
    layer = cb.Linear(*W.shape, bias=b is not None)  # a fresh layer per call ...
    layer.W, layer.b = W, b  # ... holding the caller's parameters
    return layer.forward(x), layer  # the layer is the cache


def linear_backward(dy, layer):
    dx = layer.backward(dy)
    return dx, layer.dW, layer.db


def layernorm_forward(x, gamma, beta, eps=1e-12):
    layer = cb.LayerNorm(x.shape[-1], eps)
    layer.gamma, layer.beta = gamma, beta
    return layer.forward(x), layer


def layernorm_backward(dy, layer):
    dx = layer.backward(dy)
    return dx, layer.dgamma, layer.dbeta


def softmax_forward(x, mask=None):
    layer = cb.Softmax()
    return layer.forward(x, mask), layer


def softmax_backward(dp, layer):
    return (layer.backward(dp),)


def relu_forward(x):
    layer = cb.ReLU()
    return layer.forward(x), layer


def relu_backward(dy, layer):
    return (layer.backward(dy),)


def cross_entropy_forward(logits, labels, *, ignore_index=-100, reduction="mean"):
    layer = cb.MaskedCrossEntropy(ignore_index)
    with np.errstate(invalid="ignore", divide="ignore"):  # 0/0 when nothing is predicted
        loss = layer.forward(logits, labels)
    if reduction == "sum":  # the class only knows the mean: rescale (and its gradient, below)
        if layer.count == 0:  # an empty sum is 0, not the class's 0/0 (found by the oracle)
            return np.zeros((), logits.dtype), (None, np.zeros_like(logits))
        return loss * layer.count, (layer, layer.count)
    return loss, (layer, loss.dtype.type(1))


def cross_entropy_backward(dloss, cache):
    layer, scale = cache
    if layer is None:  # nothing predicted: the loss does not depend on the logits
        return (scale,)
    # dloss arrives as a Python float: np.asarray(dloss) would be a float64 array and promote
    # a float32 gradient to float64 (found by the dtype invariant every op pair now gets)
    return (layer.backward() * (float(dloss) * scale),)
