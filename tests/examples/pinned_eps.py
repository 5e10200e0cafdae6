"""An implementation whose LayerNorm ignores its ``eps`` argument and computes with a constant
of its own (``eps = 1e-6`` written in the code: 1e-6, 1e-8 and 1e-12 are all common in public
NumPy transformers).  Its maths is right at that eps, everywhere a LayerNorm runs: the op, the
block, the embedding and MLM-head LayerNorms, the whole model (which ignores config.ln_eps).

``build(declared, pinned, buggy)`` -- the reference re-exported (tests/examples/reexport.py)
with every LayerNorm pinned at ``pinned``, declaring ``CAPABILITIES = {"layernorm": {"eps":
declared}}`` (nothing when None); ``buggy``: the LayerNorm backward with gamma pulled outside
the feature means (the published bug of the project's notes), in the op alone.  The module
level names are the cases tests/suite/test_pinned_eps.py checks (``pinned_eps:declared``)."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

from minibert_reference import ops as R
from tests.examples import reexport

PIN = 1e-6
_MODEL = ("embed", "forward", "loss", "loss_and_grads", "masked_lm_loss_and_grads")


def _pinned_config(config, eps: float):
    """The model's config as the code reads it: its ln_eps ignored, the constant used."""
    return dataclasses.replace(config, ln_eps=eps)


def build(declared: float | None = PIN, pinned: float = PIN, buggy: bool = False):
    ns = SimpleNamespace(**{n: getattr(reexport, n) for n in dir(reexport)
                            if not n.startswith(("_", "@"))})

    def layernorm_forward(x, gamma, beta, eps=None):  # eps: ignored
        return R.layernorm_forward(x, gamma, beta, pinned)

    def layernorm_backward(dy, cache):
        if not buggy:
            return R.layernorm_backward(dy, cache)
        x_hat, rstd, gamma = cache
        n = x_hat.shape[-1]
        lead = tuple(range(dy.ndim - 1))
        # bug: gamma outside the means, gamma * (dy - mean(dy) - x_hat mean(dy x_hat)) / sigma;
        # right only where gamma is constant across the features
        dx = gamma * rstd * (dy - dy.sum(-1, keepdims=True) / n
                             - x_hat * (dy * x_hat).sum(-1, keepdims=True) / n)
        return dx, (dy * x_hat).sum(axis=lead), dy.sum(axis=lead)

    def block_forward(x, p, *, eps=None, normalization="layernorm", **kw):
        eps = pinned if normalization == "layernorm" else eps  # RMSNorm's eps is its own
        return R.block_forward(x, p, eps=eps, normalization=normalization, **kw)

    def embedding_ln_forward(ids, type_ids, W_word, W_pos, W_type, gamma, beta, eps=None):
        return R.embedding_ln_forward(ids, type_ids, W_word, W_pos, W_type, gamma, beta, pinned)

    def mlm_head_forward(h, W_t, b_t, gamma, beta, W_word, b_dec, *, eps=None, **kw):
        return R.mlm_head_forward(h, W_t, b_t, gamma, beta, W_word, b_dec, eps=pinned, **kw)

    def model_function(fn):
        def pinned_fn(params, config, *args, **kw):
            return fn(params, _pinned_config(config, pinned), *args, **kw)
        return pinned_fn

    ns.__dict__.update(layernorm_forward=layernorm_forward,
                       layernorm_backward=layernorm_backward, block_forward=block_forward,
                       embedding_ln_forward=embedding_ln_forward,
                       mlm_head_forward=mlm_head_forward,
                       **{n: model_function(getattr(reexport, n)) for n in _MODEL})
    if declared is not None:
        ns.CAPABILITIES = {"layernorm": {"eps": declared}}
    return ns


declared = build()  # pinned at 1e-6, declared 1e-6: green
undeclared = build(None)  # pinned at 1e-6, nothing declared: red on every LayerNorm row
buggy = build(buggy=True)  # declared, with gamma outside the means: red on layernorm
misdeclared = build(1e-5)  # declared 1e-5, pinned at 1e-6: red (no whitewash)
