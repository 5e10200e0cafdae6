"""A deliberately broken adapter: ``classy_adapter`` with the LayerNorm backward that pulls gamma
outside the feature means (a bug a published implementation shipped; right only when gamma is
constant).  ``minibert check tests.examples.broken_impl`` must fail and name ``layernorm``."""

from __future__ import annotations

from tests.examples.classy_adapter import *  # noqa: F403
from tests.examples.classy_adapter import layernorm_forward  # noqa: F401


def layernorm_backward(dy, cache):
    layer = cache.layer  # the adapter's cache (minibert_spec.suite.adapters.layer): the fresh layer
    x_hat, rstd, gamma = layer.x_hat, layer.rstd, layer.gamma
    n = dy.shape[-1]
    dx = rstd * gamma * (dy - dy.mean(-1, keepdims=True)
                         - x_hat * (dy * x_hat).mean(-1, keepdims=True))  # gamma outside: wrong
    return dx, (dy * x_hat).reshape(-1, n).sum(0), dy.reshape(-1, n).sum(0)
