"""Adapter: the class-based ``classy_bert`` network under the minibert protocol, declared with
``minibert_spec.suite.adapters.layer`` (a fresh layer per forward call is the cache; the gradients
are read off its attributes).  Every other protocol name is absent: its checks are not applicable.

    minibert check tests.examples.classy_adapter
"""

from minibert_spec.suite.adapters import layer
from tests.examples import classy_bert as cb

embedding_forward, embedding_backward = layer(
    "embedding", lambda W: cb.Embedding(*W.shape), params={"W": "W"}, inputs=("ids",),
    grads={"W": "dW"})
linear_forward, linear_backward = layer(
    "linear", lambda W, b: cb.Linear(*W.shape, bias=b is not None), params={"W": "W", "b": "b"},
    grads={"W": "dW", "b": "db"})
layernorm_forward, layernorm_backward = layer(
    "layernorm", lambda x, eps: cb.LayerNorm(x.shape[-1], eps),
    params={"gamma": "gamma", "beta": "beta"}, grads={"gamma": "dgamma", "beta": "dbeta"})
softmax_forward, softmax_backward = layer("softmax", cb.Softmax, inputs=("x", "mask"))
relu_forward, relu_backward = layer("relu", cb.ReLU)
# the class knows the mean only (reduction="sum" is n/a) and returns d(loss = 1) / dlogits
cross_entropy_forward, cross_entropy_backward = layer(
    "cross_entropy", cb.MaskedCrossEntropy, inputs=("logits", "labels"), upstream=False)
